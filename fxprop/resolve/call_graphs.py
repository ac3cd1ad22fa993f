"""One-node graphs: a call of an op, a function, a Tensor method or a module on placeholders,
as `fxprop.lookup` and the testing kit propagate them."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..engine.inputs import TensorSpec
from ..torch_compat import pytree


def call_graph(target: Any, args: tuple, kwargs: dict) -> tuple[torch.fx.GraphModule, list[Any]]:
    """A graph whose one node calls ``target`` with a placeholder for every tensor in the arguments.

    ``target`` is an op overload, a callable, a Tensor method name (called on ``args[0]``) or an
    ``nn.Module`` (a ``call_module`` node; the module is the graph's one submodule, not copied).
    Tensors nested in lists, tuples and dicts get placeholders too. Returns the graph module
    and the tensors, in placeholder order.
    """
    graph = torch.fx.Graph()
    tensors: list[Any] = []

    def lift(value: Any) -> Any:
        if isinstance(value, (torch.Tensor, TensorSpec)):
            tensors.append(value)
            return graph.placeholder(f"t{len(tensors) - 1}")
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            lifted = [lift(v) for v in value]
            return type(value)(*lifted) if hasattr(value, "_fields") else type(value)(lifted)
        if isinstance(value, dict):
            return {k: lift(v) for k, v in value.items()}
        return value

    lifted_args, lifted_kwargs = lift(tuple(args)), lift(dict(kwargs))
    if isinstance(target, torch.nn.Module):
        root = torch.nn.Module()
        root.add_module("module", target)
        graph.output(graph.call_module("module", lifted_args, lifted_kwargs))
        return torch.fx.GraphModule(root, graph), tensors
    kind = "call_method" if isinstance(target, str) else "call_function"
    if kind == "call_function" and not isinstance(getattr(target, "__name__", None), str):
        target = _named(target)  # FX's code generation names every callable it calls
    result = graph.create_node(kind, target, lifted_args, lifted_kwargs, name="op")
    graph.output(result)
    try:
        return torch.fx.GraphModule(torch.nn.Module(), graph), tensors
    except SyntaxError:
        # An argument FX cannot write as python source (an enum, an object): call a closure
        # over the non-tensor arguments instead.
        if kind == "call_method":
            raise
        return _closure_graph(target, args, kwargs, len(tensors)), tensors


def _closure_graph(target: Any, args: tuple, kwargs: dict, count: int) -> torch.fx.GraphModule:
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    slots = [i for i, value in enumerate(flat) if isinstance(value, (torch.Tensor, TensorSpec))]

    def call(*tensors: Any) -> Any:
        filled = list(flat)
        for slot, tensor in zip(slots, tensors):
            filled[slot] = tensor
        call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
        return target(*call_args, **call_kwargs)

    call.__name__ = call.__qualname__ = getattr(target, "__name__", type(target).__name__)
    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"t{i}") for i in range(count)]
    graph.output(graph.call_function(call, tuple(placeholders)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _named(target: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)
    call.__name__ = call.__qualname__ = type(target).__name__
    return call
