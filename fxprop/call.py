"""One call of an op, function, method or module, and the facts read from its arguments once.

A node's call passes through the memo (its key, the inputs a hit aliases), the resolution (the
turns that depend on the values: empty inputs, symbolic sizes, known values), the device
placement and, for each aten op it reaches, fxprop's dispatch (known values in and out). Each
of them asks for the call's tensors; a `Call` finds them once and hands every asker the same list.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch


def tensors_in(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among ``args`` and ``kwargs``, nested lists, tuples and dicts included, in order."""
    found: list[torch.Tensor] = []
    _collect(args, found)
    _collect(kwargs, found)
    return found


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors a value holds: itself, or those in its nested lists, tuples and dicts, in order."""
    return leaves_of(value, torch.Tensor)


def leaves_of(value: Any, kinds: type | tuple[type, ...]) -> list:
    """The values of ``kinds`` a value holds: itself, or those in its nested lists, tuples and dicts, in order."""
    found: list = []
    _collect(value, found, kinds)
    return found


def _collect(value: Any, found: list, kinds: type | tuple[type, ...] = torch.Tensor) -> None:
    if isinstance(value, kinds):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, found, kinds)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found, kinds)


def has_symbolic(values: Iterable[Any]) -> bool:
    """Whether a size among ``values`` (a tensor's, or one given as a number) is symbolic, in
    nested lists and tuples too."""
    for value in values:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
        if isinstance(value, (list, tuple)) and has_symbolic(value):
            return True
    return False


class Call:
    """``target(*args, **kwargs)``, with its tensors and whether any size is symbolic found on first use.

    The arguments are the call's own: a step that changes them (moving constants onto meta,
    broadcasting symbolic sizes) makes a new `Call`.
    """

    __slots__ = ("target", "args", "kwargs", "_tensors", "_symbolic")

    def __init__(self, target: Any, args: tuple, kwargs: dict):
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self._tensors: list[torch.Tensor] | None = None
        self._symbolic: bool | None = None

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The tensor arguments, in order (treat as read-only: every asker shares the list)."""
        if self._tensors is None:
            self._tensors = tensors_in(self.args, self.kwargs)
        return self._tensors

    @property
    def has_symbolic(self) -> bool:
        """Whether a size among the arguments (a tensor's, or one given as a number) is symbolic."""
        if self._symbolic is None:
            self._symbolic = has_symbolic((*self.args, *self.kwargs.values()))
        return self._symbolic

    def of(self, target: Any) -> "Call":
        """The same arguments called on ``target`` (an overload picked for a packet), facts kept."""
        other = Call(target, self.args, self.kwargs)
        other._tensors, other._symbolic = self._tensors, self._symbolic
        return other

    def __repr__(self) -> str:
        return f"Call({self.target!r}, {len(self.args)} args, {sorted(self.kwargs)})"
