"""Reshaping: ``reshape``, a view of its input where the sizes allow one and a copy otherwise.

ATen's reshape is the view of its input wherever ``computeStride`` finds strides for the new sizes
(always for a contiguous input), and a contiguous copy viewed otherwise. With symbolic sizes it
decides that in SymInt arithmetic, each operation a call into python: about a millisecond a
reshape. Where the view is decided on sight (`viewable_on_sight`), the reshape is that view, which
fxprop's view computes on expressions; anything else, and every reshape of concrete sizes, runs
torch's own.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import symbolic
from ..aten.view_strides import viewable_on_sight
from ..resolve.registry import rule

aten = torch.ops.aten


@rule(aten.reshape.default, torch.reshape)
def reshape(input, shape):
    viewed = _view_decided_on_sight(input, shape)
    return viewed if viewed is not None else torch.reshape(input, shape)


@rule(torch.Tensor.reshape)
def tensor_reshape(self, *shape, **kwargs):
    viewed = _view_decided_on_sight(self, _sizes_asked(shape, kwargs))
    return viewed if viewed is not None else torch.Tensor.reshape(self, *shape, **kwargs)


@rule("reshape")
def reshape_method(self, *shape, **kwargs):
    """``x.reshape(...)``: a tensor's reshape, or the method of whatever else ``x`` is."""
    viewed = _view_decided_on_sight(self, _sizes_asked(shape, kwargs))
    return viewed if viewed is not None else self.reshape(*shape, **kwargs)


def _view_decided_on_sight(input: Any, size: Any) -> torch.Tensor | None:
    if (type(input) is torch.Tensor and isinstance(size, (list, tuple)) and symbolic.current().active
            and viewable_on_sight(input, size)):
        return aten.view.default(input, list(size))
    return None


def _sizes_asked(shape: tuple, kwargs: dict) -> list | None:
    """The sizes of ``x.reshape(*shape, **kwargs)`` in each of its spellings (``x.reshape(2, 3)``,
    ``x.reshape((2, 3))``, ``shape=``); None for anything else."""
    if kwargs:
        if shape or set(kwargs) != {"shape"}:
            return None
        shape = (kwargs["shape"],)
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    return list(shape) if all(type(dim) is int or isinstance(dim, torch.SymInt) for dim in shape) else None
