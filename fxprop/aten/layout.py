"""The strides real kernels give the result of an elementwise op.

Every CPU and CUDA elementwise kernel allocates its result with ATen's TensorIterator, whose
layout rules (``TensorIteratorBase::fast_set_up``, ``reorder_dimensions``,
``allocate_or_resize_outputs`` in aten/src/ATen/TensorIterator.cpp) differ from those of
torch's python meta kernels (``torch._prims_common.compute_elementwise_output_strides``) in
dims of size 1: for an input of shape (1, 1, 2, 1) and strides (2, 1, 1, 1), ``abs`` gives
(2, 2, 1, 1) on the CPU and (2, 1, 1, 1) on meta. Such strides pass on into ``cat``'s choice of
memory format and into views, where they do matter. `tensor_iterator_strides` is
TensorIterator's algorithm, on sizes and strides only.
"""
from __future__ import annotations

import functools
import math
import operator

from functools import lru_cache
from numbers import Number
from typing import Any, Sequence

import torch
from ..engine import session as context
from ..symbolic.sizes import DecidedSizes, Undecided, kept, propagation_memo
from ..torch_compat import (ELEMENTWISE_TYPE_PROMOTION_KIND, OpOverload, elementwise_dtypes,
                            is_non_overlapping_and_dense as is_non_overlapping_and_dense_or_false,
                            make_channels_last_2d_strides_for, make_contiguous_strides_for, schema_of, size_expression)

# Scalar arguments ATen wraps into 0-dim tensors that take part in the iteration, as in
# add.Scalar(self, other), eq.Scalar(self, other) or special_zeta.self_scalar(self, other) --
# but not alpha, min, max, weight or pow.Tensor_Scalar's exponent.
_WRAPPED_SCALAR_NAMES = ("self", "other", "x", "n")

aten = torch.ops.aten

# Elementwise ops whose real kernels do not leave the layout to TensorIterator: masked_fill
# clones its input contiguous, nan_to_num and frexp allocate empty_like(self), mvlgamma sums,
# conj_physical of a real tensor is the tensor. Their meta kernels already agree.
_LAID_OUT_BY_THE_KERNEL = {aten.masked_fill.Scalar, aten.mvlgamma.default, aten.nan_to_num.default,
                           aten.frexp.Tensor, aten.conj_physical.default}
# pow.Scalar(base, exponent) asks for a contiguous result in its meta function.
_CONTIGUOUS = {aten.pow.Scalar}
# Of a complex tensor: abs allocates empty_like(self) (with the input's own strides, where the
# input is dense, which the meta kernel's empty_like does not keep for size-1 dims); angle computes a
# complex result and copies its real part into a fresh contiguous tensor; isinf iterates over
# the real and imaginary parts (strided views of the input).
_OF_A_COMPLEX_TENSOR: dict[Any, str] = {aten.abs.default: "the kernel's", aten.angle.default: "contiguous",
                                        aten.isinf.default: "its real part's"}
# These call another elementwise op with a python number beside the input (self * pi / 180,
# clamp(self, min, max)), which takes them off TensorIterator's fast path.
_WITH_A_NUMBER = {aten.deg2rad.default, aten.rad2deg.default, aten.hardtanh.default, aten.relu6.default}


# TensorIterator ops that torch does not tag pointwise.
_ELEMENTWISE_UNTAGGED = {aten.floor_divide.default, aten.floor_divide.Scalar, aten.true_divide.Scalar,
                         aten.hardswish.default}

# Kernels that build a TensorIterator over these operands, in this order, whether or not torch
# tags them pointwise (``polar``, ``complex``, and the activations' backward structured kernels in aten/src/ATen/native/Activation.cpp:
# softplus_backward iterates over (grad_output, self); threshold_backward, leaky_relu_backward and
# _prelu_kernel_backward put self first, so their result follows self's layout, not the grad's).
_TENSOR_ITERATOR_OPERANDS: dict[Any, tuple[str, ...]] = {
    **{op: ("grad_output", "self") for op in (aten.hardsigmoid_backward.default, aten.hardswish_backward.default,
                                               aten.hardtanh_backward.default, aten.mish_backward.default,
                                               aten.softplus_backward.default, aten.softshrink_backward.default)},
    aten.elu_backward.default: ("grad_output", "self_or_result"),
    aten.hardshrink_backward.default: ("grad_out", "self"),
    aten.threshold_backward.default: ("self", "grad_output"),
    aten.leaky_relu_backward.default: ("self", "grad_output"),
    aten._prelu_kernel_backward.default: ("self", "weight", "grad_output"),
    aten.polar.default: ("abs", "angle"),
    aten.complex.default: ("real", "imag"),
    # composite: where.self over the condition, self and other, the scalar wrapped as a 0-dim tensor
    aten.where.ScalarOther: ("condition", "self", "other"),
    aten.where.ScalarSelf: ("condition", "self", "other"),
}

# Kernels that allocate their result contiguous before writing into it, on every device:
# {op: the positions of the outputs so allocated}. The loss backwards (``at::zeros_like(self,
# LEGACY_CONTIGUOUS_MEMORY_FORMAT)`` in aten/src/ATen/native/Loss.cpp), ``masked_fill``
# (``self.clone(at::MemoryFormat::Contiguous)``, then ``masked_fill_``), ``renorm`` (its structured
# meta function gives no strides).
_ALLOCATED_CONTIGUOUS: dict[Any, tuple[int, ...]] = {
    aten.mse_loss_backward.default: (0,), aten.huber_loss_backward.default: (0,),
    aten.smooth_l1_loss_backward.default: (0,),
    aten.masked_fill.Scalar: (0,), aten.masked_fill.Tensor: (0,), aten.renorm.default: (0,),
    aten.log_sigmoid_forward.default: (0, 1), aten.normal.Tensor_float: (0,), aten.normal.float_Tensor: (0,),
}

# Kernels that allocate their results ``empty_like(self)`` in the preserved format before writing
# into them (``flip``, ``nan_to_num``, ``frexp``, the ``*_like`` factories without a
# ``memory_format``, ops that call another with a number into such a result, the functional forms
# of the in-place random fills and ``zero``, which clone ``self``): on a real device a dense
# ``self`` keeps its strides exactly, those of size-1 dims included; the meta kernel's
# ``empty_like`` (torch's python reference) and TensorIterator's fast path recompute them.
_ROT90, _ISINF = aten.rot90.default, aten.isinf.default  # laid out by their own rules below
_ALLOCATED_LIKE_SELF = frozenset({
    aten.flip.default, aten.nan_to_num.default, aten.frexp.Tensor, *_WITH_A_NUMBER, aten.zero.default,
    *(overload for packet in (aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.rand_like,
                              aten.randn_like, aten.randint_like, aten.cauchy, aten.exponential, aten.geometric,
                              aten.log_normal, aten.uniform, aten.random)
      for overload in (getattr(packet, name) for name in packet.overloads()) if not overload.is_view
      and not any(argument.name == "out" for argument in schema_of(overload).arguments)),
})


@lru_cache(maxsize=None)
def _operand_arguments(op: OpOverload) -> tuple[tuple[int, str], ...] | None:
    """(position, name) of the arguments that are TensorIterator operands, or None when the op's
    results are not laid out by TensorIterator (not elementwise, a view, writing in place, or
    told a memory format)."""
    if op in _TENSOR_ITERATOR_OPERANDS:
        positions = {argument.name: position for position, argument in enumerate(schema_of(op).arguments)}
        return tuple((positions[name], name) for name in _TENSOR_ITERATOR_OPERANDS[op])
    if (torch.Tag.pointwise not in op.tags and op not in _ELEMENTWISE_UNTAGGED) or op.is_view \
            or schema_of(op).is_mutable:
        return None
    if op in _LAID_OUT_BY_THE_KERNEL or any(argument.name == "memory_format" for argument in schema_of(op).arguments):
        return None  # clone and _to_copy lay their result out as asked
    operands = []
    for position, argument in enumerate(schema_of(op).arguments):
        kind = argument.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        if kind.isSubtypeOf(torch.TensorType.get()) or (
                kind == torch.NumberType.get() and argument.name in _WRAPPED_SCALAR_NAMES):
            operands.append((position, argument.name))
    if op in _WITH_A_NUMBER:
        operands.append((-1, "a number"))
    return tuple(operands)


def operands_of(op: OpOverload, args: tuple, kwargs: dict) -> list[Any] | None:
    """The tensors and wrapped numbers an elementwise ``op`` iterates over, in argument order."""
    arguments = _operand_arguments(op)
    if not arguments:
        return None
    found = []
    for position, name in arguments:
        value = 0 if position < 0 else args[position] if position < len(args) else kwargs.get(name)
        if isinstance(value, (torch.Tensor, Number)):
            found.append(value)
    return found


def _shape(operand: Any) -> tuple:
    return tuple(operand.shape) if isinstance(operand, torch.Tensor) else ()


class _StaticSizes:
    """Sizes that are ints: compared as they are, tensors checked by torch."""

    eq, lt, times = staticmethod(operator.eq), staticmethod(operator.lt), staticmethod(operator.mul)

    @staticmethod
    def contiguous(tensor: torch.Tensor) -> bool:
        return tensor.is_contiguous()

    @staticmethod
    def channels_last(tensor: torch.Tensor) -> bool:
        return tensor.is_contiguous(memory_format=torch.channels_last)

    @staticmethod
    def dense(tensor: torch.Tensor) -> bool:
        return is_non_overlapping_and_dense_or_false(tensor)

    @staticmethod
    def contiguous_strides(shape: tuple) -> tuple:
        return make_contiguous_strides_for(shape)


class _SymbolicSizes:
    """Symbolic sizes, each relation decided for every value in the ShapeEnv's ranges (`DecidedSizes`,
    which raises `Undecided` otherwise); tensors checked as c10 checks them (TensorImpl's
    ``compute_contiguous``, ``compute_channels_last_contiguous_2d``, ``compute_non_overlapping_and_dense``),
    on sizes that are never 0."""

    def __init__(self, sizes: DecidedSizes):
        self.eq, self.lt, self.times = sizes.eq, sizes.lt, sizes.times

    def contiguous(self, tensor: torch.Tensor) -> bool:
        return self._dense_in(tensor, range(tensor.dim() - 1, -1, -1))

    def channels_last(self, tensor: torch.Tensor) -> bool:
        return tensor.dim() == 4 and self._dense_in(tensor, (1, 3, 2, 0))

    def _dense_in(self, tensor: torch.Tensor, order: Sequence[int]) -> bool:
        shape, strides, expected = tensor.shape, tensor.stride(), 1
        for dim in order:
            if self.eq(shape[dim], 1):
                continue
            if not self.eq(strides[dim], expected):
                return False
            expected = self.times(expected, shape[dim])
        return True

    def dense(self, tensor: torch.Tensor) -> bool:
        shape, strides = tensor.shape, tensor.stride()
        if tensor.dim() == 1:
            return self.lt(shape[0], 2) or self.eq(strides[0], 1)

        def before(a: int, b: int) -> int:  # dims of size 0 or 1 last
            a_small, b_small = self.lt(shape[a], 2), self.lt(shape[b], 2)
            if a_small or b_small:
                return int(a_small) - int(b_small)
            return -1 if self.lt(strides[a], strides[b]) else (1 if self.lt(strides[b], strides[a]) else 0)

        expected = 1
        for dim in sorted(range(tensor.dim()), key=functools.cmp_to_key(before)):
            if self.lt(shape[dim], 2):
                return True
            if not self.eq(strides[dim], expected):
                return False
            expected = self.times(expected, shape[dim])
        return True

    def contiguous_strides(self, shape: tuple) -> tuple:
        # plain products, as torch.empty makes them: the sizes are decided non-zero, so no sym_max(size, 1)
        # as in `fxprop.symbolic.contiguous_strides`
        strides, running = [], 1
        for size in reversed(shape):
            strides.append(running)
            running = self.times(running, size)
        return tuple(reversed(strides))


def _broadcast_strides(operand: Any, shape: Sequence[int], sizes: Any) -> tuple:
    """TensorIterator's view of an operand: stride 0 along dims it is broadcast in."""
    if not isinstance(operand, torch.Tensor):
        return (0,) * len(shape)
    offset = len(shape) - operand.dim()
    strides = [0] * offset
    for size, stride, out_size in zip(operand.shape, operand.stride(), shape[offset:]):
        strides.append(0 if sizes.eq(size, 1) and not sizes.eq(out_size, 1) else stride)
    return tuple(strides)


def tensor_iterator_strides(shape: Sequence[int], operands: Sequence[Any], sizes: Any = _StaticSizes) -> tuple:
    """The strides TensorIterator gives a new output of ``shape`` computed from ``operands``
    (tensors, and python numbers standing for wrapped 0-dim scalars)."""
    shape = tuple(shape)
    if len(shape) == 0:
        return ()
    first = _shape(operands[0])
    if all(_same_shape(_shape(operand), first, sizes) for operand in operands):  # the fast set-up path
        tensors = list(operands)
        if all(sizes.contiguous(t) for t in tensors):
            return sizes.contiguous_strides(shape)
        if all(sizes.channels_last(t) for t in tensors):
            return make_channels_last_2d_strides_for(shape)
        if all(sizes.dense(t) for t in tensors) and \
                all(_same_shape(t.stride(), tensors[-1].stride(), sizes) for t in tensors):
            return tuple(tensors[-1].stride())
    return _reordered_strides(shape, [_broadcast_strides(operand, shape, sizes) for operand in operands], sizes)


def decided_tensor_iterator_strides(shape: Sequence[Any], operands: Sequence[Any]) -> tuple | None:
    """`tensor_iterator_strides` of symbolic sizes where the ShapeEnv's ranges decide every
    comparison TensorIterator makes, so that the layout is the same for every value of the
    symbols; None where one is left open or a size may be 0."""
    tensors = [operand for operand in operands if isinstance(operand, torch.Tensor)]
    decided = DecidedSizes(size for tensor in tensors for size in (*tensor.shape, *tensor.stride()))

    def strides() -> tuple | None:
        try:
            if any(decided.lt(size, 1) for size in (*shape, *(size for tensor in tensors for size in tensor.shape))):
                return None
            return tensor_iterator_strides(shape, operands, _SymbolicSizes(decided))
        except Undecided:
            return None
    # a model iterates alike over operands of the same geometry in every layer
    geometry = (_expressions(shape), *(_expressions((*operand.shape, None, *operand.stride()))
                                       if isinstance(operand, torch.Tensor) else None for operand in operands))
    return kept(propagation_memo(decided.env, "tensor iterator strides"), decided.env, geometry, strides)


def _expressions(sizes: Sequence[Any]) -> tuple:
    return tuple(size_expression(size) if isinstance(size, torch.SymInt) else size for size in sizes)


def decided_dense(tensor: torch.Tensor) -> bool:
    """Whether a tensor of symbolic sizes is non-overlapping and dense for every value of its symbols,
    none of them 0; False where the ShapeEnv's ranges cannot tell."""
    decided = DecidedSizes((*tensor.shape, *tensor.stride()))
    try:
        return not any(decided.lt(size, 1) for size in tensor.shape) and _SymbolicSizes(decided).dense(tensor)
    except Undecided:
        return False


def _same_shape(first: Sequence[Any], second: Sequence[Any], sizes: Any) -> bool:
    if sizes is _StaticSizes:
        return tuple(first) == tuple(second)
    return len(first) == len(second) and all(sizes.eq(a, b) for a, b in zip(first, second))


def _reordered_strides(shape: tuple, strides: list[tuple], sizes: Any) -> tuple:
    """``reorder_dimensions``: sort dims fastest first by the operands' strides (ties broken by
    size, ambiguous pairs left in place), then lay the output out densely in that order."""
    ndim = len(shape)

    def should_swap(dim0: int, dim1: int) -> int:
        for operand in strides:
            stride0, stride1 = operand[dim0], operand[dim1]
            if sizes.eq(stride0, 0) or sizes.eq(stride1, 0):
                continue
            if not sizes.eq(stride0, stride1):
                return -1 if sizes.lt(stride0, stride1) else 1
            if sizes.lt(shape[dim1], shape[dim0]):
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    if perm == list(range(ndim - 1, -1, -1)):
        return sizes.contiguous_strides(shape)
    result = [0] * ndim
    next_stride = 1
    for dim in perm:
        result[dim] = next_stride
        next_stride = sizes.times(next_stride, shape[dim])
    return tuple(result)


def relayout(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> Any:
    """``result`` of ``op`` restrided as a real device's kernel lays it out: an elementwise op's as
    TensorIterator does, and the results of kernels that allocate them as the tables above say;
    other ops' results are returned as they are."""
    if op is _ROT90 and isinstance(result, torch.Tensor):
        return _rot90(args[0], result, *args[1:], **kwargs)
    laid_out = _iterated(op, args, kwargs, result)
    if _allocated_like_self(op, args, kwargs):
        if isinstance(laid_out, tuple):
            return tuple(kept_dense_strides(args[0], out) if isinstance(out, torch.Tensor) else out for out in laid_out)
        return kept_dense_strides(args[0], laid_out) if isinstance(laid_out, torch.Tensor) else laid_out
    return laid_out


def _rot90(self: torch.Tensor, result: torch.Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> torch.Tensor:
    """rot90's result as the kernel makes it: ``flip`` (which keeps a dense ``self``'s strides),
    then a transpose of ``dims`` for a quarter or three quarters of a turn; a whole turn is a
    contiguous clone, which the meta kernel gets right."""
    turns = k % 4
    if turns == 0 or _symbolic((result, self), []) or not is_non_overlapping_and_dense_or_false(self):
        return result
    strides = list(self.stride())
    if turns in (1, 3):
        first, second = (dim % self.dim() for dim in dims)
        strides[first], strides[second] = strides[second], strides[first]
    return result if result.stride() == tuple(strides) else result.new_empty_strided(result.shape, strides)


def _allocated_like_self(op: OpOverload, args: tuple, kwargs: dict) -> bool:
    if op is _ISINF:  # of integers and bools: zeros_like(self, kBool), never infinite
        return isinstance(args[0], torch.Tensor) and not (args[0].is_floating_point() or args[0].is_complex())
    return op in _ALLOCATED_LIKE_SELF and kwargs.get("memory_format") in (None, torch.preserve_format)


def _iterated(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> Any:
    if op in _ALLOCATED_CONTIGUOUS:
        return _allocated_contiguous(op, result)
    operands = operands_of(op, args, kwargs)
    if not operands:
        return result
    outputs = result if isinstance(result, tuple) else (result,)
    if not all(isinstance(out, torch.Tensor) for out in outputs) or _symbolic(outputs, operands):
        return result
    shape = outputs[0].shape
    first = operands[0]
    of_complex = _OF_A_COMPLEX_TENSOR.get(op) if isinstance(first, torch.Tensor) and first.is_complex() else None
    if of_complex == "the kernel's":  # the kernel allocates empty_like(self)
        return kept_dense_strides(first, result)
    if op in _CONTIGUOUS or of_complex == "contiguous":
        strides = make_contiguous_strides_for(shape)
    elif of_complex == "its real part's":
        strides = tensor_iterator_strides(shape, [torch.view_as_real(first).select(-1, 0)])
    elif op is _ISINF and first.is_floating_point():
        # self.abs() == inf: TensorIterator over abs's result and a wrapped number
        absolute = first.new_empty_strided(shape, tensor_iterator_strides(shape, [first]))
        strides = tensor_iterator_strides(shape, [absolute, math.inf])
    else:
        strides = tensor_iterator_strides(shape, _cast_on_the_host(op, operands))
    laid_out = tuple(out if out.stride() == strides or out.shape != outputs[0].shape
                     else out.new_empty_strided(out.shape, strides) for out in outputs)
    return laid_out if isinstance(result, tuple) else laid_out[0]


def plainly_iterated_operands(op: OpOverload, args: tuple, kwargs: dict) -> list | None:
    """The operands over which TensorIterator lays ``op``'s result out as `relayout` lays out a
    static one with nothing particular to the op: no layout the kernel chooses itself, no complex
    operand, nothing cast before iterating. None for any other call."""
    if op in _ALLOCATED_CONTIGUOUS or op in _CONTIGUOUS or op is _ISINF or op is _ROT90 or \
            _allocated_like_self(op, args, kwargs):
        return None
    operands = operands_of(op, args, kwargs)
    if not operands or any(isinstance(operand, torch.Tensor) and operand.is_complex() for operand in operands):
        return None
    return operands if _cast_on_the_host(op, operands) is operands else None


def kept_dense_strides(self: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``result`` as a real device's ``empty_like(self)`` lays it out: a dense ``self``'s strides
    exactly, where the meta kernel recomputed those of size-1 dims; any other result as it is."""
    if (result.shape == self.shape and result.stride() != self.stride() and not _symbolic((result, self), [])
            and is_non_overlapping_and_dense_or_false(self)):
        return result.new_empty_strided(result.shape, self.stride())
    return result


def _cast_on_the_host(op: OpOverload, operands: list) -> list:
    """On the CPU, a binary op's TensorIterator first casts an input of another dtype than the
    common one (``Tensor.to``, which keeps a dense layout and lays any other out densely in the
    order of its strides, as ``empty_like`` does) and iterates over the copy: an expanded float16
    input beside a float32 one iterates as a contiguous tensor, a permuted slice as a dense
    tensor permuted alike."""
    if _operand_arguments(op) not in _BINARY_OPERANDS or len(operands) != 2:
        return operands
    tensors = [operand for operand in operands if isinstance(operand, torch.Tensor)]
    dtypes = {tensor.dtype for tensor in tensors}
    if not dtypes or (len(tensors) == 2 and len(dtypes) == 1 and op not in _INT_TO_FLOAT):
        return operands  # nothing to cast
    common = elementwise_dtypes(*operands, type_promotion_kind=_INT_TO_FLOAT.get(op, _DEFAULT))[1]
    if dtypes == {common}:
        return operands
    device = context.node_device()
    if device is not None and device.type != "cpu":
        return operands
    return [operand if not isinstance(operand, torch.Tensor) or operand.dtype == common else cast_copy(operand)
            for operand in operands]


def cast_copy(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor.to(dtype)``'s layout: a dense layout kept, any other laid out densely in the order of its strides."""
    if is_non_overlapping_and_dense_or_false(tensor):
        return tensor if dtype is None else tensor.new_empty_strided(tensor.shape, tensor.stride(), dtype=dtype)
    return torch.empty_like(tensor, dtype=dtype, device="meta")


_BINARY_OPERANDS = (((0, "self"), (1, "other")),)
_DEFAULT = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
# Binary ops whose iterator promotes integer inputs to floats too (``build_borrowing_binary_float_op``).
_INT_TO_FLOAT = {op: ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
                 for op in (aten.div.Tensor, aten.true_divide.Tensor, aten.atan2.default)}


def _symbolic(outputs: tuple, operands: list) -> bool:
    return any(isinstance(size, torch.SymInt) for t in (*outputs, *operands) if isinstance(t, torch.Tensor)
               for size in (*t.shape, *t.stride()))


def _allocated_contiguous(op: OpOverload, result: Any) -> Any:
    outputs = list(result) if isinstance(result, tuple) else [result]
    for position in _ALLOCATED_CONTIGUOUS[op]:
        out = outputs[position]
        if isinstance(out, torch.Tensor) and not _symbolic((out,), []):
            strides = make_contiguous_strides_for(out.shape)
            if out.stride() != strides:
                outputs[position] = out.new_empty_strided(out.shape, strides)
    return tuple(outputs) if isinstance(result, tuple) else outputs[0]
