"""Simulated device meshes: a torch `DeviceMesh` of any number of ranks in this one process.

    mesh = fxprop.simulated_mesh((8, 8), ("dp", "tp"))     # a mesh of 64 simulated GPUs
    model = parallelize_module(model_on_meta, mesh["tp"], plan)
    ...
    fxprop.release_simulated_mesh()

or, released on the way out of the block::

    with fxprop.mesh_simulation((2, 4, 8), ("pp", "dp", "tp")) as mesh:
        ...

The mesh is torch's own, over torch's fake process group (a ``FakeProcessGroup``: each
collective completes at once on this process, as it would for the simulated rank, and moves no
data), so torch's APIs (``parallelize_module``, ``distribute_tensor``, ``torch.compile`` of the
result) take it as they take a real one. ``device_type="cuda"`` needs no GPU: with the fake
backend, DeviceMesh selects no device (torch's cross-compilation mode).

One simulated world at a time: the default process group this module made, of ``prod(shape)``
ranks. A second mesh with as many ranks (another shape, other names) shares it; one with
another number of ranks replaces it, unless a `mesh_simulation` block still uses it. A default
process group fxprop did not make is never used, replaced or destroyed: `simulated_mesh`
refuses to run beside it.
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..errors import InputError
from ..torch_compat import distributed_available, forget_dtensor_caches, register_fake_process_group_backend


@dataclass
class _World:
    group: Any  # the default ProcessGroup this module made
    size: int
    rank: int
    blocks: int = 0  # open mesh_simulation blocks using it


_lock = threading.RLock()
_world: _World | None = None


def simulated_mesh(shape: int | Sequence[int], names: Sequence[str] | None = None, device_type: str = "cuda", *,
                   rank: int = 0) -> Any:
    """A torch `DeviceMesh` of ``shape`` over a simulated process group of ``prod(shape)`` ranks.

    ``names`` names the mesh's dims (``mesh["tp"]`` slices one); ``device_type`` is the device
    the mesh stands for ("cuda" by default; no GPU is needed). ``rank`` is the rank this process
    plays: local shards (an uneven split gives the last ranks less) are that rank's. The
    simulated process group stays until `release_simulated_mesh` (or a mesh with another
    number of ranks replaces it).

    >>> import fxprop
    >>> mesh = fxprop.simulated_mesh((2, 4), ("dp", "tp"))
    >>> mesh.shape, mesh["tp"].size(), mesh.get_coordinate()
    ((2, 4), 4, (0, 0))
    >>> fxprop.release_simulated_mesh()
    True
    """
    shape, names = _checked(shape, names, device_type, rank)
    with _lock:
        _ensure_world(math.prod(shape), rank)
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh(device_type, shape, mesh_dim_names=names)


def release_simulated_mesh() -> bool:
    """Destroy the simulated process group (and every group of its meshes); its meshes stop
    working. Returns whether there was one to release. A default process group fxprop did not
    make is left alone."""
    global _world
    with _lock:
        world, _world = _world, None
        if world is None or not distributed_available():
            return False
        import torch.distributed as dist
        if not dist.is_initialized() or dist.group.WORLD is not world.group:
            return False  # already destroyed, and perhaps replaced by the user's own
        dist.destroy_process_group()
        forget_dtensor_caches()
        return True


@contextlib.contextmanager
def mesh_simulation(shape: int | Sequence[int], names: Sequence[str] | None = None, device_type: str = "cuda", *,
                    rank: int = 0) -> Iterator[Any]:
    """`simulated_mesh` for the length of a ``with`` block: the simulated process group is released
    on the way out, unless it was there before the block (an outer block's, or a plain
    `simulated_mesh`'s)."""
    with _lock:
        before = _world
        mesh = simulated_mesh(shape, names, device_type, rank=rank)
        world = _world
        made_here = world is not before
        world.blocks += 1
    try:
        yield mesh
    finally:
        with _lock:
            world.blocks -= 1
            if made_here and _world is world and world.blocks == 0:
                release_simulated_mesh()


def _ensure_world(size: int, rank: int) -> None:
    global _world
    import torch.distributed as dist
    if _world is not None and not (dist.is_initialized() and dist.group.WORLD is _world.group):
        _world = None  # destroyed behind our back
    if _world is not None:
        if (_world.size, _world.rank) == (size, rank):
            return
        if _world.blocks:
            raise InputError(f"simulated_mesh: a mesh_simulation block still uses the simulated world of "
                             f"{_world.size} ranks (as rank {_world.rank}); a world of {size} ranks (as rank {rank}) "
                             "can only replace it after the block")
        release_simulated_mesh()
    if dist.is_initialized():
        group = dist.group.WORLD
        raise InputError(f"simulated_mesh: a default process group fxprop did not make already exists (backend "
                         f"{dist.get_backend(group)!r}, {dist.get_world_size(group)} ranks); fxprop never uses, "
                         "replaces or destroys it: call torch.distributed.destroy_process_group() first, or build "
                         "the mesh on it with torch.distributed.device_mesh.init_device_mesh")
    register_fake_process_group_backend()
    forget_dtensor_caches()
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=size)
    _world = _World(dist.group.WORLD, size, rank)


def _checked(shape: Any, names: Any, device_type: Any, rank: Any) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    if not distributed_available():
        raise InputError("simulated_mesh: this torch build has no torch.distributed")
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, Sequence) or not dims or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise InputError(f"simulated_mesh: shape must be a positive int or a non-empty sequence of them, got {shape!r}")
    dims = tuple(dims)
    if names is not None:
        if isinstance(names, str) or not isinstance(names, Sequence) or \
                not all(isinstance(name, str) for name in names):
            raise InputError(f"simulated_mesh: names must be a sequence of strings, got {names!r}")
        names = tuple(names)
        if len(names) != len(dims) or len(set(names)) != len(names):
            raise InputError(f"simulated_mesh: names must name each of the {len(dims)} dims of shape {dims} once, "
                             f"got {names!r}")
    if not isinstance(device_type, str) or not device_type:
        raise InputError(f"simulated_mesh: device_type must be a device type such as 'cuda' or 'cpu', "
                         f"got {device_type!r}")
    try:
        torch.device(device_type)
    except RuntimeError as error:
        raise InputError(f"simulated_mesh: unknown device_type {device_type!r}: {error}") from None
    size = math.prod(dims)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise InputError(f"simulated_mesh: rank must be an int in [0, {size}) for shape {dims}, got {rank!r}")
    return dims, names
