"""Live storages while a graph runs in node order, read from its annotations.

The model (what `torch.fx.Interpreter(gm, garbage_collect_values=True)` keeps alive):

- the storages of placeholders (the caller holds them), of ``get_attr`` tensors and of the
  parameters and buffers of every called module (the module holds them) are live from the
  start and never die: they are *resident* (an input FSDP's root cast to another dtype, both
  the cast and the caller's own);
- a node's outputs that are new storages (not views or aliases of a live one) become live
  when it runs;
- a value dies after its last user has run, unless it is a graph output or has no user at all
  (the interpreter keeps both to the end); a storage stays live while any live value views it;
- live bytes are the sum of the sizes of the distinct live storages, taken just after each
  node, before the values it used for the last time are freed.

A storage's size is the ``untyped_storage().nbytes()`` real execution allocates; aliasing is
read from the annotations, where a view shares the storage of its base.

With DTensor values (`fxprop.distributed.dtensors`), the model is one rank's: a DTensor counts as its local
shard's storage (parameters included: FSDP's shard is a view of its padded storage). FSDP2
(`fully_shard`, emulated by `fxprop.distributed.fsdp`), as its forward allocates:

- a group's gather allocates its unsharded parameters (each padded shard times the ranks, in the
  all-gather's dtype) and the all-gather output (as many bytes); both are live just after the
  node of the module that gathered (the bytes its module runs with);
- the unsharded parameters are freed after that node where FSDP reshards after forward, and kept
  otherwise (a root's, gathered before the graph's first node, for the whole graph);
- the all-gather output is kept after the node, until the next group's gather frees it (FSDP
  keeps it so that the next copy-in overlaps the all-gather) or a root's forward ends.

`fxprop.distributed.parallel.shard_parameters`' gathered parameters are live, at their gathered
local size, just after their module's node and freed before the next node. Other temporaries
inside a node (a parallel style's all-gathered input) are not counted, as a single-device node's
temporaries are not.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

import torch
import torch.fx

from ..call import tensors_of
from ..distributed.dtensors import META_KEY, NodeSharding, ParameterGather, is_dtensor, local_of
from ..torch_compat import (FakeTensor, OpOverload, distributed_available, functorch_unwrapped, schema_of,
                           storage_key)


@dataclass
class Storage:
    device: str
    nbytes: Any
    created_by: str | None = None  # None: resident (an input or module state)


@dataclass
class MemoryTrace:
    """Per node: bytes it allocated and live bytes just after it, each per device."""
    allocated: dict[str, dict[str, Any]] = field(default_factory=dict)
    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_bytes: dict[str, Any] = field(default_factory=dict)
    state_bytes: dict[str, Any] = field(default_factory=dict)
    storages: dict[Hashable, Storage] = field(default_factory=dict)
    keys_of: dict[torch.fx.Node, tuple] = field(default_factory=dict)
    resident: set = field(default_factory=set)

    def bytes_of(self, keys: Iterable[Hashable]) -> dict[str, Any]:
        """Total size per device of the distinct storages ``keys``."""
        totals: dict[str, Any] = {}
        for key in dict.fromkeys(keys):
            storage = self.storages[key]
            totals[storage.device] = totals.get(storage.device, 0) + storage.nbytes
        return totals


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors of a node's value, as the rank holds them: a DTensor is its local shard, and a
    value inside a functorch transform (a vmap level's batched tensor) the tensor it wraps."""
    return [functorch_unwrapped(local_of(tensor)) for tensor in tensors_of(value)]


def trace_memory(gm: torch.fx.GraphModule, number: Callable[[Any], Any], param_device: str | None = None,
                 real_inputs: list | None = None) -> MemoryTrace:
    """Walk ``gm`` in node order under the model above; ``number`` turns sizes (SymInts) into numbers."""
    trace = MemoryTrace()
    aliases = _resident(gm, trace, number, param_device, real_inputs)
    nodes = list(gm.graph.nodes)
    for node in nodes:
        keys = []
        declared = _declared_aliases(node)
        for index, tensor in enumerate(tensors_in(node.meta.get("val"))):
            source = declared(index)
            if source is not None and trace.keys_of.get(source):
                aliases.setdefault(storage_key(tensor), trace.keys_of[source][0])  # later views of it follow
            key = aliases.get(storage_key(tensor), storage_key(tensor))
            if key not in trace.storages:
                trace.storages[key] = Storage(str(tensor.device), number(tensor.untyped_storage().nbytes()), node.name)
            keys.append(key)
        trace.keys_of[node] = tuple(dict.fromkeys(keys))
    last_uses = _last_uses(nodes)
    devices = sorted({storage.device for storage in trace.storages.values()})
    live = {device: 0 for device in devices}
    for key in trace.resident:
        storage = trace.storages[key]
        live[storage.device] = live[storage.device] + storage.nbytes
    references: dict[Hashable, int] = {}
    fsdp = FsdpStorages()
    for node in nodes:
        allocated: dict[str, Any] = {}
        for key in trace.keys_of[node]:
            if key in trace.resident:
                continue
            if not references.get(key):
                storage = trace.storages[key]
                allocated[storage.device] = allocated.get(storage.device, 0) + storage.nbytes
                live[storage.device] = live[storage.device] + storage.nbytes
            references[key] = references.get(key, 0) + 1
        trace.allocated[node.name] = allocated
        trace.live[node.name] = dict(live)
        gathered = _gathered_parameter_bytes(node)
        if gathered:  # shard_parameters' gathered parameters: live while the node's module runs, then let go
            device = next(iter(trace.live[node.name]), None) if not trace.keys_of[node] else \
                trace.storages[trace.keys_of[node][0]].device
            trace.live[node.name][device] = trace.live[node.name].get(device, 0) + gathered
        sharding = node.meta.get(META_KEY)
        if sharding is not None and sharding.ran_with and trace.keys_of[node]:  # FSDP's casts of its module's inputs and output
            device = trace.storages[trace.keys_of[node][0]].device
            trace.live[node.name][device] = trace.live[node.name][device] + sharding.ran_with
        for device, nbytes in fsdp.during(sharding).items():
            trace.live[node.name][device] = trace.live[node.name].get(device, 0) + nbytes
        fsdp.after(sharding)
        if node.op == "output":
            continue
        for dead in (*last_uses.get(node, ()), *((node,) if not node.users and node.op in _CALLS else ())):
            for key in trace.keys_of[dead]:
                if key in trace.resident:
                    continue
                references[key] -= 1
                if not references[key]:
                    storage = trace.storages[key]
                    live[storage.device] = live[storage.device] - storage.nbytes
    return trace


_CALLS = ("call_function", "call_method", "call_module")
"""A call whose value nothing uses frees it right after, as eager frees an unreferenced temporary
(``torch.empty(shape, device="meta").stride()`` in transformers' tensor-parallel layers, traced
and retargeted to the step's device, was held to the end of the step)."""


class FsdpStorages:
    """FSDP's own storages across nodes (`fxprop.distributed.dtensors.ParameterGather`): a group's
    unsharded parameters from its gather until the node after which FSDP reshards it, and the last
    all-gather output, which FSDP keeps until the next group's gather or its root's forward ends."""

    def __init__(self) -> None:
        self.unsharded: dict[int, ParameterGather] = {}
        self.buffer: tuple[str, int] | None = None

    def during(self, sharding: NodeSharding | None) -> dict[str, int]:
        """Bytes live just after the node (its module's gathered parameters still counted)."""
        for gather in sharding.gathers if sharding is not None else ():
            self.unsharded[id(gather)] = gather
            self.buffer = (gather.device, gather.buffer_bytes)
        for gather in sharding.released_within if sharding is not None else ():
            self.unsharded.pop(id(gather), None)
        totals: dict[str, int] = {}
        for gather in self.unsharded.values():
            totals[gather.device] = totals.get(gather.device, 0) + gather.unsharded_bytes
        if self.buffer is not None:
            totals[self.buffer[0]] = totals.get(self.buffer[0], 0) + self.buffer[1]
        return totals

    def after(self, sharding: NodeSharding | None) -> None:
        if sharding is None:
            return
        for gather in sharding.released:
            self.unsharded.pop(id(gather), None)
        if sharding.frees_gather_buffer:
            self.buffer = None


def _gathered_parameter_bytes(node: torch.fx.Node) -> int:
    sharding = node.meta.get(META_KEY)
    return sharding.gathered_parameter_bytes if sharding is not None else 0


_DETACH_METHODS = frozenset({"detach", "detach_"})
# Ops that return their first argument's storage, which their schema does not mark: a view, and a
# functional collective's wait, which returns the tensor it waited for.
_UNDECLARED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default,
                               *([torch.ops._c10d_functional.wait_tensor.default] if distributed_available() else [])})


def _declared_aliases(node: torch.fx.Node) -> Callable[[int], torch.fx.Node | None]:
    """For the i-th output tensor of ``node``, the input node it aliases by the op's schema (``Tensor(a)``).

    Annotations already share storages for views; this also covers aliases that are not views
    (``detach``, ``alias``) and those that the schema does not mark (``_unsafe_view``,
    ``wait_tensor``), whose annotations may come back as storages of their own.
    """
    target = node.target
    if (node.op == "call_method" and target in _DETACH_METHODS or target in (torch.detach, torch.Tensor.detach)
            or target in _UNDECLARED_VIEWS):
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        return lambda index: source
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return lambda index: None
    schema = schema_of(target)
    bound: dict[str, Any] = {argument.name: value for argument, value in zip(schema.arguments, node.args)}
    bound.update(node.kwargs)
    sources = []
    for returned in schema.returns:
        found = None
        if returned.alias_info is not None:
            for argument in schema.arguments:
                value = bound.get(argument.name)
                if (argument.alias_info is not None and isinstance(value, torch.fx.Node)
                        and argument.alias_info.before_set & returned.alias_info.before_set):
                    found = value
                    break
        sources.append(found)
    # ``to`` and ``contiguous`` declare ``Tensor(a)`` but return their input only when nothing
    # changes, else a copy: an alias the annotations do not share holds only if nothing changed.
    outputs = node.meta.get("val")
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    sources = [source if source is None or index >= len(outputs) or _may_share(source.meta.get("val"), outputs[index])
               else None for index, source in enumerate(sources)]
    if len(sources) == 1:
        return lambda index: sources[0]
    return lambda index: sources[index] if index < len(sources) else None


def _may_share(before: Any, after: Any) -> bool:
    if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)):
        return True
    if storage_key(before) == storage_key(after):
        return True
    return (before.dtype == after.dtype and before.device == after.device and before.shape == after.shape
            and before.stride() == after.stride())


def _last_uses(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """For each node, the values whose last user it is (as `torch.fx.Interpreter` computes it)."""
    seen: set[torch.fx.Node] = set()
    last_uses: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in reversed(nodes):
        for used in node.all_input_nodes:
            if used not in seen:
                seen.add(used)
                last_uses.setdefault(node, []).append(used)
    return last_uses


def _resident(gm: torch.fx.GraphModule, trace: MemoryTrace, number: Callable[[Any], Any], param_device: str | None,
              real_inputs: list | None) -> dict[Hashable, Hashable]:
    """Register inputs and module state; returns the aliases of annotation storages to real ones."""
    aliases: dict[Hashable, Hashable] = {}
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    for index, node in enumerate(placeholders):
        real = real_inputs[index] if real_inputs is not None and index < len(real_inputs) else None
        for tensor in tensors_in(node.meta.get("val")):
            key = storage_key(tensor)
            size = tensor.untyped_storage().nbytes
            if isinstance(real, torch.Tensor) and len(tensors_in(node.meta.get("val"))) == 1 and real.dtype != tensor.dtype:
                # FSDP's root cast the input (mixed precision): the graph holds the cast, its caller its own
                _add_resident(trace, trace.input_bytes, ("input", storage_key(real)), str(tensor.device),
                              _input_storage_size(local_of(real), real), number)
            elif isinstance(real, torch.Tensor) and len(tensors_in(node.meta.get("val"))) == 1:
                if _holds_memory(real):
                    aliases[key] = key = ("input", storage_key(real))  # two inputs viewing one storage count once
                size = _input_storage_size(tensor, real)
            _add_resident(trace, trace.input_bytes, key, str(tensor.device), size, number)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            real = _attribute(gm, str(node.target))
            for tensor in tensors_in(node.meta.get("val")):
                key = storage_key(tensor)
                if isinstance(real, torch.Tensor):
                    aliases[key] = key = ("state", storage_key(real))
                    size = real.untyped_storage().nbytes
                else:
                    size = tensor.untyped_storage().nbytes
                _add_resident(trace, trace.state_bytes, key, str(tensor.device), size, number)
        elif node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            outputs = tensors_in(node.meta.get("val"))
            fallback = param_device or (str(outputs[0].device) if outputs else "meta")
            for tensor in (*module.parameters(), *module.buffers()):
                tensor = local_of(tensor)
                device = fallback if tensor.device.type == "meta" else str(tensor.device)
                _add_resident(trace, trace.state_bytes, ("state", storage_key(tensor)), device,
                              tensor.untyped_storage().nbytes, number)
    return aliases


def _add_resident(trace: MemoryTrace, totals: dict[str, Any], key: Hashable, device: str, size: Callable[[], Any],
                  number: Callable[[Any], Any]) -> None:
    if key in trace.resident:
        return
    nbytes = number(size())
    trace.resident.add(key)
    trace.storages[key] = Storage(device, nbytes)
    totals[device] = totals.get(device, 0) + nbytes


def _input_storage_size(annotation: torch.Tensor, real: torch.Tensor) -> Callable[[], Any]:
    """The size of an input's storage: the caller's, which may be larger than the input (a view of
    a larger tensor, the last rank's shard of a dim the ranks do not divide evenly, whose storage
    keeps the padding), where the annotation's size is a number; else the annotation's."""
    def size() -> Any:
        annotated = annotation.untyped_storage().nbytes()
        if not isinstance(annotated, int) or is_dtensor(real) or real.layout != torch.strided:
            return annotated
        try:
            return max(annotated, int(real.untyped_storage().nbytes()))
        except (RuntimeError, NotImplementedError, TypeError):
            return annotated
    return size


def _holds_memory(tensor: torch.Tensor) -> bool:
    return tensor.device.type != "meta" and not isinstance(tensor, FakeTensor)


def _attribute(gm: torch.fx.GraphModule, target: str) -> Any:
    try:
        return operator.attrgetter(target)(gm)
    except AttributeError:
        return None
