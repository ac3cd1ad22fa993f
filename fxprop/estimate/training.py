"""The backward part of a training graph, and what its forward part saves for it.

A node belongs to the backward part when torch tagged it so (``partitioner_tag ==
"is_backward"`` in AOT autograd's joint graphs, ``autograd_backward`` in graphs traced under
`torch.fx.traceback.preserve_node_meta`). An untagged graph's backward part is every node from
the gradient seed on, in node order: the first node that uses a ``tangents_*`` placeholder,
or the ``ones_like`` of a 0-dim tensor that ``torch.autograd.grad`` creates for a scalar loss
(`make_fx` of a function that calls it); ``backward_from`` names that first node instead.

The *bytes saved for backward* are the distinct storages that forward nodes created (not
inputs, parameters or buffers) and that some backward node reads; reading only a value's
metadata (``ones_like(loss)``, ``sym_size``) does not count.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.fx

aten = torch.ops.aten

_METADATA_READERS = frozenset({
    aten.ones_like.default, aten.zeros_like.default, aten.empty_like.default, aten.full_like.default,
    aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
    aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.sym_storage_offset.default})


def backward_nodes(gm: torch.fx.GraphModule, backward_from: str | torch.fx.Node | None = None) -> set[torch.fx.Node]:
    """The nodes of the backward part of ``gm`` (empty for a graph without one)."""
    nodes = list(gm.graph.nodes)
    if backward_from is not None:
        name = backward_from.name if isinstance(backward_from, torch.fx.Node) else backward_from
        starts = [i for i, node in enumerate(nodes) if node.name == name]
        if not starts:
            from ..errors import InputError
            raise InputError(f"backward_from: the graph has no node {name!r}")
        return _from(nodes, starts[0])
    tagged = {node for node in nodes if node.op != "output" and (
        node.meta.get("partitioner_tag") == "is_backward" or node.meta.get("autograd_backward"))}
    if tagged:
        return {node for node in tagged if node.op != "placeholder"}
    for index, node in enumerate(nodes):
        if _is_seed(node):
            return _from(nodes, index)
    return set()


def _from(nodes: list[torch.fx.Node], start: int) -> set[torch.fx.Node]:
    return {node for node in nodes[start:] if node.op not in ("placeholder", "get_attr", "output")}


def _is_seed(node: torch.fx.Node) -> bool:
    if node.op == "placeholder":
        return False
    if any(used.op == "placeholder" and str(used.target).startswith("tangents") for used in node.all_input_nodes):
        return True
    if node.op == "call_function" and node.target is aten.ones_like.default and node.args:
        value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return isinstance(value, torch.Tensor) and value.dim() == 0
    return False


def saved_for_backward(gm: torch.fx.GraphModule, backward: set[torch.fx.Node], keys_of: dict,
                       resident: set) -> tuple[list[str], list]:
    """Forward nodes read by the backward part, and the storages they created that it reads."""
    saved_nodes, saved_keys = [], []
    for node in gm.graph.nodes:
        if node in backward or node.op in ("placeholder", "get_attr", "output"):
            continue
        if any(user in backward and user.target not in _METADATA_READERS for user in node.users):
            keys = [key for key in keys_of[node] if key not in resident]
            if keys:
                saved_nodes.append(node.name)
                saved_keys.extend(keys)
    return saved_nodes, list(dict.fromkeys(saved_keys))


def saved_outputs(gm: torch.fx.GraphModule, forward_outputs: int, keys_of: dict, resident: set) -> list:
    """For a partitioned forward graph: the storages of its outputs after the first ``forward_outputs``."""
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    returned = output.args[0]
    items: Iterable = returned if isinstance(returned, (tuple, list)) else (returned,)
    keys = []
    for item in list(items)[forward_outputs:]:
        if isinstance(item, torch.fx.Node):
            keys.extend(key for key in keys_of[item] if key not in resident)
    return list(dict.fromkeys(keys))
