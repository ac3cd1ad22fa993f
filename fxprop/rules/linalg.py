"""Matrix products: every real kernel (CPU, CUDA) refuses operands of different dtypes, where
these meta kernels compute a result anyway (e.g. F.linear of a bfloat16 input by float32 weights)."""
from __future__ import annotations

import torch

from ..resolve.registry import rule
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
