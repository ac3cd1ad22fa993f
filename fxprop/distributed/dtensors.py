"""DTensor values through a graph: placements from DTensor's sharding propagator, redistributions
from its planner, the rank's local work through fxprop's rules.

A DTensor input, parameter or buffer becomes a DTensor whose local tensor is one of fxprop's
tagged meta tensors (`internal_dtensor`). While such a graph propagates, fxprop's dispatch
(`DTensorDispatch`) yields every op on a DTensor to DTensor itself: its sharding propagator picks
the output placements and the input placements the op needs, its planner redistributes, and the
local ops and functional collectives that come out of both reach fxprop's rules on local tensors.
What the rank does on the way is recorded per node (`NodeSharding`, ``node.meta["fxprop_dtensor"]``):
the placements and local shapes of each DTensor it produced, each redistribution (which input,
from and to which placements, the planner's steps, the collectives it ran), every collective
(kind, mesh dim, bytes sent and received by the rank) and the FLOPs of its local ops.

Nothing here decides a placement: a wrong one would be DTensor's.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..call import tensors_in
from ..devices import device_of, normalize_device, tag
from ..errors import UnsupportedError
from ..aten.flop_formulas import FORMULAS
from ..torch_compat import (dtensor_spec, dtensor_spec_of, dtensor_type, group_name_of, group_size_of,
                           local_shape_at, local_tensor_of, make_dtensor, observing_redistributions, packet_of,
                           transform_steps)

META_KEY = "fxprop_dtensor"
"""The ``node.meta`` key of a node's `NodeSharding`."""


def is_dtensor(value: Any) -> bool:
    if type(value) is torch.Tensor:
        return False
    cls = dtensor_type()
    return cls is not None and isinstance(value, cls)


def local_of(value: Any) -> Any:
    """A DTensor's local tensor; any other value as it is."""
    return local_tensor_of(value) if is_dtensor(value) else value


# --- values -----------------------------------------------------------------------------------

def mesh_device(mesh: Any) -> torch.device:
    """The logical device of a mesh's local tensors: its device type (a "cuda" mesh: cuda:0)."""
    return normalize_device(mesh.device_type)


def internal_dtensor(value: Any, local_to_meta: Callable[[torch.Tensor, torch.device], torch.Tensor]) -> Any:
    """``value`` (a DTensor) with its local tensor replaced by ``local_to_meta(local, device)``; the
    device is the local tensor's own unless it is on meta, then the mesh's."""
    local = local_tensor_of(value)
    spec = dtensor_spec_of(value)
    device = local.device if local.device.type != "meta" else mesh_device(spec.mesh)
    meta = _keeping_storage(local_to_meta(local.detach(), device), local, device)
    result = make_dtensor(meta, spec, requires_grad=value.requires_grad)
    return tag(result, device)


def _keeping_storage(meta: torch.Tensor, local: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``meta`` over a storage as large as ``local``'s: FSDP's shard is a view of its padded
    storage (the last ranks of an uneven split hold fewer rows in as many bytes)."""
    nbytes = local.untyped_storage().nbytes()
    if nbytes <= meta.untyped_storage().nbytes() or meta.requires_grad:
        return meta
    storage = torch.empty(nbytes // local.element_size(), dtype=meta.dtype, device="meta")
    return tag(storage.as_strided(meta.shape, meta.stride(), meta.storage_offset()), device)


def as_parameter(value: Any, requires_grad: bool) -> Any:
    """A DTensor as an ``nn.Parameter`` (DTensor's own form of one), its local tensor's device kept."""
    device = device_of(local_tensor_of(value))
    parameter = torch.nn.Parameter(value, requires_grad=requires_grad)
    tag(local_tensor_of(parameter), device)
    return tag(parameter, device)


def dtensor_from_spec(mesh: Any, placements: tuple, shape: tuple, dtype: torch.dtype, requires_grad: bool,
                      device: torch.device | None = None) -> Any:
    """A DTensor of global ``shape`` on ``mesh``, contiguous, whose local tensor is a tagged meta
    tensor of this rank's local shape (`fxprop.TensorSpec` with a mesh)."""
    stride = _contiguous(shape)
    local_shape = local_shape_at(tuple(shape), tuple(mesh.shape), tuple(mesh.get_coordinate()), tuple(placements))
    device = device if device is not None else mesh_device(mesh)
    local = tag(torch.empty_strided(local_shape, _contiguous(local_shape), dtype=dtype, device="meta"), device)
    local.requires_grad_(requires_grad)
    spec = dtensor_spec(mesh, tuple(placements), tuple(shape), stride, dtype)
    return tag(make_dtensor(local, spec, requires_grad=requires_grad), device)


def _contiguous(shape) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(tuple(shape)):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def stage_dtensor(value: Any, make_fake: Callable[[torch.Tensor, torch.device], torch.Tensor]) -> Any:
    """The annotation of a DTensor: a DTensor of the same spec whose local tensor is a FakeTensor
    (the form dynamo's ``example_value`` takes in DTensor graphs)."""
    local = local_tensor_of(value)
    device = device_of(local)
    if device.type == "meta":  # a local result of DTensor's op: on the node's device
        device = device_of(value) if device_of(value).type != "meta" else mesh_device(dtensor_spec_of(value).mesh)
    fake = make_fake(local, device)
    # A DTensor that requires grad is an autograd leaf on its device: on a host without that
    # device (a "cuda" mesh simulated on a CPU), autograd would abort the process on first use.
    # The annotation then does not require grad; ``meta["tensor_meta"].requires_grad`` says if it does.
    requires_grad = value.requires_grad and _usable_here(device)
    return make_dtensor(fake, dtensor_spec_of(value), requires_grad=requires_grad)


def _usable_here(device: torch.device) -> bool:
    if device.type == "cpu" or device.type == "meta":
        return True
    module = getattr(torch, device.type, None)
    return bool(module is not None and getattr(module, "is_available", lambda: False)())


# --- what a node records ---------------------------------------------------------------------

@dataclass(frozen=True)
class Sharding:
    """One DTensor a node produced: its mesh, placements and global shape; local shapes by rank."""
    mesh: Any
    placements: tuple
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]  # this rank's (the mesh's rank)

    @functools.cached_property
    def local_shapes(self) -> dict[int, tuple[int, ...]]:
        """The local shape on every rank of the mesh (an uneven split gives the last ranks less)."""
        return _local_shapes(self.shape, tuple(self.mesh.shape), self.placements, _ranks(self.mesh))

    def __repr__(self) -> str:
        return (f"Sharding(placements={self.placements}, shape={self.shape}, local_shape={self.local_shape}, "
                f"mesh={tuple(self.mesh.shape)})")


@functools.lru_cache(maxsize=4096)
def _local_shapes(shape: tuple, mesh_shape: tuple, placements: tuple, ranks: tuple) -> dict[int, tuple[int, ...]]:
    coordinates = itertools.product(*(range(size) for size in mesh_shape))
    return {rank: local_shape_at(shape, mesh_shape, coordinate, placements)
            for rank, coordinate in zip(ranks, coordinates)}


def _ranks(mesh: Any) -> tuple[int, ...]:
    return tuple(int(rank) for rank in mesh.mesh.flatten().tolist())


@dataclass(frozen=True)
class Collective:
    """One collective the rank ran: its kind (``all_gather_into_tensor``...), the mesh dim of its
    group (its name, or its index on an unnamed mesh; the group's name where no mesh dim has it),
    the group's size, and the bytes the rank sends and receives (see `collective_bytes`)."""
    kind: str
    mesh_dim: Any
    group_size: int
    send_bytes: int
    receive_bytes: int


@dataclass(frozen=True)
class Redistribution:
    """A DTensor the node redistributed: ``argument`` is its position among the node's arguments
    (flattened as DTensor flattens them), None for one made inside the call (a parallel style's
    hook); its placements before and after; the planner's ``steps`` (mesh dim, from, to); the
    collectives they ran."""
    argument: int | None
    source: tuple
    target: tuple
    steps: tuple
    collectives: tuple[Collective, ...]
    explicit: bool = False  # called as DTensor.redistribute, not chosen by an op's sharding
    parameter: bool = False  # the tensor redistributed is a parameter of the module the node calls
    local_bytes: int = 0  # bytes of the redistributed local tensor (FSDP's gathered parameter)


@dataclass(frozen=True)
class ParameterGather:
    """FSDP's unshard of one parameter group before its module runs (`fxprop.distributed.fsdp`):
    the group's ``parameters`` (names on the module), each parameter's `Redistribution` (DTensor's
    planner's all-gather on the FSDP mesh dim), and the one ``collective`` FSDP runs for the whole
    group in their place (None on a group of one rank). ``unsharded_bytes``: FSDP's unsharded
    parameters (each padded shard times the ranks, in the all-gather's dtype), live while the module
    runs; ``buffer_bytes``: FSDP's all-gather output, which it keeps until the next group's gather
    (or its root's forward ends); ``resharded``: FSDP lets the parameters go after forward (after
    the node whose `NodeSharding.released` holds this gather)."""
    module: str
    parameters: tuple[str, ...]
    redistributions: tuple[Redistribution, ...]
    collective: Collective | None
    unsharded_bytes: int
    buffer_bytes: int
    device: str
    resharded: bool


@dataclass
class NodeSharding:
    """``node.meta["fxprop_dtensor"]``: what one node of a DTensor graph did on this rank.

    outputs: a `Sharding` for each DTensor of the node's value, None for each plain tensor, in
        the order of the value's tensors (flattened).
    redistributions: each `Redistribution`, in order.
    collectives: every `Collective` the node ran, those of its redistributions included.
    flops: the FLOPs of its local ops (torch.utils.flop_counter's formulas on local shapes).
    gathers: FSDP's `ParameterGather` of each group unsharded before the node's module ran (its
        collective is among ``collectives``; its parameters' redistributions are its own).
    released: the gathers whose parameters FSDP let go after the node's module ran (resharded).
    frees_gather_buffer: the node ends an FSDP root's forward, which lets FSDP's last all-gather
        output go.
    released_within: the gathers FSDP let go while the node's module still ran (a nested FSDP
        module's, resharded as its own forward ended).
    ran_with: the bytes the node's FSDP module ran with beyond the node's inputs and value: its
        inputs cast to the policy's ``param_dtype``, and its output as it made it less the node's
        value, which FSDP casts to ``output_dtype`` after resharding.
    """
    outputs: tuple = ()
    redistributions: list[Redistribution] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    flops: int = 0
    gathers: list[ParameterGather] = field(default_factory=list)
    released: list[ParameterGather] = field(default_factory=list)
    frees_gather_buffer: bool = False
    released_within: list[ParameterGather] = field(default_factory=list)
    ran_with: int = 0

    @property
    def gathered_parameter_bytes(self) -> int:
        """Bytes of the parameters the node's module gathered before it ran (FSDP's explicit
        ``redistribute`` in its pre-hook), live while it runs. A parameter an op's sharding
        redistributes by itself (a row-wise layer's bias made partial) is a temporary of the op."""
        return sum(r.local_bytes for r in self.redistributions if r.parameter and r.explicit)

    def comm(self) -> dict[str, dict[str, int]]:
        """{kind: {"count", "send_bytes", "receive_bytes"}} over this node's collectives."""
        return tally(self.collectives)


def tally(collectives) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for collective in collectives:
        entry = found.setdefault(collective.kind, {"count": 0, "send_bytes": 0, "receive_bytes": 0})
        entry["count"] += 1
        entry["send_bytes"] += collective.send_bytes
        entry["receive_bytes"] += collective.receive_bytes
    return found


def collective_bytes(kind: str, group_size: int, input_bytes: int, output_bytes: int) -> tuple[int, int]:
    """(sent, received) bytes per rank, as the ring algorithms move them (NCCL's bus bandwidth):
    an all-gather sends and receives ``(n-1)/n`` of its output, a reduce-scatter and an
    all-to-all ``(n-1)/n`` of their input, an all-reduce ``2(n-1)/n`` of it; a broadcast moves its
    tensor once. Integer bytes (rounded down)."""
    n = group_size
    if n <= 1:
        return 0, 0
    if kind.startswith("all_gather"):
        moved = output_bytes * (n - 1) // n
    elif kind.startswith("all_reduce"):
        moved = 2 * input_bytes * (n - 1) // n
    elif kind.startswith(("reduce_scatter", "all_to_all", "shard_dim_alltoall")):
        moved = input_bytes * (n - 1) // n
    else:  # broadcast
        moved = input_bytes
    return moved, moved


_NOT_COLLECTIVES = frozenset({"wait_tensor", "_wrap_tensor_autograd", "mesh_get_process_group"})
_GROUP_SIZE_ARGUMENT = {"all_gather_into_tensor": 1, "all_gather_into_tensor_coalesced": 1,
                        "reduce_scatter_tensor": 2, "reduce_scatter_tensor_coalesced": 2,
                        "all_gather_into_tensor_out": 1, "reduce_scatter_tensor_out": 2}


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


class ShardingRecorder:
    """Collects one propagation's `NodeSharding`s: fed by the dispatch (local ops, collectives)
    and by DTensor's planner (redistributions); `begin` starts a node."""

    def __init__(self) -> None:
        self.node: NodeSharding | None = None
        self.arguments: list[torch.Tensor] = []  # the local tensors of the node's DTensor arguments
        self.open: list[list[Collective]] = []  # collectives of the redistributions in progress
        self.group_dims: dict[str, Any] = {}
        self.meshes: set[int] = set()
        self.parameters: set[int] = set()
        self.diverting: tuple[list, list] | None = None  # (collectives, redistributions) kept apart

    def begin(self, args: tuple, kwargs: dict, state: tuple = ()) -> NodeSharding:
        self.node = NodeSharding()
        self.parameters = {id(local_tensor_of(value)) for value in state if is_dtensor(value)}
        self.open = []
        flat = tensors_in(args, kwargs)
        self.arguments = [local_tensor_of(value) for value in flat if is_dtensor(value)]
        for value in flat:
            if is_dtensor(value):
                self.learn_mesh(dtensor_spec_of(value).mesh)
        return self.node

    def learn_mesh(self, mesh: Any) -> None:
        if id(mesh) in self.meshes:
            return
        self.meshes.add(id(mesh))
        names = mesh.mesh_dim_names
        for dim in range(mesh.ndim):
            try:
                self.group_dims.setdefault(group_name_of(mesh.get_group(dim)),
                                           (names[dim] if names else dim, mesh.size(dim)))
            except Exception:  # a mesh dim without a group of its own (a flattened view)
                continue

    def local_op(self, func: Any, args: tuple, kwargs: dict, out: Any, depth: int) -> None:
        """An op on local tensors reached fxprop's dispatch."""
        node = self.node
        if node is None or depth:
            return  # a rule's own parts (the rule of a collective may call it again, one level deeper)
        namespace = getattr(func, "namespace", "")
        if namespace in ("_c10d_functional", "_dtensor"):
            name = func.__name__.split(".")[0]
            if name in _NOT_COLLECTIVES:
                return
            group_name = args[-1] if args and isinstance(args[-1], str) else kwargs.get("group_name")
            group_size = _group_size(name, args, kwargs, group_name, self.group_dims)
            sent, received = collective_bytes(name, group_size, _nbytes(args[0]), _nbytes(out))
            collective = Collective(name, self.group_dims.get(group_name, (group_name,))[0], group_size, sent,
                                    received)
            for collectives in self.open:
                collectives.append(collective)
            (self.diverting[0] if self.diverting is not None else node.collectives).append(collective)
            return
        formula = FORMULAS.get(packet_of(func))
        if formula is not None:
            node.flops += int(formula(*args, **kwargs, out_val=out))

    @contextlib.contextmanager
    def redistributing(self, local: torch.Tensor, current: Any, target: Any, infos: Any, explicit: bool):
        collectives: list[Collective] = []
        self.learn_mesh(current.mesh)
        self.open.append(collectives)
        result: list = []
        try:
            yield result
        finally:
            self.open.remove(collectives)
        if self.node is None:
            return
        argument = next((i for i, arg in enumerate(self.arguments) if arg is local), None)
        steps = tuple(transform_steps(infos))
        local_bytes = _nbytes(result[0]) if result else 0
        redistribution = Redistribution(argument, tuple(current.placements), tuple(target.placements), steps,
                                        tuple(collectives), explicit, id(local) in self.parameters, local_bytes)
        (self.diverting[1] if self.diverting is not None else self.node.redistributions).append(redistribution)

    @contextlib.contextmanager
    def diverted(self):
        """The collectives and redistributions of the block, kept out of the node's own lists and
        yielded as (collectives, redistributions): FSDP's gather of a group, which the node records
        as the one collective FSDP runs (`gathered`)."""
        saved, self.diverting = self.diverting, ([], [])
        try:
            yield self.diverting
        finally:
            self.diverting = saved

    def gathered(self, gather: ParameterGather) -> None:
        if self.node is None:
            return
        self.node.gathers.append(gather)
        if gather.collective is not None:
            self.node.collectives.append(gather.collective)

    def released(self, gather: ParameterGather, within: bool = False) -> None:
        if self.node is not None:
            (self.node.released_within if within else self.node.released).append(gather)

    def ran_with(self, nbytes: int) -> None:
        if self.node is not None:
            self.node.ran_with += nbytes

    def frees_gather_buffer(self) -> None:
        if self.node is not None:
            self.node.frees_gather_buffer = True

    def observing(self):
        def observe(local, current, target, infos, explicit=False):
            return self.redistributing(local, current, target, infos, explicit)
        return observing_redistributions(observe)

    def finish(self, value: Any) -> NodeSharding:
        node, self.node = self.node, None
        node.outputs = outputs_of(value)
        return node


def outputs_of(value: Any) -> tuple:
    """A `Sharding` for each DTensor of ``value``, None for each plain tensor (`NodeSharding.outputs`)."""
    return tuple(_sharding(tensor) if is_dtensor(tensor) else None for tensor in tensors_in((value,), {}))


def before(first: NodeSharding, then: NodeSharding | None, value: Any) -> NodeSharding:
    """What ran before a node (FSDP's root pre-forward, before the graph's first node) and the node's
    own record, as one record of that node."""
    if then is None:
        return NodeSharding(outputs_of(value), first.redistributions, first.collectives, first.flops, first.gathers,
                            first.released, first.frees_gather_buffer, first.released_within)
    return NodeSharding(then.outputs, first.redistributions + then.redistributions,
                        first.collectives + then.collectives, first.flops + then.flops, first.gathers + then.gathers,
                        first.released + then.released, first.frees_gather_buffer or then.frees_gather_buffer,
                        first.released_within + then.released_within)


def _sharding(value: Any) -> Sharding:
    spec = dtensor_spec_of(value)
    return Sharding(spec.mesh, tuple(spec.placements), tuple(value.shape), tuple(local_tensor_of(value).shape))


def _group_size(name: str, args: tuple, kwargs: dict, group_name: str, known: dict) -> int:
    position = _GROUP_SIZE_ARGUMENT.get(name)
    if position is not None and position < len(args) and isinstance(args[position], int):
        return args[position]
    if group_name in known:
        return known[group_name][1]
    return group_size_of(group_name)


def refuse_unsharded(error: Exception, func: Any, args: tuple, kwargs: dict) -> UnsupportedError:
    """DTensor has no sharding strategy for the op: fxprop cannot answer either."""
    placements = [tuple(dtensor_spec_of(value).placements) for value in tensors_in(args, kwargs) if is_dtensor(value)]
    named = re.search(r"Operator (\S+) does not have a sharding strategy", str(error))
    op = named.group(1) if named else getattr(func, "__name__", func)
    return UnsupportedError(f"{op}: DTensor has no sharding strategy registered for it (its DTensor "
                            f"arguments' placements: {placements}); fxprop takes placements from DTensor only")
