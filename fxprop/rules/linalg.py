"""Matrix products: every real kernel (CPU, CUDA) refuses operands of different dtypes, where
these meta kernels compute a result anyway (e.g. F.linear of a bfloat16 input by float32 weights).

Grouped products (``_grouped_mm``, MoE experts): torch's meta kernel checks CUDA's requirements on
every device, bfloat16 operands and result, where the CPU kernel (the composite fallback of
``aten/src/ATen/native/GroupedMMUtils.h``) takes float32, bfloat16 and float16 operands with a
result of mat_a's dtype; and on a build without CUDA the meta kernel allocates its result
contiguous, where the CPU kernel pads the rows of its result to 16 bytes as CUDA's does."""
from __future__ import annotations

from typing import Any

import torch

from .. import symbolic
from ..engine import session as context
from ..engine.composite_kernels import call_composite
from ..resolve.registry import rule
from ..symbolic import known_laid_out_in
from ..torch_compat import check

aten = torch.ops.aten


def _same_dtype(message: str, first: torch.Tensor, second: torch.Tensor) -> None:
    check(first.dtype == second.dtype, lambda: message.format(first.dtype, second.dtype))


def _self_expands_to(self: torch.Tensor, rows, columns) -> None:
    """The real kernels expand ``self`` to the product's shape; the meta kernels never check it."""
    aten.expand.default(self, [rows, columns])


@rule(aten.mm.default)
def mm(self, mat2):
    """Corrects aten.mm's meta kernel: refuses operands of different dtypes."""
    _same_dtype("expected m1 and m2 to have the same dtype, but got: {} != {}", self, mat2)
    return aten.mm.default(self, mat2)


@rule(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    """Corrects aten.addmm's meta kernel: refuses operands of different dtypes and a ``self`` that
    does not expand to the product's shape."""
    _same_dtype("mat1 and mat2 must have the same dtype, but got {} and {}", mat1, mat2)
    _same_dtype("self and mat2 must have the same dtype, but got {} and {}", self, mat2)
    if mat1.dim() == 2 and mat2.dim() == 2:
        _self_expands_to(self, mat1.shape[0], mat2.shape[1])
    return aten.addmm.default(self, mat1, mat2, beta=beta, alpha=alpha)


@rule(aten.linear.default)
def linear(*args, **kwargs):
    """ATen's linear of an input of three or more dims, known contiguous, by a matrix and a vector
    bias, flattens it (``_flatten_nd_linear``): a view of the input as rows, ``addmm`` of the bias,
    the rows and the weight transposed, and a view back. With symbolic sizes ATen decides and
    computes that in SymInt arithmetic through python, and reshapes through torch's python view:
    there, the same ops are called here, their sizes as expressions. Anything else, every linear
    of concrete sizes and every call spelled otherwise than ``linear(input, weight, bias)``, runs
    torch's own."""
    return _flattened_or_torchs_own(aten.linear.default, args, kwargs)


@rule(torch.nn.functional.linear)
def functional_linear(*args, **kwargs):
    return _flattened_or_torchs_own(torch.nn.functional.linear, args, kwargs)


def _flattened_or_torchs_own(linear: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) != 3 or not _flattens_on_sight(*args):
        return call_composite(linear, args, kwargs, context.node_device())
    input, weight, bias = args
    sizes = input.shape
    rows = sizes[0]
    for size in sizes[1:-1]:
        rows = rows * size
    product = aten.addmm.default(bias, aten.view.default(input, [rows, sizes[-1]]), aten.t.default(weight))
    return aten.view.default(product, [*sizes[:-1], product.shape[1]])


def _flattens_on_sight(input: Any, weight: Any, bias: Any) -> bool:
    tensors = (input, weight, bias)
    return (all(type(tensor) is torch.Tensor for tensor in tensors) and symbolic.current().active
            and input.dim() >= 3 and weight.dim() == 2 and bias.dim() == 1
            and len({tensor.dtype for tensor in tensors}) == 1 and input.dtype.is_floating_point
            and type(bias.stride(0)) is int and (bias.stride(0) == 1 or (type(bias.shape[0]) is int and bias.shape[0] == 1))
            and known_laid_out_in(input.shape, input.stride(), torch.contiguous_format))


@rule(aten.mv.default)
def mv(self, vec):
    """Corrects aten.mv's meta kernel: refuses operands of different dtypes."""
    _same_dtype("addmv input tensors must have the same dtype, but got {} and {}", self, vec)
    return aten.mv.default(self, vec)


@rule(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """Corrects aten.addbmm's meta kernel: refuses operands of different dtypes and a ``self`` that
    does not expand to the product's shape."""
    _same_dtype("mat1 and mat2 must have the same dtype, but got {} and {}", batch1, batch2)
    _same_dtype("self and mat2 must have the same dtype, but got {} and {}", self, batch2)
    if batch1.dim() == 3 and batch2.dim() == 3:
        _self_expands_to(self, batch1.shape[1], batch2.shape[2])
    return aten.addbmm.default(self, batch1, batch2, beta=beta, alpha=alpha)


_GROUPED_MM_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _grouped_mm_operand(mat: torch.Tensor) -> None:
    """The CPU kernel's ``check_valid_strides_and_return_transposed``: the last two dims row- or
    column-major, the other stride a multiple of 16 bytes."""
    end = mat.dim() - 1
    alignment = 16 // mat.element_size()
    stride, size = mat.stride(), mat.shape
    if stride[end - 1] == 1 and stride[end] >= max(1, size[end - 1]):
        check(stride[end] % alignment == 0, lambda: "strides should be multiple of 16 bytes")
    elif stride[end] == 1 and stride[end - 1] >= max(1, size[end]):
        check(stride[end - 1] % alignment == 0, lambda: "strides should be multiple of 16 bytes")
    else:
        check(False, lambda: f"Invalid strides/sizes, got {list(stride)} for strides and {list(size)} for sizes")


def _grouped_mm_result(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None,
                       dtype: torch.dtype) -> torch.Tensor:
    """``create_grouped_gemm_output_tensor``: the result's rows padded to 16 bytes."""
    a_2d, b_2d = mat_a.dim() == 2, mat_b.dim() == 2
    if a_2d and b_2d:
        size = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]]
    elif a_2d:
        check(offs.shape[0] == mat_b.shape[0], lambda: "matrix batch sizes have to match")
        size = [mat_a.shape[0], mat_b.shape[-1]]
    elif b_2d:
        check(offs.shape[0] == mat_a.shape[0], lambda: "matrix batch sizes have to match")
        size = [mat_a.shape[1], mat_b.shape[1]]
    else:
        check(mat_a.shape[0] == mat_b.shape[0], lambda: "batched dimension has to match")
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    if torch.version.hip:
        return mat_a.new_empty(size, dtype=dtype)
    alignment = 16 // dtype.itemsize
    padded = (size[-1] + alignment - 1) // alignment * alignment
    stride = [padded, 1] if a_2d != b_2d else [size[1] * padded, padded, 1]
    return mat_a.new_empty_strided(size, stride, dtype=dtype)


@rule(aten._grouped_mm.default)
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Corrects aten._grouped_mm's meta kernel on the CPU: the CPU kernel's dtypes, checks and layout."""
    device = context.node_device()
    if device is None or device.type != "cpu":
        return aten._grouped_mm.default(mat_a, mat_b, offs, bias, out_dtype)
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        check(mat.dtype in _GROUPED_MM_CPU_DTYPES,
              lambda: f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {mat.dtype}")
        check(mat.dim() in (2, 3), lambda: f"{name} has to be 2 or 3d")
    if mat_a.dim() == 3 or mat_b.dim() == 3:
        check(mat_a.shape[-1] == mat_b.shape[-2], lambda: "contraction dimension of mat_a and mat_b must match")
    _grouped_mm_operand(mat_a)
    _grouped_mm_operand(mat_b)
    check((offs is not None) == (mat_a.dim() == 2 or mat_b.dim() == 2),
          lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None:
        check(offs.dim() == 1, lambda: "offs has to be 1D")
        check(offs.dtype == torch.int32, lambda: "Offsets have to be int32")
    check(bias is None, lambda: "Bias not supported yet")
    dtype = out_dtype or mat_a.dtype
    check(dtype == mat_a.dtype, lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    return _grouped_mm_result(mat_a, mat_b, offs, dtype)
