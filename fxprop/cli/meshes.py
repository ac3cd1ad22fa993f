"""``fxprop run ... --mesh dp=8,tp=8 --plan tp``: one rank of a parallelized model, on a simulated mesh.

The model the callable returns is parallelized with torch's own APIs on a simulated mesh
(`fxprop.simulated_mesh`) before it is traced: ``--plan tp`` is the tensor- and sequence-parallel
plan for Llama-style models (`fxprop.distributed.parallel.llama_plan`, on the ``tp`` mesh dim),
and ``MODULE:NAME`` names a plan of your own: a dict for `parallelize_module` (applied on the ``tp``
mesh dim, or on the whole mesh when it has one dim) or a callable ``plan(model, mesh)``. A ``dp``
mesh dim shards every parameter as FSDP does (`fxprop.distributed.parallel.shard_parameters`).
The figures are then the rank's: its local shapes, its memory and FLOPs, its collectives.
"""
from __future__ import annotations

import math
import re
from typing import Any

from torch import nn

from .loading import UsageError, load_callable

_MESH_DIM = re.compile(r"^([A-Za-z_]\w*)=(\d+)$")


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"dp=8,tp=8"`` as ``((8, 8), ("dp", "tp"))``."""
    sizes, names = [], []
    for part in text.split(","):
        matched = _MESH_DIM.match(part.strip())
        if matched is None or int(matched.group(2)) < 1:
            raise ValueError(f"--mesh: {part.strip()!r} is not NAME=SIZE with a positive size (e.g. dp=8,tp=8)")
        if matched.group(1) in names:
            raise ValueError(f"--mesh: the dim {matched.group(1)!r} is given twice")
        names.append(matched.group(1))
        sizes.append(int(matched.group(2)))
    return tuple(sizes), tuple(names)


def check_rank(rank: int, shape: tuple[int, ...]) -> None:
    if not 0 <= rank < math.prod(shape):
        raise UsageError(f"--rank {rank}: the mesh has ranks 0 to {math.prod(shape) - 1}")


def parallelize(model: nn.Module, mesh: Any, plan: str | None) -> nn.Module:
    """``model`` parallelized on ``mesh`` by ``plan`` (see the module's docstring), in place."""
    from torch.distributed.tensor.parallel import parallelize_module
    from ..distributed import parallel
    names = mesh.mesh_dim_names or ()
    if plan == "tp":
        if "tp" not in names:
            raise UsageError("--plan tp shards on a mesh dim named tp: give e.g. --mesh dp=8,tp=8")
        layers = getattr(model, "layers", None)
        if not isinstance(layers, (nn.ModuleList, nn.Sequential)):
            raise UsageError(f"--plan tp is the plan for Llama-style models (a .layers list, as "
                             f"fxprop.examples.Llama has); {type(model).__name__} has none: give --plan MODULE:NAME")
        parallelize_module(model, mesh["tp"], parallel.llama_plan(len(layers)))
    elif plan is not None:
        found = load_callable(plan)
        if isinstance(found, dict):
            parallelize_module(model, mesh["tp"] if "tp" in names else mesh, found)
        elif callable(found):
            model = found(model, mesh) or model
        else:
            raise UsageError(f"--plan {plan} is a {type(found).__name__}: give a parallelize_module plan (a dict) "
                             "or a callable plan(model, mesh)")
    if "dp" in names:
        parallel.shard_parameters(model, mesh, "dp")
    return model


def trace(model: nn.Module):
    from ..distributed import parallel
    return parallel.trace(model)
