"""What the real kernels check when an op writes its result into ``self``.

An in-place op (tagged ``inplace``, e.g. ``add_``, ``ge_``, ``addmm_``, ``masked_fill_``) must
produce a result of exactly ``self``'s shape, and for ops that compute a new dtype the result
type must cast to ``self``'s (TensorIterator's ``check_can_cast``). torch's meta kernels resize
``self`` instead (``a.ge_(b)`` with ``a`` (5, 1) and ``b`` (5, 5) becomes (5, 5)) or keep a result
type that cannot be written back. The functional twin of the op (``add`` for ``add_``) says what
the result would be, computed on meta before the in-place kernel runs.

TensorIterator also refuses to write into a tensor some of whose elements share memory (an
``expand``ed tensor): every elementwise in-place op, ``copy_`` and elementwise ``out=`` calls.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from ..call import tensors_in
from ..engine.session import node_device
from ..kinds.shortcuts import shortcut_result
from ..torch_compat import (OpOverload, check, has_kernel, has_symbolic_layout, internal_overlap,
                            is_non_overlapping_and_dense, overload_name, pytree, scalar_type_name, schema_of,
                            storage_key)

aten = torch.ops.aten
_RESHAPING_SELF = ("resize", "set_", "squeeze", "transpose", "swap", "as_strided")


@lru_cache(maxsize=None)
def reshapes_in_place(op: OpOverload) -> bool:
    """Whether ``op`` may change the sizes, strides or storage of a tensor it is given (``resize_``,
    ``set_``, ``transpose_``, ``as_strided_``, and an ``out=`` tensor, which a kernel resizes to
    its result), as opposed to only writing its values."""
    schema = schema_of(op)
    name = schema.name.split("::", 1)[-1]
    if not (schema.is_mutable or name.endswith("_")):
        return False
    writes_out = any(argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write
                     for argument in schema.arguments)
    return writes_out or name == "t_" or any(part in name for part in _RESHAPING_SELF)


@lru_cache(maxsize=None)
def functional_twin(op: OpOverload) -> OpOverload | None:
    """``aten.add.Tensor`` for ``aten.add_.Tensor`` (``aten.__and__.Scalar`` for ``aten.__iand__.Scalar``);
    None when ``op`` writes no ``self`` or has no twin."""
    if torch.Tag.inplace not in op.tags or op.namespace != "aten":
        return None
    name = schema_of(op).name.split("::", 1)[1]
    if name.startswith("__i") and name.endswith("__"):
        functional = "__" + name[len("__i"):]
    else:
        functional = name.removesuffix("_") if name.endswith("_") else None
    packet = getattr(aten, functional, None) if functional is not None else None
    if packet is None:
        return None

    def arguments(overload: OpOverload, defaults: bool = False) -> list:
        return [(a.name, str(a.type), a.default_value if defaults and a.has_default_value() else None)
                for a in schema_of(overload).arguments]
    # The twin is the overload that takes the same arguments, whatever its name: pow_.Tensor's is
    # pow.Tensor_Tensor and floor_divide_.Tensor's floor_divide.default; pow_.Scalar(Tensor self,
    # Scalar exponent) is no pow.Scalar(Scalar self, Tensor exponent). Under another name the
    # defaults must agree too (bernoulli_.float's p has one, bernoulli.p's none).
    overload = getattr(packet, overload_name(op), None)
    if overload is None or arguments(overload) != arguments(op):
        overload = next((candidate for candidate in (getattr(packet, other) for other in packet.overloads())
                         if arguments(candidate, defaults=True) == arguments(op, defaults=True)), None)
        if overload is None:
            return None
    if overload.is_view or name == "t_" or any(part in name for part in _RESHAPING_SELF):
        return None  # unsqueeze_, transpose_, resize_ are meant to change self's shape
    return overload


def check_writes_into_self(op: OpOverload, args: tuple, kwargs: dict) -> None:
    """Refuse an in-place call whose result would not fit ``self`` as real kernels refuse it."""
    check_no_overlapping_write(op, args, kwargs)
    twin = functional_twin(op)
    if twin is None or not args or not isinstance(args[0], torch.Tensor):
        return
    self = args[0]
    promotion = _promotion_key(twin, args, kwargs)
    known = _pointwise_dtypes.get(promotion) if promotion is not None else None
    if known is not None:
        try:
            shape = _broadcast_shape([t.shape for t in tensors_in(args, kwargs)])
        except RuntimeError:
            known = None  # the twin raises what the real kernel says about the shapes
    if known is not None:
        result_shape, result_dtype = shape, known
    else:
        result = shortcut_result(twin, args, kwargs)
        if result is None:
            result = twin(*args, **kwargs)
        if not isinstance(result, torch.Tensor):
            return
        result_shape, result_dtype = result.shape, result.dtype
        if promotion is not None and len(_pointwise_dtypes) < _DTYPES_KEPT:
            _pointwise_dtypes[promotion] = result_dtype
    check(result_shape == self.shape,
          lambda: f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(result_shape)}")
    if torch.Tag.pointwise in op.tags:
        check(torch.can_cast(result_dtype, self.dtype),
              lambda: f"result type {scalar_type_name(result_dtype)} can't be cast to the desired output type {scalar_type_name(self.dtype)}")


def _broadcast_shape(shapes: list) -> torch.Size:
    """``torch.broadcast_shapes``, answered on sight where every shape is the same ints (an in-place
    unary op, or ``add_`` of a like tensor): torch's python check costs more than the op's rule."""
    first = shapes[0]
    if all(type(size) is int for shape in shapes for size in shape) and all(shape == first for shape in shapes[1:]):
        return first
    return torch.broadcast_shapes(*shapes)


_pointwise_dtypes: dict[tuple, torch.dtype] = {}
"""The result dtype of a pointwise twin by what decides it (`_promotion_key`): a fact of the op, so
that an in-place call need not run its twin's python reference again only to learn it."""
_DTYPES_KEPT = 1 << 14
_PROMOTION_SCALARS = (bool, int, float, complex)


def _promotion_key(twin: OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """Everything a pointwise op's result dtype depends on: its tensors' dtypes and whether each is
    0-dim (type promotion ranks those below dimensioned tensors), the python types of its numbers,
    its string and None arguments as they are (``rounding_mode``), and the default dtype. None for
    ops that are not pointwise and for calls with symbolic sizes or anything else among the arguments."""
    if torch.Tag.pointwise not in twin.tags:
        return None
    parts: list = [twin, torch.get_default_dtype()]
    for name, value in (*((None, value) for value in args), *kwargs.items()):
        if name is not None:
            parts.append(name)
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided or any(isinstance(size, torch.SymInt) for size in value.shape):
                return None
            parts.append((value.dtype, value.dim() == 0))
        elif type(value) in _PROMOTION_SCALARS:
            parts.append(type(value))
        elif value is None or isinstance(value, (str, torch.dtype)):
            parts.append(value)
        else:
            return None
    return tuple(parts)


@lru_cache(maxsize=4096)
def is_elementwise(op: OpOverload) -> bool:
    """Tagged pointwise, or the in-place or out= form of an op that is (``abs_``, ``ge_``,
    ``gelu.out``: torch tags only some)."""
    if torch.Tag.pointwise in op.tags:
        return True
    twin = functional_twin(op)
    return (twin is not None and torch.Tag.pointwise in twin.tags) or _out_form_of_pointwise(op)


def _fills_at_random(op: OpOverload) -> bool:
    """``uniform_``, ``bernoulli_``, ``rand(out=)``: random fills of a tensor run by TensorIterator."""
    return torch.Tag.nondeterministic_seeded in op.tags and schema_of(op).is_mutable


def _out_form_of_pointwise(op: OpOverload) -> bool:
    schema = schema_of(op)
    if op.namespace != "aten" or not schema.is_mutable or not any(a.name == "out" for a in schema.arguments):
        return False
    inputs = [(a.name, str(a.type)) for a in schema.arguments if a.name != "out"]
    packet = getattr(aten, schema.name.split("::", 1)[1])
    return any(torch.Tag.pointwise in overload.tags and not schema_of(overload).is_mutable
               and [(a.name, str(a.type)) for a in schema_of(overload).arguments] == inputs
               for overload in (getattr(packet, name) for name in packet.overloads()))


@lru_cache(maxsize=4096)
def checked_before_the_meta_kernel(op: OpOverload) -> bool:
    """Whether fxprop checks ``op``'s writes into overlapping memory itself, as TensorIterator does:
    elementwise ops, ``copy_`` and random fills, but not an ``out=`` form whose kernel is composite
    (``clone.out`` computes a new tensor, then copies it: nothing is checked; `host_overlap` asks)."""
    if _out_form_of_pointwise(op) and not (has_kernel(op.name(), "CPU") or has_kernel(op.name(), "CUDA")):
        return False
    return is_elementwise(op) or op is aten.copy_.default or _fills_at_random(op)


def host_decides_self_overlap(op: OpOverload) -> bool:
    """Whether a write into a tensor whose own elements share memory is asked of the host's kernel
    (`host_overlap`) rather than refused by TensorIterator's rule: on a CPU node, where the host's
    kernel is the node's (the CPU's ``masked_fill_`` only warns that this is deprecated, and
    writes), for any op but a random one, which would draw from the generator."""
    device = node_device()
    return (device is None or device.type == "cpu") and torch.Tag.nondeterministic_seeded not in op.tags


def check_no_overlapping_write(op: OpOverload, args: tuple, kwargs: dict) -> None:
    if not checked_before_the_meta_kernel(op):
        return
    if op is aten.copy_.default and len(args) > 1 and _same_view(args[0], args[1]):
        return  # copy_ returns before it looks: nothing to write
    if op is aten.conj_physical_.default and args and not args[0].is_complex():
        return  # the conjugate of a real tensor is the tensor: nothing is written
    written = written_arguments(op, args, kwargs)
    if op is aten.copy_.default and len(args) > 1 and _converts_by_fbgemm(args[0], args[1]):
        return  # the CPU converts float32 and float16 with FBGEMM, before TensorIterator checks anything
    # TensorIterator compares each output with the inputs only: outputs may overlap each other (frexp's)
    inputs = [value for value in pytree.tree_leaves((args, kwargs))
              if isinstance(value, torch.Tensor) and not any(value is out for out in written)]
    host_decides = host_decides_self_overlap(op)
    for tensor in written:
        check(host_decides or not (isinstance(tensor, torch.Tensor) and internal_overlap(tensor) == 1),
              lambda: "unsupported operation: more than one element of the written-to tensor refers to a single "
                      "memory location. Please clone() the tensor before performing the operation.")
        check(not any(partially_overlap(tensor, other) for other in inputs),
              lambda: "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                      "single memory location. Please clone() the tensor before performing the operation.")


def _converts_by_fbgemm(self: torch.Tensor, src: Any) -> bool:
    """ATen's copy_ fast path between float32 and float16 CPU tensors of one size and layout."""
    device = node_device()
    if not isinstance(src, torch.Tensor):
        return False  # a number: copied as a 0-dim tensor by TensorIterator
    return "fbgemm" in torch.backends.quantized.supported_engines and (
        {self.dtype, src.dtype} == {torch.float32, torch.float16} and (device is None or device.type == "cpu")
        and not has_symbolic_layout(self) and not has_symbolic_layout(src) and self.shape == src.shape
        and ((self.is_contiguous() and src.is_contiguous())
             or (is_non_overlapping_and_dense(self) and self.stride() == src.stride())))


def partially_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's overlap test between a written tensor and an input (``get_overlap_status``): dense
    views of one storage whose byte ranges meet without being the same view. Views that are not
    dense are too hard to tell, and torch lets them pass."""
    if a is b or has_symbolic_layout(a) or has_symbolic_layout(b) or not a.numel() or not b.numel():
        return False
    if storage_key(a) != storage_key(b) or not (is_non_overlapping_and_dense(a) and is_non_overlapping_and_dense(b)):
        return False
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if (a_begin, a_end) == (b_begin, b_end):
        return a.stride() != b.stride()
    return a_begin < b_end and b_begin < a_end


def written_arguments(op: OpOverload, args: tuple, kwargs: dict) -> list:
    """The tensors the op writes into, by its schema: ``self`` of an in-place op, ``out`` and the
    other out arguments (frexp's ``mantissa`` and ``exponent``)."""
    written = []
    for position, argument in enumerate(schema_of(op).arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or position >= len(args) else args[position]
        if isinstance(value, torch.Tensor):
            written.append(value)
    return written


def _same_view(a: Any, b: Any) -> bool:
    """ATen's copy_ test for "the same data": one storage, offset, sizes, strides and dtype."""
    if a is b:
        return True
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and storage_key(a) == storage_key(b)
            and a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
            and a.dtype == b.dtype and a.is_conj() == b.is_conj() and a.is_neg() == b.is_neg())


