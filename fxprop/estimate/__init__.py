"""Peak memory and FLOPs of a graph, without running it: `estimate` and `Estimate`.

    >>> import torch, fxprop
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> est = fxprop.estimate(torch.fx.symbolic_trace(model), fxprop.TensorSpec((8, 16)))
    >>> est.flops, est.peak_bytes, est.peak_node
    (10240, {'cpu': 5264}, {'cpu': '_1'})

Modules: `flops` (the formulas and the re-dispatch that applies them), `memory` (the model of
live storages), `training` (the backward part and the bytes saved for it), `sizes` (counts as
ints or sympy expressions), `result` (`Estimate`, `NodeEstimate`), `llama` (a 70B-shaped example);
for whole training steps (``fxprop estimate``): `traced_step` (a step traced on the meta device
for a target device), `optimizers` (torch's optimizers and their state), `host_reads` (values
read on the host while tracing), `step_figures` (what a step holds, and its peaks).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx

from ..distributed.dtensors import META_KEY, tally
from ..engine.collector import garbage_collection_paused
from ..engine.propagation import propagate
from ..errors import InputError
from ..torch_compat import OpOverload, pytree_codegen
from .flops import EXTRA_FORMULAS, FORMULAS, FlopCounter
from .memory import MemoryTrace, trace_memory
from .result import Estimate, NodeEstimate, SymbolBounds
from .sizes import number
from .training import backward_nodes, saved_for_backward, saved_outputs


def estimate(gm: torch.fx.GraphModule, *inputs: Any, param_device: torch.device | str | None = None,
             backward_from: str | torch.fx.Node | None = None, forward_outputs: int | None = None,
             **propagate_options: Any) -> Estimate:
    """FLOPs and peak live bytes per device of running ``gm`` in node order, read from fxprop's annotations.

    With inputs, ``gm`` is propagated first (``fxprop.propagate(gm, *inputs, param_device=...,
    **propagate_options)``); without, a graph that is already propagated is read as it is.
    Sizes are ints, or sympy expressions in your symbols when the inputs have symbolic dims
    (`Estimate.evaluate` gives the figures at given sizes). The memory model is described in
    `fxprop.estimate.memory`, the FLOP count in `fxprop.estimate.flops`.

    Training graphs: ``backward_from`` names the first node of the backward part when torch did
    not tag it (see `fxprop.estimate.training`); ``forward_outputs`` marks a partitioned forward
    graph: its outputs after the first ``forward_outputs`` are the tensors saved for backward.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(64, 256, device="meta"))
    >>> est = fxprop.estimate(gm, fxprop.TensorSpec(("B", 64), device="cuda:0"), param_device="cuda:0")
    >>> est.flops, est.peak_bytes["cuda:0"]
    (32768*B, 1280*B + 66560)
    >>> est.evaluate(B=8).peak_bytes
    {'cuda:0': 76800}
    """
    return estimate_with_memory(gm, *inputs, param_device=param_device, backward_from=backward_from,
                                forward_outputs=forward_outputs, **propagate_options)[0]


def estimate_with_memory(gm: torch.fx.GraphModule, *inputs: Any, param_device: torch.device | str | None = None,
                         backward_from: str | torch.fx.Node | None = None, forward_outputs: int | None = None,
                         **propagate_options: Any) -> tuple[Estimate, MemoryTrace]:
    """`estimate`, and the walk over live storages it was read from (which node made each storage)."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise InputError(f"estimate expects a torch.fx.GraphModule, got {type(gm).__name__}")
    if inputs or not _is_propagated(gm):
        if not inputs and any(node.op == "placeholder" and not node.args for node in gm.graph.nodes):
            raise InputError("estimate: the graph has not been propagated; give its inputs, "
                             "e.g. fxprop.estimate(gm, fxprop.TensorSpec((8, 16)))")
        propagate(gm, *inputs, param_device=param_device, **propagate_options)
    device = str(torch.device(param_device)) if param_device is not None else None
    with _quiet_state(), garbage_collection_paused():  # as propagate: time per node stays flat on large graphs
        memory = trace_memory(gm, number, device, _flat_real_inputs(gm, inputs))
        counter = FlopCounter(gm)
        backward = backward_nodes(gm, backward_from)
        nodes = tuple(NodeEstimate(node.name, node.op, _target_text(node), number(counter.count(node)),
                                   _total(memory.allocated[node.name]), memory.live[node.name], node in backward)
                      for node in gm.graph.nodes)
    if forward_outputs is not None:
        saved_names, saved_keys = [], saved_outputs(gm, forward_outputs, memory.keys_of, memory.resident)
    else:
        saved_names, saved_keys = saved_for_backward(gm, backward, memory.keys_of, memory.resident)
    found = Estimate.from_nodes(nodes, input_bytes=memory.input_bytes, state_bytes=memory.state_bytes,
                                saved_for_backward_bytes=memory.bytes_of(saved_keys),
                                saved_for_backward=tuple(saved_names), symbols=_symbols(gm),
                                flops_unknown=counter.failures, comm=_comm(gm))
    return found, memory


def _comm(gm: torch.fx.GraphModule) -> dict:
    collectives = [collective for node in gm.graph.nodes if META_KEY in node.meta
                   for collective in node.meta[META_KEY].collectives]
    return tally(collectives)


def _is_propagated(gm: torch.fx.GraphModule) -> bool:
    return all("fxprop" in node.meta for node in gm.graph.nodes)


@contextlib.contextmanager
def _quiet_state():
    """Re-dispatched calls may toggle grad mode or draw random numbers: the caller's state comes back."""
    grad_enabled = torch.is_grad_enabled()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            torch.set_grad_enabled(grad_enabled)


def _flat_real_inputs(gm: torch.fx.GraphModule, inputs: tuple) -> list | None:
    if not inputs:
        return None
    codegen = pytree_codegen(gm)
    try:
        if codegen is not None and codegen.pytree_info.in_spec is not None:
            return list(codegen.process_inputs(*inputs))
    except Exception:
        return None
    return list(inputs)


def _total(per_device: dict[str, Any]) -> Any:
    total: Any = 0
    for size in per_device.values():
        total = total + size
    return total


def _target_text(node: torch.fx.Node) -> str:
    if node.op in ("call_module", "call_method", "placeholder", "get_attr", "output"):
        return str(node.target)
    return getattr(node.target, "__name__", None) if not isinstance(node.target, OpOverload) \
        else str(node.target)


def _symbols(gm: torch.fx.GraphModule) -> dict[str, SymbolBounds]:
    found = {}
    for symbol, info in (gm.meta.get("fxprop", {}).get("symbols") or {}).items():
        found[str(symbol)] = SymbolBounds(info.kind, number(info.lower), number(info.upper), info.node)
    return found


__all__ = ["EXTRA_FORMULAS", "Estimate", "FORMULAS", "NodeEstimate", "SymbolBounds", "estimate"]
