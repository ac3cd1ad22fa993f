"""A disagreement between fxprop and the values it is compared with, and how it is reported."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..resolve.registry import target_name


@dataclass(frozen=True)
class Mismatch:
    """One field of one node where fxprop and real execution disagree."""
    node: str
    op: str
    field: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        return f"%{self.node} ({self.op}): {self.field} expected {self.expected}, got {self.got}"


def render_mismatches(mismatches: list[Mismatch]) -> str:
    return ("fxprop disagrees with real execution on "
            f"{len(mismatches)} value(s):\n" + "\n".join(f"  {m}" for m in mismatches))


def op_label(node: torch.fx.Node) -> str:
    if node.op in ("call_function", "call_method"):
        return target_name(node.target)
    return f"{node.op} {node.target}"


def shape_of(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def paired_items(expected: Any, got: Any, out: list, node: str, op: str, path: str) -> list[tuple[str, Any, Any]]:
    """The items of two sequences side by side, each with its path (``[0]``, ``[1]``), to compare
    one by one; none, with a structure mismatch recorded, when ``got`` is not a sequence as long."""
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        out.append(Mismatch(node, op, f"structure{path}", shape_of(expected), shape_of(got)))
        return []
    return [(f"{path}[{i}]", e, g) for i, (e, g) in enumerate(zip(expected, got))]
