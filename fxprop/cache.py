"""A bounded, thread-safe memo of rule results keyed by target and input signature.

A signature holds everything a rule's result may depend on: for tensors the shape, strides,
storage offset, dtype, logical device, requires_grad and conj/neg bits; for python values
their type and value. Two calls share an entry only when all of it matches.
"""
from __future__ import annotations

import threading
from typing import Any, Hashable

import torch

from .devices import device_of


class Uncacheable(Exception):
    """A value whose identity, not its content, matters; calls on it are not memoized."""


_PLAIN = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout, type(Ellipsis))


def _tensor_signature(value: torch.Tensor) -> Hashable:
    if value.layout is not torch.strided:
        raise Uncacheable
    bits = (value.is_conj(), value.is_neg()) if value.is_complex() else ()
    return (value.shape, value.stride(), value.storage_offset(), value.dtype, device_of(value),
            value.requires_grad, bits)


def _sequence_signature(value: tuple | list) -> Hashable:
    return (type(value), tuple([signature(item) for item in value]))


def _dict_signature(value: dict) -> Hashable:
    return ("dict", tuple([(key, signature(item)) for key, item in value.items()]))


def _set_signature(value: set | frozenset) -> Hashable:
    return ("set", frozenset(signature(item) for item in value))


def _slice_signature(value: slice) -> Hashable:
    return ("slice", signature(value.start), signature(value.stop), signature(value.step))


_BY_TYPE = {tuple: _sequence_signature, list: _sequence_signature, torch.Size: _sequence_signature,
            dict: _dict_signature, set: _set_signature, frozenset: _set_signature, slice: _slice_signature}
_BY_TYPE.update({plain: (lambda value: (type(value), value)) for plain in _PLAIN})


def signature(value: Any) -> Hashable:
    """A hashable summary of everything about ``value`` that a rule's result may depend on."""
    by_type = _BY_TYPE.get(type(value))
    if by_type is not None:
        return by_type(value)
    if isinstance(value, torch.Tensor):
        return _tensor_signature(value)
    for kind, summarize in ((tuple, _sequence_signature), (list, _sequence_signature), (dict, _dict_signature)):
        if isinstance(value, kind):
            return (type(value), summarize(value))
    raise Uncacheable


class RuleCache:
    """A bounded map from call signatures to recorded results; the oldest entries go first.

    First-in-first-out rather than least-recently-used: a hit then costs one hash of its key,
    and the entries a graph keeps hitting (its repeated blocks) are re-added as soon as they
    are evicted.
    """

    def __init__(self, max_entries: int = 8192):
        self.max_entries = max_entries
        self._entries: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            return entry

    def put(self, key: Hashable, entry: Any) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": len(self._entries),
                    "max_entries": self.max_entries}


rule_cache = RuleCache()
