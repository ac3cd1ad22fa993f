"""Results of the commonest ops computed directly, where their python meta kernels are slow.

``add``, ``mul``, ``gelu``, ``where``, ``addmm``, ``native_layer_norm``,
dtype conversions (``_to_copy``), their in-place forms (``relu_``, ``add_``) and the views that
only rearrange sizes and strides (`fxprop.kinds.direct_views`) are most of a model's ops. Their meta
kernels are torch's python references and decompositions: hundreds of microseconds to
milliseconds a call, each of their parts dispatched again. What they compute is simple: a
broadcast shape, a promoted dtype, and the layout the real kernel gives (contiguous for the
matrix products and layer norm; an elementwise result is laid out afterwards as TensorIterator
lays it out, by `fxprop.aten.layout.relayout`, as every elementwise result is). FakeTensorMode takes
the same shortcut for the binary ops (``make_fast_binary_impl``).

Only calls whose answer is plain take it: sizes equal or 1 without deciding anything, dtypes
every kernel implements the op for, no optional argument that changes the result. Anything
else -- a broadcast that fails or that the sizes' bounds must decide, a refusal, mixed dtypes --
returns None, and the meta kernel runs, checks and raises as before. With symbolic sizes the
elementwise shortcut is taken where the ShapeEnv's ranges decide, without a guard, every comparison
TensorIterator makes to lay the result out (`fxprop.aten.layout.decided_tensor_iterator_strides`):
the layout is then the same for every value of the symbols. Operands of two dtypes take it only
where they are all contiguous and of the result's shape (the CPU casts one of them first).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import sympy
import torch

from ..aten.layout import decided_dense, decided_tensor_iterator_strides
from ..symbolic import known_laid_out_in
from ..torch_compat import (ELEMENTWISE_TYPE_PROMOTION_KIND, MIN_MAX, below_autograd_views, elementwise_dtypes,
                            has_symbolic_sizes, is_non_overlapping_and_dense, meta_over_storage_of, size_expression)

aten = torch.ops.aten
_DEFAULT = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
_INT_TO_FLOAT = ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
_ALWAYS_BOOL = ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTEGERS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
FULL_PRECISION = frozenset({torch.float32, torch.float64})  # reduced precision keeps other statistics dtypes


# --- elementwise -------------------------------------------------------------------------------

_BINARY = {
    aten.add.Tensor: _DEFAULT, aten.sub.Tensor: _DEFAULT, aten.mul.Tensor: _DEFAULT, aten.div.Tensor: _INT_TO_FLOAT,
    aten.eq.Tensor: _ALWAYS_BOOL, aten.ne.Tensor: _ALWAYS_BOOL, aten.lt.Tensor: _ALWAYS_BOOL,
    aten.le.Tensor: _ALWAYS_BOOL, aten.gt.Tensor: _ALWAYS_BOOL, aten.ge.Tensor: _ALWAYS_BOOL,
    aten.bitwise_and.Tensor: _DEFAULT, aten.bitwise_or.Tensor: _DEFAULT, aten.bitwise_xor.Tensor: _DEFAULT,
}
# The Scalar overloads: the same ops with a wrapped number (``x * 0.5``, ``mask == 0``).
_SCALAR_FORMS = {getattr(packet, "Scalar"): tensor_form for tensor_form in _BINARY
                 for packet in [getattr(aten, tensor_form.name().removeprefix("aten::").partition(".")[0])]
                 if "Scalar" in packet.overloads()}
_NEVER_ON_BOOLS = {aten.sub.Tensor}  # "Subtraction, the `-` operator, with two bool tensors is not supported"
_NEVER_ON_FLOATS = {aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor}  # bools and integers only

# Of a floating tensor, to the same dtype; gelu's ``approximate`` is checked by its kernel.
_UNARY_FLOAT = {aten.relu.default, aten.silu.default, aten.sigmoid.default, aten.tanh.default, aten.exp.default,
                aten.log.default, aten.neg.default, aten.rsqrt.default, aten.sqrt.default, aten.reciprocal.default,
                aten.sin.default, aten.cos.default, aten.erf.default, aten.abs.default}
_GELU_APPROXIMATIONS = ("none", "tanh")


def binary(op: Any, *args: Any, **kwargs: Any) -> torch.Tensor | None:
    """Two tensors, or a floating tensor and a python number."""
    if kwargs or len(args) != 2:
        return None
    first, second = args
    if not isinstance(first, torch.Tensor):
        return None
    if isinstance(second, torch.Tensor):
        tensors = (first, second)
    elif type(second) in (int, float) and first.dtype.is_floating_point:
        tensors = (first,)  # a python number never changes a floating tensor's dtype
    elif type(second) is int and _BINARY[op] is not _INT_TO_FLOAT and first.dtype in INTEGERS:
        tensors = (first,)  # nor a python int an integer tensor's
    else:
        return None
    dtypes = {tensor.dtype for tensor in tensors}
    if any(dtype.is_complex for dtype in dtypes) or (op in _NEVER_ON_BOOLS and torch.bool in dtypes) or (
            op in _NEVER_ON_FLOATS and any(dtype.is_floating_point for dtype in dtypes)):
        return None
    shape = plain_broadcast([tensor.shape for tensor in tensors])
    if shape is None:
        return None
    return elementwise_result(shape, _binary_dtype(_BINARY[op], dtypes, args), tensors, iterated=args,
                               casts=len(dtypes) > 1)


def where(condition: Any, input: Any, other: Any) -> torch.Tensor | None:
    """``where(condition, input, other)`` of a bool condition and two tensors of one dtype (ATen casts
    them to their common dtype first), iterated in that order."""
    tensors = (condition, input, other)
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors) or condition.dtype is not torch.bool or \
            input.dtype != other.dtype or input.dtype.is_complex:
        return None
    shape = plain_broadcast([tensor.shape for tensor in tensors])
    return None if shape is None else elementwise_result(shape, input.dtype, tensors)


def where_scalar_other(condition: Any, input: Any, other: Any) -> torch.Tensor | None:
    """``where(condition, input, number)`` of a floating tensor, which a python number does not promote."""
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or type(other) not in (int, float):
        return None
    return _where_with_a_number(condition, input, (condition, input, other))


def where_scalar_self(condition: Any, input: Any, other: Any) -> torch.Tensor | None:
    """``where(condition, number, other)``, as `where_scalar_other`."""
    if not isinstance(other, torch.Tensor) or other.dtype not in FLOATS or type(input) not in (int, float):
        return None
    return _where_with_a_number(condition, other, (condition, input, other))


def _where_with_a_number(condition: Any, tensor: torch.Tensor, iterated: tuple) -> torch.Tensor | None:
    if not isinstance(condition, torch.Tensor) or condition.dtype is not torch.bool:
        return None
    shape = plain_broadcast([condition.shape, tensor.shape])
    return None if shape is None else elementwise_result(shape, tensor.dtype, (condition, tensor), iterated=iterated)


def safe_softmax(input: Any, dim: Any, dtype: Any = None) -> torch.Tensor | None:
    """``_safe_softmax``: softmax, with rows that are all -inf zeroed by a ``where`` over the softmax's
    result, which every device allocates contiguous (``_softmax``'s structured meta gives no
    strides): contiguous, whatever the input's layout."""
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or (dtype is not None and dtype not in FLOATS) \
            or wrapped_dim(dim, input.dim()) is None:
        return None
    return empty_contiguous(input.shape, input.dtype if dtype is None else dtype)


def unary_float(input: Any) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS:
        return None
    return elementwise_result(input.shape, input.dtype, (input,))


def gelu(input: Any, approximate: str = "none") -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or approximate not in _GELU_APPROXIMATIONS:
        return None
    return elementwise_result(input.shape, input.dtype, (input,))


def elementwise_result(shape: tuple, dtype: torch.dtype, tensors: tuple, iterated: tuple = (),
                        casts: bool = False) -> torch.Tensor | None:
    """A result of ``shape`` and ``dtype``; with symbolic sizes laid out as TensorIterator lays it out over
    ``iterated`` (the tensors, and a python number as the wrapped scalar it becomes), where the ShapeEnv
    decides that layout. ``casts``: the CPU's iterator first casts an operand to the common dtype."""
    if not any(has_symbolic_sizes(tensor) for tensor in tensors):
        return torch.empty(shape, dtype=dtype, device="meta")  # laid out by `fxprop.aten.layout.relayout`
    full = [tensor for tensor in tensors if same_sizes(tensor.shape, shape)]
    if len(full) == len(tensors) and all(known_laid_out_in(tensor.shape, tensor.stride(), torch.contiguous_format)
                                         for tensor in tensors):  # TensorIterator's fast set-up, whatever an operand's dtype
        like = next((tensor for tensor in full if _contiguous_as_torch_empty_strides_it(tensor)), full[0])
        return contiguous_result(like, dtype)
    if casts:
        return None  # a cast copy's layout (`fxprop.aten.layout`) is left to the meta kernel
    strides = decided_tensor_iterator_strides(shape, iterated or tensors)
    if strides is None:
        return None
    return dense_result(shape, strides, dtype, full[0].numel() if full else None)


def contiguous_result(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous result of ``like``'s sizes: with symbolic sizes over ``like``'s own stride
    expressions where they are the ones ``torch.empty`` would compute again."""
    if has_symbolic_sizes(like) and _contiguous_as_torch_empty_strides_it(like):
        return dense_result(like.shape, like.stride(), dtype, like.numel())
    return empty_contiguous(like.shape, dtype)


def _contiguous_as_torch_empty_strides_it(tensor: torch.Tensor) -> bool:
    """Whether the tensor's strides are, as expressions, the row-major products ``torch.empty`` gives its sizes."""
    running = sympy.Integer(1)
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        if _expression(stride) != running:
            return False
        running = running * _expression(size)
    return True


def _expression(size: Any) -> Any:
    return size_expression(size) if isinstance(size, torch.SymInt) else size


def empty_contiguous(shape: Sequence, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device="meta")``. With symbolic sizes, each positive by its
    symbols' declarations and free of min and max, its row-major strides and storage bytes are
    computed once, in the expressions torch's take (``max(size, 1)``, torch's factor of a stride, is
    then the size itself; torch keeps ``max(Max(B, C), 1)`` as ``Max(1, B, C)``), where
    ``torch.empty`` computes them, its element count and checks of them again in SymInt arithmetic."""
    if not any(isinstance(size, torch.SymInt) for size in shape) or not all(
            _plain_positive(size_expression(size)) if isinstance(size, torch.SymInt) else type(size) is int and size > 0
            for size in shape):
        return torch.empty(shape, dtype=dtype, device="meta")
    strides = [1] * len(shape)
    for dim in range(len(shape) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    return meta_over_storage_of(shape, strides, dtype, _element_count(shape) * dtype.itemsize)


def _element_count(shape: Sequence) -> Any:
    """The product of the sizes, multiplied from the first on as torch's ``multiply_integers`` does:
    ``(B*(T+1))*8``, not ``B*(8*T+8)``."""
    count = shape[0]
    for size in shape[1:]:
        count = count * size
    return count


def _plain_positive(size: sympy.Expr) -> bool:
    return bool(size.is_positive) and not size.has(*MIN_MAX)


def dense_result(shape: tuple, strides: tuple, dtype: torch.dtype, numel: Any = None) -> torch.Tensor:
    """A fresh meta tensor of symbolic ``shape`` and dense ``strides`` (every size at least 1), over a
    storage of its elements' bytes, as ``torch.empty`` of them would make it: ``empty_strided``
    computes a storage's extent in SymInt arithmetic, dims times over, where this takes the count of
    elements (``numel``, an operand's where one has the shape) times the element's size."""
    if numel is None:
        numel = _element_count(shape)
    if isinstance(numel, torch.SymInt) and not size_expression(numel).is_nonnegative:
        flat = torch.empty((numel,), dtype=dtype, device="meta")  # its check of the size is one torch would make
        with below_autograd_views():
            return flat.as_strided(shape, strides)
    return meta_over_storage_of(shape, strides, dtype, numel * dtype.itemsize)


def _binary_dtype(kind: ELEMENTWISE_TYPE_PROMOTION_KIND, dtypes: set, args: tuple) -> torch.dtype:
    if kind is _ALWAYS_BOOL:
        return torch.bool
    if len(dtypes) == 1:
        (dtype,) = dtypes
        if kind is _DEFAULT or dtype.is_floating_point:
            return dtype
    return elementwise_dtypes(*args, type_promotion_kind=kind)[1]


def plain_broadcast(shapes: list) -> tuple | None:
    """The broadcast of ``shapes`` where every pair of sizes is equal or 1 on sight (the same
    expression, for symbolic sizes); None where anything would need deciding or fails."""
    rank = max(len(shape) for shape in shapes)
    result: list[Any] = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for i, size in enumerate(shape):
            current = result[offset + i]
            if type(size) is int and size == 1:
                continue
            if type(current) is int and current == 1:
                result[offset + i] = size
            elif not same_size(current, size):
                return None
    return tuple(result)


def same_size(a: Any, b: Any) -> bool:
    if type(a) is int and type(b) is int:
        return a == b
    return isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and size_expression(a) == size_expression(b)


def same_sizes(shape: Any, other: tuple) -> bool:
    return len(shape) == len(other) and all(same_size(a, b) for a, b in zip(shape, other))


def wrapped_dim(dim: Any, rank: int) -> int | None:
    """``dim`` wrapped into ``range(rank)``; None where torch refuses it (the meta kernel raises)."""
    if type(dim) is not int or not -max(rank, 1) <= dim < max(rank, 1):
        return None
    return dim % max(rank, 1)


# --- matrix products and normalization -------------------------------------------------------

def one_float(*tensors: Any, static: bool = False) -> torch.dtype | None:
    """The one floating dtype of ``tensors`` (all with static sizes, if ``static``), else None."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or (static and any(has_symbolic_sizes(t) for t in tensors)):
        return None
    (dtype,) = dtypes
    return dtype if dtype in FLOATS else None


def mm(self: Any, mat2: Any) -> torch.Tensor | None:
    if not (isinstance(self, torch.Tensor) and isinstance(mat2, torch.Tensor)) or self.dim() != 2 or mat2.dim() != 2:
        return None
    dtype = one_float(self, mat2)
    if dtype is None or not same_size(self.shape[1], mat2.shape[0]):
        return None
    return empty_contiguous((self.shape[0], mat2.shape[1]), dtype)


def addmm(self: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor | None:
    if type(beta) not in (int, float) or type(alpha) not in (int, float) or not isinstance(self, torch.Tensor):
        return None
    product = mm(mat1, mat2)
    if product is None or one_float(self, mat1) is None or self.dim() > 2:
        return None
    shape = plain_broadcast([self.shape, product.shape])
    return product if shape is not None and same_sizes(shape, tuple(product.shape)) else None


def native_layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any) -> tuple | None:
    """Full precision, weight and bias of the input's dtype (or None): a contiguous result and
    statistics of the input's leading sizes, as the CPU kernel allocates them. With symbolic
    sizes, only of a contiguous input (as the meta kernel lays out any other as the input)."""
    parameters = [t for t in (weight, bias) if t is not None]
    if not isinstance(input, torch.Tensor) or type(eps) not in (int, float) or \
            not all(isinstance(t, torch.Tensor) for t in parameters):
        return None
    dtype = one_float(input, *parameters)
    if dtype not in FULL_PRECISION or not isinstance(normalized_shape, (list, tuple)) or not normalized_shape \
            or not all(type(size) is int for size in normalized_shape):
        return None
    axis = input.dim() - len(normalized_shape)
    if axis < 0 or not same_sizes(input.shape[axis:], tuple(normalized_shape)) or \
            any(not same_sizes(t.shape, tuple(normalized_shape)) for t in parameters):
        return None
    if has_symbolic_sizes(input) and not known_laid_out_in(input.shape, input.stride(), torch.contiguous_format):
        return None
    statistics = (*input.shape[:axis], *(1 for _ in normalized_shape))
    return (empty_contiguous(input.shape, dtype), empty_contiguous(statistics, dtype),
            empty_contiguous(statistics, dtype))


def native_dropout(input: Any, p: Any, train: Any) -> tuple | None:
    """Of a floating tensor of symbolic sizes that is dense for every value of them: the output and
    the mask both ``empty_like(input)`` on every device, in training or not (the CPU's ``input *
    noise`` iterates over two tensors of one dense layout, keeping it)."""
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or not has_symbolic_sizes(input) or \
            type(p) not in (int, float) or not 0 <= p <= 1 or not decided_dense(input):
        return None
    return (dense_result(input.shape, input.stride(), input.dtype, input.numel()),
            dense_result(input.shape, input.stride(), torch.bool, input.numel()))


_CONVERTIBLE = FLOATS | INTEGERS | {torch.bool}


def to_copy(input: Any, *, dtype: Any = None, memory_format: Any = None, non_blocking: Any = False) -> torch.Tensor | None:
    """``_to_copy`` to a dtype (or none) of a dense tensor: ``empty_like(self)`` with
    ``preserve_format`` keeps its strides on every device (the device itself is `fxprop.devices`')."""
    if not isinstance(input, torch.Tensor) or input.dtype not in _CONVERTIBLE or non_blocking is not False or \
            memory_format not in (None, torch.preserve_format) or (dtype is not None and dtype not in _CONVERTIBLE):
        return None
    dtype = input.dtype if dtype is None else dtype
    if has_symbolic_sizes(input):
        return dense_result(input.shape, input.stride(), dtype, input.numel()) if decided_dense(input) else None
    if not is_non_overlapping_and_dense(input):
        return None
    return torch.empty_strided(input.shape, input.stride(), dtype=dtype, device="meta")


_FUNCTIONAL: dict[Any, Callable[..., Any]] = {
    **{op: functools.partial(binary, op) for op in _BINARY},
    **{op: functools.partial(binary, tensor_form) for op, tensor_form in _SCALAR_FORMS.items()},
    aten.where.self: where,
    aten.where.ScalarOther: where_scalar_other,
    aten.where.ScalarSelf: where_scalar_self,
    aten._safe_softmax.default: safe_softmax,
    **dict.fromkeys(_UNARY_FLOAT, unary_float),
    aten.gelu.default: gelu,
    aten.mm.default: mm,
    aten.addmm.default: addmm,
    aten.native_layer_norm.default: native_layer_norm,
    aten.native_dropout.default: native_dropout,
    aten._to_copy.default: to_copy,
}


def in_place_forms(functional: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """The in-place overloads (``add_.Tensor``) of ``functional``'s ops: each answers ``self`` where its
    functional form has a plain result (which `check_writes_into_self` has already seen fit ``self``)."""
    forms = {}
    for op, compute in functional.items():
        name, _, overload = op.name().removeprefix("aten::").partition(".")
        packet = getattr(aten, f"{name}_", None)
        in_place = getattr(packet, overload or "default", None) if packet is not None else None
        if in_place is not None:
            forms[in_place] = _in_place_of(compute)
    return forms


def _in_place_of(compute: Callable[..., Any]) -> Callable[..., Any]:
    def in_place(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        return args[0] if args and compute(*args, **kwargs) is not None else None
    return in_place


DIRECT: dict[Any, Callable[..., Any]] = {**_FUNCTIONAL, **in_place_forms(_FUNCTIONAL)}


def direct_result(op: Any, args: tuple, kwargs: dict, table: dict[Any, Callable[..., Any]] = DIRECT) -> Any:
    """``op``'s meta result computed directly (by ``table``'s function for it), or None where its
    meta kernel must run."""
    compute = table.get(op)
    if compute is None:
        return None
    try:
        return compute(*args, **kwargs)
    except TypeError:  # arguments the schema would refuse: the meta kernel raises as torch does
        return None
