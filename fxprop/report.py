"""Plain-text tables of annotated nodes."""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx


def describe_value(value: Any) -> tuple[str, str, str]:
    """(shape, dtype, device) columns for a node's ``meta["val"]``."""
    if isinstance(value, torch.Tensor):
        return (str(tuple(value.shape)), str(value.dtype).removeprefix("torch."), str(value.device))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        parts = [describe_value(v) for v in value]
        return tuple(" | ".join(p[i] for p in parts) for i in range(3))  # type: ignore[return-value]
    text = repr(value)
    return (text if len(text) <= 40 else text[:37] + "...", "", "")


def node_rows(gm: torch.fx.GraphModule) -> list[tuple[str, ...]]:
    rows = []
    for node in gm.graph.nodes:
        provenance = node.meta.get("fxprop")
        shape, dtype, device = describe_value(node.meta.get("val"))
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        rows.append((node.name, f"{node.op}:{target}" if node.op.startswith("call") else node.op,
                     provenance.kind if provenance else "", shape, dtype, device))
    return rows


def format_table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    rows = list(rows)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)])


NODE_HEADER = ("node", "op", "rule kind", "shape", "dtype", "device")
