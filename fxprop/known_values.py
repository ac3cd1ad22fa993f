"""The values fxprop knows of a propagation's tensors: real inputs and constants the user gave.

A meta tensor stands for a real one whose values are known (small integer tensors, 0-dim
numbers): rules read them to check indices and answer ``.item()``. A known value holds only
while the tensor is unchanged: an in-place op on it, or on a view of it, bumps the version
counter it shares with its views, and from then on its values are not known (a later
``.item()`` is a symbol, not the stale number).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .torch_compat import version_counter


class _Known(NamedTuple):
    meta: torch.Tensor   # kept, so that its id is not reused by another tensor while the run lasts
    real: torch.Tensor
    version: int


class KnownValues:
    def __init__(self) -> None:
        self._entries: dict[int, _Known] = {}

    def remember(self, meta: torch.Tensor, real: torch.Tensor) -> None:
        """``meta`` stands for ``real`` as it is now (the first time it is told: a constant read
        again after the graph wrote it is not the value it had)."""
        entry = self._entries.get(id(meta))
        if entry is None or entry.meta is not meta:
            self._entries[id(meta)] = _Known(meta, real, version_counter(meta))

    def get(self, meta: torch.Tensor) -> torch.Tensor | None:
        """The real values ``meta`` stands for, unless it has been written since."""
        entry = self._entries.get(id(meta))
        if entry is None or entry.meta is not meta or version_counter(meta) != entry.version:
            return None
        return entry.real

    def __contains__(self, meta: object) -> bool:
        return isinstance(meta, torch.Tensor) and self.get(meta) is not None

    def __bool__(self) -> bool:
        return bool(self._entries)
