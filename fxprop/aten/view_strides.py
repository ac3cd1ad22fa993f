"""The strides of ``view``, as ATen's ``computeStride`` (aten/src/ATen/TensorUtils.cpp) gives them.

A view's size-1 dims may carry any stride, and the python decomposition torch uses for symbolic
sizes (``torch._refs._reshape_view_helper``) gives them other strides than ATen's C++ kernel,
which propagations without symbols take. They stay harmless until a layout choice reads them:
``suggest_memory_format`` then calls a (1, C, H, W) view channels-last, and upsampling lays its
result out so. `view_strides` is ATen's algorithm, on sizes and strides only, for symbolic sizes.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

import sympy
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from .. import ambient, symbolic
from ..memo.signatures import Uncacheable, symbolic_signature
from ..symbolic.sizes import static_truth
from ..torch_compat import DATA_DEPENDENT_ERRORS, size_expression, storage_key

aten = torch.ops.aten
VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})


class _Undecided(Exception):
    """A comparison of sizes that the ShapeEnv's ranges alone do not decide."""


def view_strides(old_shape: Sequence, old_stride: Sequence, new_shape: Sequence) -> list | None:
    """The strides of ``view(new_shape)`` of a tensor with these sizes and strides; None when ATen
    could not view it (the caller then keeps what it has)."""
    if not old_shape:
        return [1] * len(new_shape)
    try:
        return _view_strides_on_sight(old_shape, old_stride, new_shape)
    except _Undecided:
        return _view_strides_deciding(old_shape, old_stride, new_shape)


def _view_strides_on_sight(old_shape: Sequence, old_stride: Sequence, new_shape: Sequence,
                           strides: bool = True) -> list | None:
    """`_view_strides_deciding` where the ShapeEnv's ranges decide every comparison (raises `_Undecided`
    where they do not): sizes compared as expressions, as torch would decide them statically, and
    only the strides returned computed in SymInt arithmetic, by the same operations (not at all
    without ``strides``: the list then says only that the view exists)."""
    env = next((size.node.shape_env for size in (*old_shape, *old_stride, *new_shape)
                if isinstance(size, torch.SymInt)), None)
    new_stride: list = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel = sympy.Integer(1)  # expressions, for the comparisons
    view_count, view_numel = sympy.Integer(1), 1  # the view's as an expression, and in SymInt arithmetic
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel = tensor_numel * _expression(old_shape[tensor_d])
        if tensor_d == 0 or (
                _on_sight(env, sympy.Ne, _expression(old_shape[tensor_d - 1]), 1)
                and _on_sight(env, sympy.Ne, _expression(old_stride[tensor_d - 1]),
                              tensor_numel * _expression(chunk_base_stride))):
            while view_d >= 0 and (_on_sight(env, sympy.Lt, view_count, tensor_numel)
                                   or _on_sight(env, sympy.Eq, _expression(new_shape[view_d]), 1)):
                if strides:
                    new_stride[view_d] = _times(view_numel, chunk_base_stride)
                    view_numel = _times(view_numel, new_shape[view_d])
                view_count = view_count * _expression(new_shape[view_d])
                view_d -= 1
            if _on_sight(env, sympy.Ne, view_count, tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel, view_count, view_numel = sympy.Integer(1), sympy.Integer(1), 1
    return new_stride if view_d == -1 else None


def _times(a: Any, b: Any) -> Any:
    """``a * b``, without an operation where one is the int 1 (each SymInt operation is a call into python)."""
    if type(a) is int and a == 1:
        return b
    if type(b) is int and b == 1:
        return a
    return a * b


def _on_sight(env: Any, relation: type, a: sympy.Expr, b: Any) -> bool:
    found = static_truth(env, relation, a, b)
    if found is None:
        raise _Undecided
    return found


def _view_strides_deciding(old_shape: Sequence, old_stride: Sequence, new_shape: Sequence) -> list | None:
    """ATen's computeStride on sizes and strides, its comparisons decided by the ShapeEnv (a decision
    its ranges do not make follows the sizes' hints)."""
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[tensor_d]
        if tensor_d == 0 or (old_shape[tensor_d - 1] != 1
                             and old_stride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    return new_stride if view_d == -1 else None


def plain_view(args: tuple) -> torch.Tensor | None:
    """``view(size)`` of a meta tensor with symbolic sizes, as `as_aten_views` lays out torch's result,
    where the sizes make every check of torch's python view plain on sight (`plain_view_sizes`).
    Anything else returns None, and torch's view runs."""
    source, size = args[0], args[1] if len(args) == 2 else None
    shape = plain_view_sizes(source, size)
    return _strided_view(source, shape) if shape is not None else None


def plain_view_sizes(source: torch.Tensor, size: Any) -> list | None:
    """The sizes ``source.view(size)`` takes, where every check of torch's python view is plain on
    sight: sizes asked for that are ints or input sizes (never -1 by their ranges), their count of
    elements the source's (the same product, or one -1 that divides it exactly), and a source with
    elements, of symbolic sizes. The inferred size is computed as torch computes it. None otherwise."""
    if not isinstance(size, (list, tuple)) or source.dim() == 0 or not size:
        return None
    numel = source.numel()
    if not isinstance(numel, torch.SymInt) or not _backed_positive(size_expression(numel)) or any(
            isinstance(stride, torch.SymInt) and free_unbacked_symbols(size_expression(stride)) for stride in source.stride()):
        return None
    inferred, known = None, []
    for i, dim in enumerate(size):
        if type(dim) is int and dim == -1 and inferred is None:
            inferred = i
        elif (type(dim) is int and dim >= 0) or (isinstance(dim, torch.SymInt) and size_expression(dim).is_nonnegative):
            known.append(dim)
        else:
            return None
    known_count = sympy.Mul(*(_expression(dim) for dim in known))
    if inferred is None:
        return list(size) if known_count == size_expression(numel) else None
    if not (known_count.is_positive and (size_expression(numel) / known_count).is_integer):
        return None
    newsize = 1
    for dim in known:
        newsize *= dim
    shape = list(size)
    shape[inferred] = numel // newsize
    return shape


def viewable_on_sight(source: torch.Tensor, size: Any) -> bool:
    """Whether ``source.view(size)`` succeeds, its checks (`plain_view_sizes`) and its strides (ATen's
    ``computeStride``) decided by the ShapeEnv's ranges alone, without a guard."""
    shape = plain_view_sizes(source, size)
    if shape is None:
        return False
    try:
        return _view_strides_on_sight(source.shape, source.stride(), shape, strides=False) is not None
    except (_Undecided, *DATA_DEPENDENT_ERRORS):
        return False


def _strided_view(source: torch.Tensor, shape: list) -> torch.Tensor | None:
    try:
        strides = view_strides(source.shape, source.stride(), shape)
    except DATA_DEPENDENT_ERRORS:
        return None
    return None if strides is None else source.as_strided(shape, strides, source.storage_offset())


def _backed_positive(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is positive by its symbols' declarations (backed input sizes are declared
    positive; data-dependent sizes are not, and torch views them by other rules)."""
    return bool(expr.is_positive) and not free_unbacked_symbols(expr)


def _expression(size: Any) -> sympy.Expr:
    return size_expression(size) if isinstance(size, torch.SymInt) else sympy.Integer(size)


def as_aten_views(op, args: tuple, result):
    """``result`` of a view op restrided as ATen's kernel strides it, in a propagation with symbolic
    sizes (where torch views through its python decomposition, even of tensors with concrete sizes)."""
    if op not in VIEWS or not isinstance(result, torch.Tensor) or not isinstance(args[0], torch.Tensor):
        return result
    source = args[0]
    if not symbolic.current().active:
        return result
    try:
        if source.numel() == 0:  # computeStride's empty-tensor path
            return result
        strides = view_strides(source.shape, source.stride(), result.shape)
        if strides is None or all(a == b for a, b in zip(strides, result.stride())):
            return result
    except DATA_DEPENDENT_ERRORS:
        return result
    return result.as_strided(result.shape, strides, result.storage_offset())


def remembered_view(op, args: tuple, kwargs: dict, view: Callable[[], Any]) -> Any:
    """``view()``, the result of the view op ``op``; in a propagation with symbolic sizes, a view
    with the same geometry as an earlier one (the source's sizes, strides and offset, the sizes
    asked for, as expressions) is laid over the source with that one's sizes and strides instead.
    torch views through its python decomposition there, a millisecond of symbolic arithmetic a
    call, and a model views alike in every layer. The first call decided all the geometry needed
    in this call's ShapeEnv, so the repeat has nothing left to decide."""
    session = ambient.session()
    key = _geometry(op, args, kwargs) if session is not None and symbolic.current().active else None
    if key is None:
        return view()
    known = session.view_geometries.get(key)
    if known is not None:
        return args[0].as_strided(*known)
    symbols_before = symbolic.current().symbol_count()
    result = view()
    if (isinstance(result, torch.Tensor) and type(result) is torch.Tensor and result is not args[0]
            and storage_key(result) == storage_key(args[0]) and symbolic.current().symbol_count() == symbols_before):
        session.view_geometries[key] = (result.shape, result.stride(), result.storage_offset())
    return result


def _geometry(op, args: tuple, kwargs: dict) -> Any:
    """The key of a view's geometry, or None for a call whose result a key could not stand for."""
    if kwargs or not args or type(args[0]) is not torch.Tensor or args[0].device.type != "meta":
        return None
    try:
        return (op, symbolic_signature(args))
    except Uncacheable:
        return None
