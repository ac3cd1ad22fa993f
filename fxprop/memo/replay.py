"""Whole graphs replayed: a graph propagated before, called again with inputs, state and settings
that match, gets the annotations its first propagation staged, without a node being computed again.

The key (`graph_call`) holds everything a propagation of the graph reads:

- every node up to the output: its op, its target (a called module: `StateView.signature`, its
  class, attributes, parameters, buffers and the values fxprop knows of them; an attribute read:
  the tensor's signature and known values) and its arguments, other nodes by position;
- every input's signature, as the rule cache signs tensors, and the values fxprop knows of it;
- which inputs and state tensors are one object, and which inputs share a storage;
- the settings the rule cache keys by (grad mode, default dtype and device, backend flags, the
  rule registry's generation) and the call's options.

Graphs that run code the user wrote (their functions, their module classes, module hooks), call
functorch transforms, hold subgraphs, have symbolic sizes or DTensors, or needed the real-tensor
fallback are walked every time (so are graphs that change process-wide settings or read the
process's state, `fxprop.memo.purity`). A walk's values are recorded as staged (`template`: a
detached alias) and kept, at the walk's end, as plain numbers (`kept`: sizes, strides, offsets, which
values share a storage and its size); a replay builds fresh FakeTensors over storages of its own
from them, aliasing each other as the walk's did and nothing anyone else holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, NamedTuple

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata

from ..devices import device_of
from ..kinds import Kind
from ..torch_compat import (any_autocast_enabled, export_guards_code, functorch_depth, global_module_hooks_registered,
                            neg_view, own_state, storage_key)
from .cache import _Key
from .signatures import Uncacheable, signature, values_signature
from .purity import replayable_target
from ..engine.inputs import values_worth_knowing

# What a replayed value may hold besides tensors and containers: values nobody can change in place.
_IMMUTABLE = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.memory_format,
              torch.layout, torch.Size, type(Ellipsis))
_PLAIN_ARGUMENTS = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                              torch.layout, type(Ellipsis)})


# call_function targets `replayable_target` accepted, by id: torch's own, as long-lived as torch. A key
# names them by id, which spares hashing them (an OpOverload hashes in Python) twice a node.
_replayable_functions: dict[int, Any] = {}


class _Unreplayable(Exception):
    """Something in the graph or its call that a key cannot hold: the graph is walked."""


@dataclass(frozen=True)
class GraphCall:
    """One propagation's replay key, and the nodes a replay annotates (graph order, up to the output)."""
    key: Hashable
    nodes: tuple


def graph_call(gm: torch.fx.GraphModule, inputs: list, state: Any, known: Any, context: Hashable) -> GraphCall | None:
    """The replay key of propagating ``gm`` on ``inputs`` (fxprop's internal values), or None where a
    replay could differ from a walk. ``state``: the call's `StateView`; ``known``: its `KnownValues`;
    ``context``: the call's settings and options.

    The key is one flat tuple that can be read back only one way: a node stands as its position
    (a bare int), a constant as its type followed by its value, a container as its type and
    length followed by its items."""
    if functorch_depth() > 0 or global_module_hooks_registered() or any_autocast_enabled():
        return None
    signer = _Signer(known, state)
    nodes: list[torch.fx.Node] = []
    out: list[Hashable] = [context]
    try:
        for value in inputs:
            signer.input(value, out)
        positions = signer.positions
        append = out.append
        functions = _replayable_functions
        for node in gm.graph.nodes:
            positions[node] = len(nodes)
            nodes.append(node)
            op = node.op
            target = node.target
            append(op)
            if op == "call_function":
                if functions.get(id(target)) is not target:
                    if not replayable_target(op, target):
                        return None
                    functions[id(target)] = target
                append(id(target))  # kept in `functions` for good, so no other object takes its id
            else:
                append(target)
                if op == "call_method":
                    if not replayable_target(op, target):
                        return None
                elif op == "call_module":
                    signer.module(gm, str(node.target), out)
                elif op == "get_attr":
                    signer.attribute(gm, str(node.target), out)
                elif op not in ("placeholder", "output"):
                    return None
            arguments = node.args
            append(len(arguments))
            for argument in arguments:
                kind = type(argument)
                if kind is torch.fx.Node:
                    append(positions[argument])  # KeyError: used before defined, which the walk reports
                elif kind in _PLAIN_ARGUMENTS:
                    append(kind)
                    append(argument)
                else:
                    signer.argument(argument, out)
            keywords = node.kwargs
            if keywords:
                signer.argument(keywords, out)
            else:
                append(None)
            if op == "output":
                break
        return GraphCall(_Key(tuple(out)), tuple(nodes))
    except (_Unreplayable, Uncacheable, TypeError, AttributeError, KeyError, RuntimeError):
        return None


class _Signer:
    """Signs the parts of one key into a flat list; tensors met twice (tied weights, one input
    passed twice) are named by the order they were first met, and inputs by the storage they share."""

    def __init__(self, known: Any, state: Any):
        self.known = known
        self.state = state
        self.positions: dict[torch.fx.Node, int] = {}
        self.tensors: dict[int, int] = {}
        self.storages: dict[int, int] = {}
        self.kept: list[torch.Tensor] = []  # ids stay unique while the key is built
        self.modules: dict[str, torch.nn.Module] = {}  # attribute owners by path

    def identity(self, tensor: torch.Tensor) -> int:
        found = self.tensors.get(id(tensor))
        if found is None:
            found = self.tensors[id(tensor)] = len(self.tensors)
            self.kept.append(tensor)
        return found

    def input(self, value: Any, out: list) -> None:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                raise _Unreplayable  # internal inputs are plain meta tensors; anything else is not signed here
            known = self.known.get(value)
            out.extend((torch.Tensor, self.identity(value), self.storages.setdefault(storage_key(value), len(self.storages)),
                        signature(value), values_signature(known) if known is not None else None))
        elif isinstance(value, (tuple, list)):
            out.extend((type(value), len(value)))
            for item in value:
                self.input(item, out)
        elif isinstance(value, dict):
            out.extend((dict, len(value)))
            for key, item in value.items():
                out.append(key)
                self.input(item, out)
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _Unreplayable
        else:
            self.argument(value, out)

    def submodule(self, gm: torch.fx.GraphModule, path: str) -> torch.nn.Module:
        found = self.modules.get(path)
        if found is None:
            found = gm
            for part in path.split(".") if path else ():
                modules = own_state(found)[2]
                found = modules[part] if part in modules else getattr(found, part)
            if not isinstance(found, torch.nn.Module):
                raise _Unreplayable
            self.modules[path] = found
        return found

    def module(self, gm: torch.fx.GraphModule, target: str, out: list) -> None:
        module = self.submodule(gm, target)
        guards = export_guards_code(module)
        if guards is not None:
            out.append(guards)
            return
        if isinstance(module, torch.fx.GraphModule):
            raise _Unreplayable  # walked into: its nodes are annotated too
        out.append(self.state.signature(module))
        out.append(tuple(self.identity(tensor) for tensor in _state_tensors(module)))

    def attribute(self, gm: torch.fx.GraphModule, target: str, out: list) -> None:
        path, _, name = target.rpartition(".")
        module = self.submodule(gm, path)
        parameters, buffers, _ = own_state(module)
        owner = parameters[name] if name in parameters else buffers[name] if name in buffers else getattr(module, name)
        if isinstance(owner, torch.Tensor):
            if type(owner) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
                raise _Unreplayable
            values = values_signature(owner) if values_worth_knowing(owner) else None
            out.extend((type(owner), self.identity(owner), signature(owner), values))
        elif isinstance(owner, torch.nn.Module):
            raise _Unreplayable  # a module as a value (a subgraph, a submodule passed along)
        else:
            out.append(signature(owner))

    def argument(self, value: Any, out: list) -> None:
        kind = type(value)
        if kind is torch.fx.Node:
            out.append(self.positions[value])
        elif kind in _PLAIN_ARGUMENTS:
            out.extend((kind, value))
        elif kind is float:
            out.extend((float, value, math.copysign(1.0, value)))  # -0.0 and 0.0 compare equal
        elif isinstance(value, (tuple, list)):
            out.extend((kind, len(value)))
            for item in value:
                self.argument(item, out)
        elif isinstance(value, dict):
            out.extend((kind, len(value)))
            for key, item in value.items():
                out.append(key)
                self.argument(item, out)
        elif isinstance(value, slice):
            out.append(slice)
            for part in (value.start, value.stop, value.step):
                self.argument(part, out)
        elif isinstance(value, torch.Tensor):
            raise _Unreplayable  # a tensor held by the graph's arguments: identity and values would be part of it
        else:
            out.append(signature(value))


def _state_tensors(module: torch.nn.Module):
    """Every parameter and buffer a module holds, its submodules' included, duplicates too."""
    parameters, buffers, submodules = own_state(module)
    yield from parameters.values()
    yield from buffers.values()
    for submodule in submodules.values():
        if submodule is not None:
            yield from _state_tensors(submodule)


# --- what a propagation staged, kept to be built again ----------------------------------------

class TensorTemplate(NamedTuple):
    snapshot: torch.Tensor  # a private alias of the value as it was staged
    device: torch.device
    requires_grad: bool


class _Container(NamedTuple):
    kind: type
    parts: tuple
    keys: tuple | None  # a dict's keys


class _Immutable(NamedTuple):
    value: Any


_new_tuple = tuple.__new__  # a named tuple's own constructor, without its per-field arguments
empty_strided = torch.empty_strided
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def template(value: Any) -> Any:
    """A description of a staged value that later calls build fresh FakeTensors from; None
    where the value holds something that cannot be built again (a user's object)."""
    kind = type(value)
    if kind in _PLAIN_TENSORS:
        if value.layout is not torch.strided or value.device.type != "meta":
            return None
        return _new_tuple(TensorTemplate, (value.detach(), device_of(value), value.requires_grad))
    if isinstance(value, torch.Tensor):
        return None  # a subclass: its own state would not be built again
    if isinstance(value, _IMMUTABLE):
        return _new_tuple(_Immutable, (value,))
    # staged as `map_structure` stages them: a list or dict of any class (an output node's
    # immutable_list, immutable_dict) as a plain one, a tuple as its own class only when named
    if isinstance(value, (tuple, list)):
        if kind is not tuple and kind is not list:
            kind = (list if isinstance(value, list) else kind if kind.__module__ == "torch.return_types"
                    or hasattr(kind, "_fields") else tuple)
        parts = tuple([template(item) for item in value])
        return None if None in parts else _Container(kind, parts, None)
    if isinstance(value, dict):
        parts = tuple([template(item) for item in value.values()])
        return None if None in parts else _Container(dict, parts, tuple(value))
    return None


class TensorRecord(NamedTuple):
    """A staged tensor as an entry keeps it: plain numbers, no tensor (nothing anyone holds is shared)."""
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    conj: bool
    neg: bool
    storage: int        # which of the graph's storages, by the order they were first met
    storage_bytes: int  # its size at the walk's end (a later node may have resized it)
    fills: bool         # it fills the storage from its start, no conj/neg bit: an empty_strided makes both
    alone: bool         # it fills the storage and no other value shares it


def kept(recordings: tuple) -> tuple:
    """A walk's recordings as an entry keeps them, read at the walk's end: each tensor snapshot as a
    `TensorRecord`, storages named by the order they are first met."""
    storages: dict[int, int] = {}
    users: list[int] = []

    def counted(described: Any) -> None:
        if type(described) is TensorTemplate:
            index = storages.setdefault(storage_key(described.snapshot), len(storages))
            if index == len(users):
                users.append(0)
            users[index] += 1
        elif type(described) is _Container:
            for part in described.parts:
                counted(part)

    def recorded(described: Any) -> Any:
        if type(described) is TensorTemplate:
            snapshot = described.snapshot
            index = storages[storage_key(snapshot)]
            storage_bytes = snapshot.untyped_storage().nbytes()
            shape, stride, offset = tuple(snapshot.shape), snapshot.stride(), snapshot.storage_offset()
            conj, neg = snapshot.is_conj(), snapshot.is_neg()
            fills = not (offset or conj or neg) and _extent(shape, stride) * snapshot.element_size() == storage_bytes
            return _new_tuple(TensorRecord, (shape, stride, offset, snapshot.dtype, described.device,
                                             described.requires_grad, conj, neg, index, storage_bytes, fills,
                                             fills and users[index] == 1))
        if type(described) is _Container:
            return _Container(described.kind, tuple(recorded(part) for part in described.parts), described.keys)
        return described

    for recording in recordings:
        counted(recording.value)
    return tuple(NodeRecording(recorded(recording.value), fresh_tensor_meta(recording.tensor_meta),
                               recording.value_type, recording.provenance) for recording in recordings)


def _extent(shape: tuple, stride: tuple) -> int:
    """Elements from a view's first to its last, inclusive (0 for an empty view)."""
    if not all(shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))


def _fresh(record: TensorRecord, storages: dict) -> torch.Tensor:
    """A meta tensor laid out as ``record``, on this replay's own storage for it (``storages``: the
    ones made so far, by index): replayed values alias each other as the walk's did, and nothing else."""
    if record.alone:
        return empty_strided(record.shape, record.stride, dtype=record.dtype, device="meta")
    storage = storages.get(record.storage)
    if storage is None:
        if record.fills:  # the storage's first value: one call makes both
            fresh = empty_strided(record.shape, record.stride, dtype=record.dtype, device="meta")
            storages[record.storage] = fresh.untyped_storage()
            return fresh
        storage = storages[record.storage] = torch.UntypedStorage(record.storage_bytes, device="meta")
    fresh = torch.empty((0,), dtype=record.dtype, device="meta").set_(storage, record.offset, record.shape,
                                                                      record.stride)
    if storage.nbytes() != record.storage_bytes:
        storage.resize_(record.storage_bytes)  # set_ grows a storage to the view; the walk's was shrunk after it
    if record.conj:
        fresh = fresh.conj()
    if record.neg:
        fresh = neg_view(fresh)
    return fresh


def build(described: Any, make_fake: Any, storages: dict) -> Any:
    """A fresh value from a kept recording: new FakeTensors over new storages and new containers, as
    staging makes them."""
    kind = type(described)
    if kind is TensorRecord:
        return make_fake.from_snapshot(_fresh(described, storages), described.device, described.requires_grad)
    if kind is _Immutable:
        return described[0]
    items = [build(part, make_fake, storages) for part in described.parts]
    kind = described.kind
    if kind is list:
        return items
    if kind is dict:
        return dict(zip(described.keys, items))
    if kind is tuple:
        return tuple(items)
    if hasattr(kind, "_fields"):
        return kind(*items)
    return kind(items)


class NodeRecording(NamedTuple):
    value: Any             # a `template`
    tensor_meta: Any       # as staged: `fresh_tensor_meta` builds each replay's own
    value_type: type
    provenance: Any


@dataclass(frozen=True)
class GraphEntry:
    """What one propagation of a graph staged, node by node in graph order, and what it left in ``gm.meta``."""
    nodes: tuple
    known_inputs: dict | None  # the real values of inputs passed for real, by the placeholder's position
    summary: dict


def replayable_run(nodes: list, recordings: dict) -> tuple | None:
    """The recordings of ``nodes`` (graph order, up to the output) as an entry keeps them, or None
    where the run did something a replay would not do again (a fallback, a value not rebuilt)."""
    kept = []
    for node in nodes:
        recording = recordings.get(node)
        if recording is None or recording.value is None:
            return None
        provenance = recording.provenance
        if provenance.fallback_bytes or provenance.kind is Kind.FALLBACK:
            return None
        kept.append(recording)
    return tuple(kept)




def fresh_tensor_meta(tensor_meta: Any) -> Any:
    """``meta["tensor_meta"]`` as staging makes it (`fxprop.engine.metadata.tensor_metadata`: never
    quantized), its qparams dict the node's own: whatever a caller wrote into the first one stays there."""
    if type(tensor_meta) is TensorMetadata:  # fxprop's own: never quantized, its qparams empty
        return _new_tuple(TensorMetadata, (*tensor_meta[:6], {}))
    if isinstance(tensor_meta, (tuple, list)) and not isinstance(tensor_meta, torch.Size):
        items = [fresh_tensor_meta(item) for item in tensor_meta]
        if isinstance(tensor_meta, list):
            return items
        return type(tensor_meta)(*items) if hasattr(tensor_meta, "_fields") else type(tensor_meta)(items)
    if isinstance(tensor_meta, dict):
        return {key: fresh_tensor_meta(item) for key, item in tensor_meta.items()}
    return tensor_meta


def differences(kept_nodes: tuple, walked: tuple) -> list[int]:
    """The positions at which a kept entry and a new walk's recordings (`kept` already) differ:
    values (sizes, strides, offsets, dtypes, devices, requires_grad, conj/neg bits, which values share
    a storage and its size), types, tensor_meta and provenance."""
    return [position for position, (first, second) in enumerate(zip(kept_nodes, walked))
            if (_comparable(first.value) != _comparable(second.value) or first.value_type is not second.value_type
                or fresh_tensor_meta(first.tensor_meta) != fresh_tensor_meta(second.tensor_meta)
                or first.provenance != second.provenance)] + list(range(min(len(kept_nodes), len(walked)),
                                                                       max(len(kept_nodes), len(walked))))


def _comparable(described: Any) -> Any:
    if type(described) is _Immutable:
        value = described.value
        if type(value) is float:  # -0.0 == 0.0, yet math.copysign tells them apart
            return (float, "nan") if value != value else (float, value, math.copysign(1.0, value))
        return (type(value), "nan") if value != value else (type(value), value)
    if type(described) is _Container:
        return (described.kind, described.keys, tuple(_comparable(part) for part in described.parts))
    return described


def built_differences(kept_nodes: tuple, staged: list, make_fake: Any) -> list[int]:
    """The positions at which what a replay of ``kept_nodes`` builds differs from a walk's staged
    values (``staged``, graph order): sizes, strides, offsets, dtypes, devices, requires_grad and
    leafness, conj/neg bits, which values share a storage and its size. `differences` compares what
    the entry keeps; this compares what a replay makes of it, so ``cache="verify"`` catches a wrong build."""
    storages: dict = {}
    built = [build(recording.value, make_fake, storages) for recording in kept_nodes]
    replayed, walked = _layouts(built), _layouts(staged)
    return [position for position, (first, second) in enumerate(zip(replayed, walked)) if first != second]


def _layouts(values: list) -> list:
    storages: dict[int, int] = {}

    def described(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (type(value), tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                    value.requires_grad, value.is_leaf, value.is_conj(), value.is_neg(),
                    storages.setdefault(storage_key(value), len(storages)), value.untyped_storage().nbytes())
        if isinstance(value, dict):
            return (type(value), tuple(value), tuple(described(item) for item in value.values()))
        if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
            return (type(value), tuple(described(item) for item in value))
        return _comparable(_Immutable(value))

    return [described(value) for value in values]
