"""The values fxprop knows of a propagation's tensors: real inputs and constants the user gave.

A meta tensor stands for a real one whose values are known (small integer tensors, 0-dim
numbers): rules read them to check indices and answer ``.item()``. A known value holds only
while the tensor is unchanged: an in-place op on it, or on a view of it, bumps the version
counter it shares with its views; a swap of its data (``t.data = other``) changes its storage;
and any op that writes a tensor sharing its storage (a ``.data`` view, a library op's
``Tensor(a!)`` argument) forgets it. From then on its values are not known (a later ``.item()``
is a symbol, not the stale number). Real tensors given that share a storage (one mask passed
as two arguments) are known until a write through either: it would change the other. Values also
flow: an op whose every input is known computes known results (`fxprop.engine.value_flow`), what it
writes included.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..torch_compat import storage_key, version_counter


class _Known(NamedTuple):
    meta: torch.Tensor   # kept, so that its id is not reused by another tensor while the run lasts
    real: torch.Tensor
    version: int
    real_storage: int
    layout: tuple        # the meta tensor's storage, sizes, strides and offset: ``t.data = other`` swaps them


_SETTLED_BY_ITS_READER = -2  # a version no tensor has: the entry takes the one its next reader finds


def _layout(tensor: torch.Tensor) -> tuple:
    return storage_key(tensor), tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()


def has_no_values(tensor: torch.Tensor) -> bool:
    """An empty tensor of concrete sizes: there is nothing about its values not to know."""
    return not any(isinstance(size, torch.SymInt) for size in tensor.shape) and tensor.numel() == 0


def _forgotten(entry: _Known) -> _Known:
    """The entry with a version no tensor has: its values are not known any more."""
    return _Known(entry.meta, entry.real, -1, entry.real_storage, entry.layout)


class KnownValues:
    def __init__(self) -> None:
        self._entries: dict[int, _Known] = {}

    def remember(self, meta: torch.Tensor, real: torch.Tensor) -> None:
        """``meta`` stands for ``real`` as it is now (the first time it is told: a constant read
        again after the graph wrote it is not the value it had)."""
        entry = self._entries.get(id(meta))
        if entry is not None and entry.meta is meta:
            return
        self._entries[id(meta)] = _Known(meta, real, version_counter(meta), storage_key(real), _layout(meta))

    def learn(self, meta: torch.Tensor, real: torch.Tensor) -> None:
        """``meta`` now holds ``real``'s values, whatever was known of it before: the op that is still
        running computed them (`fxprop.engine.value_flow`). ``real`` is fxprop's own tensor, shared with
        nothing else. Autograd settles ``meta``'s version counter once the op returns (an in-place op
        bumps it, a view takes its base's), so the entry takes the version its next reader finds;
        a write before that reaches the dispatch, which forgets the entry."""
        self._entries[id(meta)] = _Known(meta, real, _SETTLED_BY_ITS_READER, storage_key(real), _layout(meta))

    def forget_written(self, written: torch.Tensor) -> None:
        """An op writes ``written``: nothing sharing its storage is known any more, nor anything whose
        real tensor shares a storage with theirs (the same tensor given twice)."""
        key = storage_key(written)
        real_storages = {entry.real_storage for entry in self._entries.values() if storage_key(entry.meta) == key}
        for entry_key, entry in list(self._entries.items()):
            if storage_key(entry.meta) == key or entry.real_storage in real_storages:
                self._entries[entry_key] = _forgotten(entry)

    def get(self, meta: torch.Tensor) -> torch.Tensor | None:
        """The real values ``meta`` stands for, unless it has been written since."""
        entry = self._entries.get(id(meta))
        if entry is not None and entry.version == _SETTLED_BY_ITS_READER and entry.meta is meta:
            entry = self._entries[id(meta)] = _Known(meta, entry.real, version_counter(meta), entry.real_storage,
                                                     entry.layout)
        if (entry is None or entry.meta is not meta or version_counter(meta) != entry.version
                or _layout(meta) != entry.layout):
            return None
        return entry.real

    def __contains__(self, meta: object) -> bool:
        return isinstance(meta, torch.Tensor) and self.get(meta) is not None

    def __bool__(self) -> bool:
        return bool(self._entries)
