"""Views that decide nothing, computed directly: ``transpose``, ``t``, ``permute``, ``unsqueeze``,
``expand``, ``slice``, and ``alias`` and ``detach`` (the input's own geometry). Each rearranges
sizes and strides (and ``slice`` the offset) of its input; under symbolic sizes their meta kernels
are torch's python references, each part dispatched again. As in `fxprop.kinds.direct`, only a call whose answer is plain takes the
shortcut: dims in range, sizes equal or 1 on sight, slice bounds that decide nothing. Anything
else returns None, and the meta kernel runs, checks and raises as before. Their in-place forms
(``t_``, ``unsqueeze_``) change self's sizes: they run their kernels.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from .direct import same_size, wrapped_dim

aten = torch.ops.aten


def _viewed(input: torch.Tensor, sizes: list, strides: list) -> torch.Tensor:
    return input.as_strided(sizes, strides, input.storage_offset())


def alias(input: Any) -> torch.Tensor | None:
    if type(input) is not torch.Tensor:  # a parameter (a lazy module's, uninitialized, has no sizes yet)
        return None
    return _viewed(input, list(input.shape), list(input.stride()))


def transpose(input: Any, dim0: Any, dim1: Any) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dim() == 0:
        return None
    first, second = wrapped_dim(dim0, input.dim()), wrapped_dim(dim1, input.dim())
    if first is None or second is None:
        return None
    sizes, strides = list(input.shape), list(input.stride())
    sizes[first], sizes[second] = sizes[second], sizes[first]
    strides[first], strides[second] = strides[second], strides[first]
    return _viewed(input, sizes, strides)


def t(input: Any) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dim() > 2:
        return None
    return transpose(input, 0, 1) if input.dim() == 2 else _viewed(input, list(input.shape), list(input.stride()))


def permute(input: Any, dims: Any) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or not isinstance(dims, (list, tuple)) or len(dims) != input.dim():
        return None
    wrapped = [wrapped_dim(dim, input.dim()) for dim in dims]
    if None in wrapped or sorted(wrapped) != list(range(input.dim())) or input.dim() == 0:
        return None
    sizes, strides = input.shape, input.stride()
    return _viewed(input, [sizes[dim] for dim in wrapped], [strides[dim] for dim in wrapped])


def unsqueeze(input: Any, dim: Any) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor):
        return None
    at = wrapped_dim(dim, input.dim() + 1)
    if at is None:
        return None
    sizes, strides = list(input.shape), list(input.stride())
    strides.insert(at, 1 if at >= input.dim() else sizes[at] * strides[at])
    sizes.insert(at, 1)
    return _viewed(input, sizes, strides)


def expand(input: Any, size: Any, *, implicit: bool = False) -> torch.Tensor | None:
    """ATen's ``inferExpandGeometry``, right to left: sizes kept (-1 or the same), size-1 dims
    broadcast at stride 0; a new leading dim of size 1 takes the stride of the dims after it."""
    if not isinstance(input, torch.Tensor) or not isinstance(size, (list, tuple)) or len(size) < input.dim():
        return None
    rank, own_rank = len(size), input.dim()
    sizes: list[Any] = [None] * rank
    strides: list[Any] = [None] * rank
    for i in range(rank - 1, -1, -1):
        dim = own_rank - rank + i
        own = input.shape[dim] if dim >= 0 else 1
        stride = input.stride()[dim] if dim >= 0 else (sizes[i + 1] * strides[i + 1] if i + 1 < rank else 1)
        target = size[i]
        if type(target) is int and target == -1:
            if dim < 0:
                return None  # torch refuses -1 for a new dim
            target = own
        if not same_size(own, target):
            if not (type(own) is int and own == 1) or not (
                    isinstance(target, torch.SymInt) or (type(target) is int and target >= 0)):
                return None
            stride = 0
        sizes[i], strides[i] = target, stride
    return _viewed(input, sizes, strides)


def slice_(input: Any, dim: Any = 0, start: Any = None, end: Any = None, step: Any = 1) -> torch.Tensor | None:
    """ATen's ``slice``: the dim's elements from ``start`` to ``end`` (counted from its end where
    negative, then clamped into it), every ``step``-th, as a view. Taken where the bounds decide
    nothing (`slice_extent`); under symbolic sizes the meta kernel is torch's python decomposition."""
    if not isinstance(input, torch.Tensor) or input.dim() == 0 or type(step) is not int or step <= 0:
        return None
    at = wrapped_dim(dim, input.dim())
    if at is None:
        return None
    sizes, strides = list(input.shape), list(input.stride())
    extent = slice_extent(sizes[at], start, end, step)
    if extent is None:
        return None
    first, sizes[at] = extent
    offset = input.storage_offset() + first * strides[at] if first else input.storage_offset()
    strides[at] = strides[at] * step if step != 1 else strides[at]
    return input.as_strided(sizes, strides, offset)


def slice_extent(size: Any, start: Any, end: Any, step: int) -> tuple[Any, Any] | None:
    """``(first, count)``: where a slice of a dim of ``size`` starts and how many elements it takes
    (``step`` positive), its bounds clamped as ATen clamps them. Int bounds of an int size, or the
    whole of a symbolic dim by steps of 1 (from no start or 0, to no end, the largest int, or the
    size itself); None for anything whose clamping the sizes' ranges would decide."""
    if type(size) is int:
        first = 0 if start is None else start
        last = sys.maxsize if end is None else end
        if type(first) is not int or type(last) is not int:
            return None
        first = first + size if first < 0 else first
        last = last + size if last < 0 else last
        first = min(max(first, 0), size)
        last = min(max(last, first), size)
        return first, (last - first + step - 1) // step
    whole_from_start = start is None or (type(start) is int and start == 0)
    whole_to_end = end is None or (type(end) is int and end == sys.maxsize) or same_size(end, size)
    return (0, size) if whole_from_start and whole_to_end and step == 1 else None


DIRECT_VIEWS: dict[Any, Callable[..., Any]] = {
    aten.transpose.int: transpose,
    aten.t.default: t,
    aten.permute.default: permute,
    aten.unsqueeze.default: unsqueeze,
    aten.expand.default: expand,
    aten.slice.Tensor: slice_,
    aten.alias.default: alias,
    aten.detach.default: alias,
}
