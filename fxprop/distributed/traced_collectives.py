"""The functional collectives of a propagated graph of plain tensors, as one rank runs them.

A step traced on a rank's local tensors (`fxprop.estimate.traced_step` of a model with DTensor
parameters) holds DTensor's collectives as ``_c10d_functional`` nodes, which name their process
group, and the in-place ``c10d`` collectives the model calls itself (``dist.all_reduce``:
transformers' tensor-parallel layers without gradients), which hold it. `collectives_in` reads
each from its node's annotations: its kind (an in-place one by the functional name of what it
does), the mesh dim of its group, the group's size, and the bytes the rank sends and receives
(`fxprop.distributed.dtensors.collective_bytes`); `fxprop.distributed.dtensors.tally` sums them
by kind as `fxprop.estimate` does for DTensor graphs.
"""
from __future__ import annotations

from typing import Any

import torch.fx

from ..errors import UnsupportedError
from ..torch_compat import group_name_of, process_group_of
from .dtensors import Collective, collective_bytes

_NOT_COLLECTIVES = frozenset({"wait_tensor"})
_IN_PLACE = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather_into_tensor",
             "_reduce_scatter_base_": "reduce_scatter_tensor", "broadcast_": "broadcast"}
"""The in-place ``c10d`` collectives of a single tensor (or a list of them) read, by the functional name."""


def mesh_groups(mesh: Any) -> dict[str, tuple[Any, int]]:
    """{process group name: (mesh dim name, its size)} for every dim of ``mesh``."""
    names = mesh.mesh_dim_names or tuple(range(mesh.ndim))
    return {group_name_of(mesh.get_group(dim)): (names[dim], mesh.size(dim)) for dim in range(mesh.ndim)}


def collectives_in(gm: torch.fx.GraphModule, groups: dict[str, tuple[Any, int]]) -> list[Collective]:
    """Every functional collective of ``gm`` (propagated), in node order; ``groups`` from `mesh_groups`."""
    found = []
    for node in gm.graph.nodes:
        namespace = getattr(node.target, "namespace", "") if node.op == "call_function" else ""
        if namespace not in ("_c10d_functional", "c10d"):
            continue
        name = node.target.__name__.split(".")[0]
        if name in _NOT_COLLECTIVES:
            continue
        if namespace == "c10d":
            if name not in _IN_PLACE:
                raise UnsupportedError(f"%{node.name}: fxprop does not read the c10d collective {name} "
                                       f"(it reads {', '.join(sorted(_IN_PLACE))} and the functional collectives)")
            kind, group_name = _IN_PLACE[name], group_name_of(process_group_of(getattr(gm, node.args[1].target)))
            output = node.args[0]  # in place: the input is the output
        else:
            kind, output = name, node
            group_name = node.args[-1] if isinstance(node.args[-1], str) else node.kwargs["group_name"]
        if group_name not in groups:
            raise UnsupportedError(f"%{node.name} ({kind}) runs on the process group {group_name!r}, "
                                   "which is no mesh dim's")
        dim, size = groups[group_name]
        sent, received = collective_bytes(kind, size, _bytes(node.args[0]), _bytes(output))
        found.append(Collective(kind, dim, size, sent, received))
    return found


def _bytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_bytes(item) for item in value)
    tensor = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    if isinstance(tensor, (list, tuple)):
        return sum(_bytes(item) for item in tensor)
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
