"""FSDP2's forward hooks (`fully_shard`), emulated in DTensor terms while a graph propagates.

`fully_shard` registers a forward pre-hook that all-gathers its module's parameter groups and a
forward hook that lets the gathered parameters go. Run inside a propagation, they would
initialize FSDP's state, call c10d and change the user's module, so fxprop never runs them: on
each shadow of an FSDP module (`fxprop.engine.module_state`) they are replaced, in their place
among the module's hooks, by hooks that do what FSDP does, on the shadows, read from FSDP's own
state (`fxprop.torch_compat.fsdp_states`):

- before the module runs, each of its groups not gathered yet is gathered: every sharded
  parameter (cast first to the policy's ``param_dtype``, as FSDP casts its all-gather input) is
  redistributed to ``Replicate()`` on FSDP's mesh dim (DTensor's planner chooses the all-gather)
  and set on the shadows of its modules as FSDP sets the unsharded parameter: a plain tensor, or
  a DTensor on the tensor-parallel mesh (`fxprop.distributed.parallel.drop_dim`). The group is
  recorded as FSDP runs it, one all-gather for all its parameters (`ParameterGather`);
  floating inputs are cast to ``param_dtype`` where the policy asks;
- after it, a group FSDP reshards after forward gets its sharded parameters back; a root keeps
  its own (``reshard_after_forward=None``), and its forward's end lets FSDP's last all-gather
  output go; floating outputs are cast to ``output_dtype`` where the policy asks.

The FSDP module the graph was traced from (the root: `fxprop.distributed.parallel.trace` traces
its forward, not its hooks) has its groups gathered before the graph's first node, as its
pre-hook gathers them before its forward. Its own input and output casts are not emulated.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

import torch
from torch import nn

from ..devices import device_of, tag
from ..errors import InputError, PropagationError, UnsupportedError
from ..torch_compat import (FsdpGroup, FsdpParameter, FsdpState, forward_hook_dicts, fsdp_states, local_tensor_of,
                            own_state, pytree, storage_key)
from .dtensors import Collective, ParameterGather, collective_bytes, is_dtensor
from .parallel import drop_dim


class FsdpEmulation:
    """FSDP's forward hooks for one propagation: ``view`` is its `StateView` (the shadows and the
    stand-ins of the parameters), ``recorder`` its `ShardingRecorder`."""

    def __init__(self, states: list[FsdpState], held: set[int], view: Any, recorder: Any):
        self.view = view
        self.recorder = recorder
        self.by_module = {id(module): state for state in states for module in state.modules}
        self.roots = {id(state) for state in states if _is_root(state, states, held)}
        self.traced = [state for state in states if not any(id(module) in held for module in state.modules)]
        self.gathered: dict[int, ParameterGather | None] = {  # by group: its gather (None: gathered before)
            id(group): None for state in states for group in state.groups if group.unsharded}
        self.to_run: dict[int, set[int]] = {}  # a grouped fully_shard([a, b]): its modules yet to run
        self.running = 0  # FSDP modules whose forward has begun and not ended (nested ones inside a node's)

    @classmethod
    def for_graph(cls, gm: torch.fx.GraphModule, view: Any, recorder: Any) -> FsdpEmulation | None:
        """The emulation of the FSDP states whose modules or parameters ``gm`` holds; None if none."""
        held = {id(module) for module in gm.modules()}
        alive = fsdp_states()
        states = [state for state in alive if any(id(module) in held for module in state.modules)
                  or any(id(owner) in held for group in state.groups for parameter in group.parameters
                         for owner, _ in parameter.owners) or _traced_from(gm, state)]
        if not states:
            return None
        for state in states:
            _check_supported(state)
        emulation = cls(states, held, view, recorder)
        for state in states:
            if id(state) in emulation.roots and state.is_root is None:
                _check_lazy_init(state, alive)
        return emulation

    # --- hooks -------------------------------------------------------------------------------

    def adjust_shadow(self, module: nn.Module, shadow: nn.Module) -> None:
        """Replace FSDP's hooks on a shadow of one of its modules by their emulation."""
        state = self.by_module.get(id(module))
        if state is None:
            return
        pre_hooks, post_hooks = forward_hook_dicts(shadow)
        for hook_id in state.pre_hook_ids & pre_hooks.keys():
            pre_hooks[hook_id] = functools.partial(self.pre_forward, state, module)
        for hook_id in state.post_hook_ids & post_hooks.keys():
            post_hooks[hook_id] = functools.partial(self.post_forward, state, module)

    def before_graph(self, inputs: list) -> list:
        """The pre-forward of the FSDP modules the graph was traced from (its root): the graph's
        inputs, cast as it casts its forward's arguments."""
        for state in self.traced:
            if state.cast_forward_inputs and state.param_dtype is not None:
                inputs = _cast_floating(inputs, state.param_dtype)
            for group in state.groups:
                self.gather(group, state)
        return inputs

    def pre_forward(self, state: FsdpState, module: nn.Module, shadow: nn.Module, args: tuple,
                    kwargs: dict) -> tuple[tuple, dict]:
        if state.cast_forward_inputs and state.param_dtype is not None:
            given = (args, kwargs)
            args, kwargs = _cast_floating(given, state.param_dtype)
            if not self.running:  # the node's own module runs with the casts beside its inputs
                self.recorder.ran_with(_storage_bytes((given, args, kwargs)) - _storage_bytes(given))
        if len(state.modules) > 1 and not self.to_run.get(id(state)):
            self.to_run[id(state)] = {id(m) for m in state.modules}
        for group in state.groups:
            self.gather(group, state)
        self.running += 1
        return args, kwargs

    def post_forward(self, state: FsdpState, module: nn.Module, shadow: nn.Module, args: Any, output: Any) -> Any:
        self.running -= 1
        remaining = self.to_run.get(id(state))
        if remaining is not None:
            remaining.discard(id(module))
        if not remaining:  # a grouped state's forward ends with the last of its modules
            for group in state.groups:
                if self.reshards(group, state):
                    self.release(group, within=self.running > 0)
            if id(state) in self.roots:
                self.recorder.frees_gather_buffer()
        if state.output_dtype is None:
            return output
        cast = _cast_floating(output, state.output_dtype)
        if not self.running:  # the node's own module ran with its output as it made it, not the cast
            self.recorder.ran_with(_storage_bytes(output) - _storage_bytes(cast))
        return cast

    def reshards(self, group: FsdpGroup, state: FsdpState) -> bool:
        if id(state) in self.roots and state.auto_reshard_after_forward:
            return False  # FSDP's lazy initialization keeps a root's parameters gathered
        return bool(group.reshard_after_forward)

    # --- the gather --------------------------------------------------------------------------

    def gather(self, group: FsdpGroup, state: FsdpState) -> None:
        if id(group) in self.gathered:
            return
        dtypes = []
        with self.recorder.diverted() as (collectives, redistributions):
            for parameter in group.parameters:
                unsharded, dtype = self.unshard(parameter, group, state.param_dtype)
                dtypes.append(dtype)
                self.set_on_owners(parameter, unsharded)
        gather = self.gathered[id(group)] = self.record(group, state, dtypes, collectives, redistributions)
        self.recorder.gathered(gather)

    def unshard(self, parameter: FsdpParameter, group: FsdpGroup, param_dtype: torch.dtype | None) -> tuple:
        """The unsharded parameter, as FSDP registers it while its module runs, and its dtype."""
        from torch.distributed.tensor import Replicate
        sharded = self.view.tensor(parameter.sharded)
        if param_dtype is not None and sharded.dtype.is_floating_point and sharded.dtype != param_dtype:
            sharded = sharded.to(param_dtype)
        placements = list(sharded.placements)
        placements[group.shard_dim] = Replicate()
        gathered = sharded.redistribute(sharded.device_mesh, placements)
        unsharded = drop_dim(gathered, parameter.unsharded_mesh, group.shard_dim)
        device = device_of(local_tensor_of(sharded))
        if is_dtensor(unsharded):
            tag(local_tensor_of(unsharded), device)
        return tag(unsharded, device), sharded.dtype

    def release(self, group: FsdpGroup, within: bool = False) -> None:
        """Reshard ``group``: after the node's module ran, or ``within`` it (a nested module's)."""
        gather = self.gathered.pop(id(group), None)
        if gather is not None:
            self.recorder.released(gather, within)
        for parameter in group.parameters:
            self.set_on_owners(parameter, self.view.tensor(parameter.sharded))

    def set_on_owners(self, parameter: FsdpParameter, value: Any) -> None:
        self.view.registered[id(parameter.sharded)] = value  # the graph's own get_attr of it (a root's parameter)
        for owner, name in parameter.owners:
            own_state(self.view.shadow(owner))[0][name] = value

    def record(self, group: FsdpGroup, state: FsdpState, dtypes: list, collectives: list,
               redistributions: list) -> ParameterGather:
        """The group's gather as FSDP runs it: one all-gather of the padded shards of all its
        parameters, into one buffer, copied out into one unsharded storage per parameter."""
        kinds = {collective.kind for collective in collectives}
        names = tuple(name for parameter in group.parameters for _, name in parameter.owners[:1])
        module = type(state.modules[0]).__name__
        if kinds - {"all_gather_into_tensor"}:
            raise UnsupportedError(f"fully_shard: DTensor's planner gathers the parameters {names} of {module} "
                                   f"with {sorted(kinds)}, where FSDP runs one all-gather; fxprop takes "
                                   "collectives from DTensor only")
        sharded = self.view.tensor(group.parameters[0].sharded)
        ranks = sharded.device_mesh.size(group.shard_dim)
        shard_bytes = sum(parameter.padded_numel * dtype.itemsize for parameter, dtype in zip(group.parameters, dtypes))
        collective = None
        if ranks > 1:
            mesh_dim = collectives[0].mesh_dim if collectives else _dim_name(sharded.device_mesh, group.shard_dim)
            collective = Collective("all_gather_into_tensor", mesh_dim, ranks,
                                    *collective_bytes("all_gather_into_tensor", ranks, shard_bytes, shard_bytes * ranks))
        device = str(device_of(local_tensor_of(sharded)))
        return ParameterGather(module, names, tuple(redistributions), collective, shard_bytes * ranks,
                               shard_bytes * ranks if ranks > 1 else 0, device, self.reshards(group, state))


def _is_root(state: FsdpState, states: list[FsdpState], held: set[int]) -> bool:
    """As FSDP's lazy initialization decides: the first FSDP module to run forward is the root of
    the FSDP modules under it. The graph's own module (traced, not one the graph holds) runs
    first; without one, each FSDP module the graph holds that no other one holds."""
    if state.is_root is not None:
        return state.is_root
    if not any(id(module) in held for module in state.modules):
        return True
    return not any(other is not state and _holds(other, state) for other in states)


def _traced_from(gm: torch.fx.GraphModule, state: FsdpState) -> bool:
    """Whether ``gm`` was traced from the state's module: every module and attribute the graph
    reaches is the one the module has at that path."""
    targets = [str(node.target) for node in gm.graph.nodes if node.op in ("call_module", "get_attr")]
    if len(state.modules) != 1 or not targets:
        return False
    return all(_at(state.modules[0], target) is _at(gm, target) for target in targets)


def _at(root: nn.Module, path: str) -> Any:
    try:
        return operator.attrgetter(path)(root)
    except AttributeError:
        return _MISSING


_MISSING = object()


def _holds(outer: FsdpState, inner: FsdpState) -> bool:
    below = {id(module) for top in outer.modules for module in top.modules()}
    return any(id(module) in below for module in inner.modules)


def _check_lazy_init(root: FsdpState, alive: list[FsdpState]) -> None:
    """What FSDP's lazy initialization refuses as its root's forward begins, refused as the model's
    error (real execution raises it there)."""
    if len(root.modules) > 1:
        raise PropagationError(f"fully_shard: FSDP requires a single root module, but the first FSDP module to run "
                               f"is a grouped fully_shard of {len(root.modules)} modules "
                               f"({', '.join(type(module).__name__ for module in root.modules)})",
                               error_type=RuntimeError)
    below = [state for state in alive if state is not root and _holds(root, state)]
    for state in below:
        if state.is_root is not None:
            raise PropagationError(f"fully_shard: FSDP's state of {type(state.modules[0]).__name__} inside "
                                   f"{type(root.modules[0]).__name__} is already lazily initialized (a forward "
                                   "of it ran on its own): FSDP requires running forward through the root "
                                   "module first", error_type=RuntimeError)
    seen: set[int] = set()
    for state in [root, *below]:
        for parameter in (parameter for group in state.groups for parameter in group.parameters):
            if parameter.origin in seen:
                owner, name = parameter.owners[0]
                raise PropagationError(f"fully_shard: parameter {name!r} of {type(owner).__name__} is shared with "
                                       "a parameter another FSDP group manages (tied parameters belong in one "
                                       "group: fully_shard([module_a, module_b]))", error_type=ValueError)
            seen.add(parameter.origin)


def _check_supported(state: FsdpState) -> None:
    name = type(state.modules[0]).__name__
    if state.spmd_mesh:
        raise UnsupportedError(f"fully_shard of {name} with dp_mesh_dims (FSDP on dims of a full SPMD mesh) is not "
                               "emulated")
    for group in state.groups:
        if group.released:
            raise InputError(f"fully_shard of {name}: its mesh's process group was destroyed (the simulated mesh it "
                             "was sharded on was released); propagate inside the mesh_simulation that made it")
        if group.shard_dim is None:
            raise UnsupportedError(f"{name}: a data-parallel state that does not shard its parameters (replicate) "
                                   "is not emulated")
        if not isinstance(group.reshard_after_forward, bool):
            raise UnsupportedError(f"fully_shard of {name} with reshard_after_forward={group.reshard_after_forward} "
                                   "(resharding onto a smaller mesh after forward) is not emulated")
        for parameter in group.parameters:
            ndim = parameter.sharded.device_mesh.ndim
            if parameter.unsharded_mesh is not None and parameter.unsharded_mesh.ndim != ndim - 1:
                raise UnsupportedError(f"fully_shard of {name}: a parameter on a {ndim}-dim mesh whose unsharded "
                                       f"form is on a {parameter.unsharded_mesh.ndim}-dim mesh (HSDP with tensor "
                                       "parallelism) is not emulated")


def _dim_name(mesh: Any, dim: int) -> Any:
    return mesh.mesh_dim_names[dim] if mesh.mesh_dim_names else dim


def _storage_bytes(tree: Any) -> int:
    """Bytes of the distinct local storages of the tensors in ``tree``."""
    storages = {storage_key(local): local.untyped_storage().nbytes()
                for local in (local_tensor_of(value) if is_dtensor(value) else value
                              for value in pytree.tree_leaves(tree) if isinstance(value, torch.Tensor))}
    return sum(storages.values())


def _cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    """Floating tensors of ``tree`` cast to ``dtype``, as FSDP casts its modules' inputs and
    outputs, each on the logical device it was on (a local tensor too)."""
    def cast(value: torch.Tensor) -> torch.Tensor:
        if not torch.is_floating_point(value) or value.dtype == dtype:
            return value
        result = value.to(dtype)
        if is_dtensor(result):
            tag(local_tensor_of(result), device_of(local_tensor_of(value)))
        return tag(result, device_of(value))
    return pytree.tree_map_only(torch.Tensor, cast, tree)
