"""fxprop as a torch.compile backend: re-annotate each graph dynamo hands over, then compile it.

    compiled = torch.compile(model, backend=fxprop.backend("inductor"), dynamic=True)

The backend propagates the graph on the example inputs dynamo passes (its FakeTensors, with
dynamo's own symbols under ``dynamic=True``, SymInt placeholders, real tensors), so every node's
``meta["val"]`` is fxprop's, in dynamo's symbols, before the inner compiler reads it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .engine.propagation import propagate
from .errors import InputError
from .torch_compat import lookup_compile_backend


def backend(inner: str | Callable = "inductor", *, example_value: bool = False,
            **propagate_options: Any) -> Callable:
    """A torch.compile backend that annotates each graph with fxprop, then hands it to ``inner``
    (a registered backend's name, or a compiler ``(gm, example_inputs) -> callable``).

    ``example_value=True`` also writes each node's value as ``meta["example_value"]``, dynamo's
    own key, for passes that read that one. ``propagate_options`` go to `fxprop.propagate`.
    """
    if not (callable(inner) or isinstance(inner, str)):
        raise InputError(f"backend: inner must be a backend name or a compiler callable, got {type(inner).__name__}")

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        propagate(gm, *example_inputs, **propagate_options)
        if example_value:
            for node in gm.graph.nodes:
                if "val" in node.meta:
                    node.meta["example_value"] = node.meta["val"]
        compiler = lookup_compile_backend(inner) if isinstance(inner, str) else inner
        return compiler(gm, example_inputs)

    compile_graph.__name__ = f"fxprop_then_{inner if isinstance(inner, str) else getattr(inner, '__name__', 'inner')}"
    return compile_graph
