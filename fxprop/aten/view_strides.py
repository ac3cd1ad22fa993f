"""The strides of ``view``, as ATen's ``computeStride`` (aten/src/ATen/TensorUtils.cpp) gives them.

A view's size-1 dims may carry any stride, and the python decomposition torch uses for symbolic
sizes (``torch._refs._reshape_view_helper``) gives them other strides than ATen's C++ kernel,
which propagations without symbols take. They stay harmless until a layout choice reads them:
``suggest_memory_format`` then calls a (1, C, H, W) view channels-last, and upsampling lays its
result out so. `view_strides` is ATen's algorithm, on sizes and strides only, for symbolic sizes.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import symbolic
from ..torch_compat import DATA_DEPENDENT_ERRORS

aten = torch.ops.aten
VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})


class _Undecided(Exception):
    pass


def _known(condition) -> bool:
    """A size condition decided for every value of its symbols, or `_Undecided` (never a guard: a
    decision the view's own kernel did not take must not become the caller's guard)."""
    decided = symbolic.resolve(condition)
    if decided is None:
        raise _Undecided
    return decided


def view_strides(old_shape: Sequence, old_stride: Sequence, new_shape: Sequence) -> list | None:
    """The strides of ``view(new_shape)`` of a tensor with these sizes and strides; None when ATen
    could not view it, or when its choices are not decided for every value of the symbols (the
    caller then keeps what it has)."""
    try:
        return _view_strides(old_shape, old_stride, new_shape)
    except _Undecided:
        return None


def _view_strides(old_shape: Sequence, old_stride: Sequence, new_shape: Sequence) -> list | None:
    if not old_shape:
        return [1] * len(new_shape)
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[tensor_d]
        if tensor_d == 0 or (_known(old_shape[tensor_d - 1] != 1)
                             and _known(old_stride[tensor_d - 1] != tensor_numel * chunk_base_stride)):
            while view_d >= 0 and (_known(view_numel < tensor_numel) or _known(new_shape[view_d] == 1)):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if _known(view_numel != tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    return new_stride if view_d == -1 else None


def as_aten_views(op, args: tuple, result):
    """``result`` of a view op restrided as ATen's kernel strides it, in a propagation with symbolic
    sizes (where torch views through its python decomposition, even of tensors with concrete sizes)."""
    if op not in VIEWS or not isinstance(result, torch.Tensor) or not isinstance(args[0], torch.Tensor):
        return result
    source = args[0]
    if not symbolic.current().active:
        return result
    try:
        if symbolic.resolve(source.numel() == 0) is not False:  # computeStride's empty-tensor path, or undecided
            return result
        strides = view_strides(source.shape, source.stride(), result.shape)
        if strides is None or all(symbolic.definitely_equal(a, b) for a, b in zip(strides, result.stride())):
            return result
    except DATA_DEPENDENT_ERRORS:
        return result
    return result.as_strided(result.shape, strides, result.storage_offset())
