"""One training step as one graph, forward, loss, gradients and the optimizer's update; or a forward pass.

`trace_training_step` records with ``make_fx`` what one eager step runs, in the order it runs::

    loss = loss_of(model(**inputs))
    grads = torch.autograd.grad(loss, params)     # in the autograd engine's order (`gradients`)
    for p, g in zip(params, grads): p.grad = g
    optimizer.step()                              # its in-place foreach or per-tensor ops
    return loss, grads                            # p.grad keeps them until optimizer.zero_grad()

Parameters, buffers, the optimizer's state and the inputs are placeholders, resident
throughout (`fxprop.estimate.memory`); each gradient is an output, live from the backward node
that makes it to the end of the step. Values read on the host while tracing (the optimizer's
``step`` counters, transformers' position ids) are read as eager reads them (`HostReads`),
and what is computed from them is part of the graph as constants.

Why ``make_fx`` and not torch.export: export gives the forward graph (its experimental joint
export functionalizes the graph and has no optimizer step), while the step traced as it runs
holds forward, backward and the optimizer's in-place update, with activation checkpointing's
recomputation inside the backward where it runs.

The model may live on the meta device, standing in for ``device``: nothing is allocated, and
the graph is retargeted (device arguments that say meta say ``device``; the inputs to propagate
it with are `TensorSpec`s on ``device``). What torch decides by device is decided for ``device``
while tracing: ``scaled_dot_product_attention`` runs the kernel torch picks there
(`fxprop.rules.attention.attention_on`; on meta tensors torch's own pick is always the math
path, which materializes the attention matrix), and the optimizer's implementation is the one
torch picks there (`fxprop.estimate.optimizers`). `trace_inference_step` records a forward pass
without gradients in the same way.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from ..distributed.dtensors import local_of
from ..engine.collector import garbage_collection_paused
from ..rules.attention import attention_on
from ..engine.inputs import TensorSpec
from ..torch_compat import gradients, one_fake_mode_for_traced_values, pytree, storage_key
from .host_reads import HostReads
from .optimizers import state_bytes, state_tensors
from .training import backward_nodes

META = torch.device("meta")
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer step"


@dataclass(frozen=True)
class Sizes:
    """What a step's inputs hold; bytes on the step's device, the optimizer's per device."""
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    optimizer_state_bytes: dict[str, int]
    input_bytes: int


@dataclass
class TracedStep:
    """A traced step and what to propagate it with.

    Attributes:
        gm: the graph.
        inputs: one value per argument of ``gm``: the traced tensors, those on the meta device
            as `TensorSpec`s on ``device``.
        device: the device the step runs on.
        gradients: the names of the output nodes that are gradients (none for inference).
        phases: each node's phase, "forward", "backward" or "optimizer step".
        sizes: the trained parameters (their count and bytes), the buffers and parameters not
            trained, the optimizer's state and the batch.
        stood_in: how many values the optimizer read that depend on the data (1 stood in).
    """
    gm: torch.fx.GraphModule
    inputs: tuple
    device: torch.device
    gradients: tuple[str, ...]
    phases: dict[str, str]
    sizes: Sizes
    stood_in: int = 0


def default_loss(output: Any) -> torch.Tensor:
    """``output.loss`` (a transformers model given labels), else the output itself."""
    return output.loss if hasattr(output, "loss") else output


def trace_training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: Mapping[str, Any],
                        device: torch.device, loss_of: Callable[[Any], torch.Tensor] = default_loss) -> TracedStep:
    """One step of ``optimizer`` on ``loss_of(model(**inputs))``. The optimizer should have its state
    (`fxprop.estimate.optimizers.create_state`): a step that creates it is not a steady one. Values
    the optimizer reads that depend on the data stand in as 1 (`HostReads`), counted in the
    step's ``stood_in``."""
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    others = [t for t in (*model.parameters(), *model.buffers()) if id(t) not in set(map(id, trained))]
    batch = dict(inputs)
    optimizer_reads = HostReads(stand_in=True)

    def step(params, others, state, inputs):  # the local tensors of trained, others, the state, the batch
        with HostReads():
            loss = loss_of(model(**batch))
            grads = gradients(loss, trained)
        for param, grad in zip(trained, grads):
            param.grad = grad
        with optimizer_reads:
            optimizer.step()
        for param in trained:
            param.grad = None
        return local_of(loss.detach()), [local_of(grad) for grad in grads]

    traced = _locals((trained, others, state_tensors(optimizer), batch))
    with _tracing(device):
        gm = make_fx(step)(*traced)
    retarget(gm, device)
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    gradient_names = tuple(node.name for node in output.args[0][1:])
    params, others = traced[0], traced[1]
    sizes = Sizes(sum(p.numel() for p in params), _bytes(params), _bytes(others), state_bytes(optimizer, device),
                  _bytes(pytree.tree_leaves(batch)))
    return TracedStep(gm, _inputs_on(traced, device), device, gradient_names, _phases(gm, gradient_names), sizes,
                      optimizer_reads.stood_in)


def held_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor ``value`` holds, once: in tuples, lists and dicts (a transformers ModelOutput) and in
    other objects' attributes (its KV cache's keys and values); modules are not entered."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.setdefault(id(item), item)
        elif id(item) in seen or isinstance(item, (torch.nn.Module, str, bytes, type)):
            continue
        elif isinstance(item, (tuple, list, set)):
            pending.extend(reversed(list(item)))
        elif isinstance(item, dict):
            pending.extend(reversed(list(item.values())))
        elif hasattr(item, "__dict__"):
            pending.extend(reversed(list(vars(item).values())))
        seen.add(id(item))
    return list(found.values())


def trace_inference_step(model: torch.nn.Module, inputs: Mapping[str, Any], device: torch.device,
                         outputs_of: Callable[[Any], Any] = held_tensors) -> TracedStep:
    """One forward pass without gradients, returning ``outputs_of(model(**inputs))``: by default every
    tensor the output holds, as a caller that keeps the output keeps them (logits, a KV cache)."""
    state = [*model.parameters(), *model.buffers()]
    batch = dict(inputs)

    def forward(state, inputs):  # the local tensors of the model's state and of the batch
        with torch.no_grad(), HostReads():
            return pytree.tree_map_only(torch.Tensor, local_of, outputs_of(model(**batch)))

    traced = _locals((state, batch))
    with _tracing(device):
        gm = make_fx(forward)(*traced)
    retarget(gm, device)
    phases = {node.name: FORWARD for node in gm.graph.nodes}
    params = [local_of(p) for p in model.parameters()]
    sizes = Sizes(sum(p.numel() for p in params), _bytes(params), _bytes([local_of(b) for b in model.buffers()]),
                  {}, _bytes(pytree.tree_leaves(batch)))
    return TracedStep(gm, _inputs_on(traced, device), device, (), phases, sizes)


@contextlib.contextmanager
def _tracing(device: torch.device):
    """Attention as on ``device``; and the cyclic garbage collector paused and one fake mode for the
    nodes' values, without which tracing takes about twice as long (an 80-layer Llama's step)."""
    with garbage_collection_paused(), one_fake_mode_for_traced_values(), AttentionOn(device):
        yield


class AttentionOn(TorchFunctionMode):
    """Inside it, ``F.scaled_dot_product_attention`` runs the kernel torch picks on ``device``."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return attention_on(self.device, *args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def retarget(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Device arguments that say meta say ``device``: the graph was traced on meta standing in for it."""
    moved = False
    for node in gm.graph.nodes:  # aten graphs pass devices by keyword (factories, _to_copy)
        if node.kwargs.get("device") == META:
            node.update_kwarg("device", device)
            moved = True
    if moved:
        gm.recompile()


def _locals(traced: tuple) -> tuple:
    """The traced arguments with each DTensor as its local tensor. make_fx then records the rank's
    work: a DTensor argument would be a placeholder of the global shape, whose ops DTensor runs on
    its local tensor, an untracked tensor that make_fx would take for a constant of the graph. Given
    the local tensors themselves, the ops DTensor runs on them, and its collectives, are recorded
    on the placeholders."""
    return tuple(pytree.tree_map_only(torch.Tensor, local_of, traced))


def _bytes(values: list) -> int:
    """Bytes of the distinct storages of the tensors among ``values``."""
    storages = {storage_key(t): t.untyped_storage().nbytes() for t in values if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def _inputs_on(traced: tuple, device: torch.device) -> tuple:
    """The traced arguments, each meta tensor as a `TensorSpec` on ``device``, each other tensor
    detached: the graph already holds the gradients, and the optimizer updates parameters in place."""
    def on_device(tensor: torch.Tensor) -> Any:
        if tensor.device != META:
            return tensor.detach()
        return TensorSpec(tuple(tensor.shape), dtype=tensor.dtype, device=device, stride=tuple(tensor.stride()))
    return tuple(pytree.tree_map_only(torch.Tensor, on_device, traced))


def _phases(gm: torch.fx.GraphModule, gradients: tuple[str, ...]) -> dict[str, str]:
    """Forward until the gradient seed (`fxprop.estimate.training`), backward until the last node the
    gradients are computed from, the optimizer step after it."""
    nodes = list(gm.graph.nodes)
    backward = backward_nodes(gm)
    named = {node.name: node for node in nodes}
    ancestors, pending = set(), [named[name] for name in gradients]
    while pending:
        node = pending.pop()
        if node not in ancestors:
            ancestors.add(node)
            pending.extend(node.all_input_nodes)
    last_backward = max((index for index, node in enumerate(nodes) if node in ancestors), default=-1)
    phases = {}
    for index, node in enumerate(nodes):
        if index > last_backward and node.op != "output":
            phases[node.name] = OPTIMIZER
        elif node in backward:
            phases[node.name] = BACKWARD
        else:
            phases[node.name] = FORWARD
    return phases
