"""Triangular parts of matrices. The CPU and CUDA kernels lay their output out afresh, contiguous,
where the reference behind the meta kernel (``torch._refs.tril``) ends in ``.contiguous()``, which
keeps an already-contiguous input's strides, those of its size-1 dims included. Those strides
are not significant for the value, but TensorIterator reads them when it lays out the ops that
follow (``tril(x) + y``)."""
from __future__ import annotations

import torch

from .. import symbolic
from ..resolve.registry import rule

aten = torch.ops.aten


def _laid_out_afresh(result: torch.Tensor) -> torch.Tensor:
    return result.as_strided(result.shape, symbolic.contiguous_strides(result.shape))


@rule(aten.tril.default)
def tril(self, diagonal=0):
    return _laid_out_afresh(aten.tril.default(self, diagonal))


@rule(aten.triu.default)
def triu(self, diagonal=0):
    return _laid_out_afresh(aten.triu.default(self, diagonal))
