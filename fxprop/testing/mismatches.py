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
