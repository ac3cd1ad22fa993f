"""Sorting and searching ops whose meta kernels accept what every real kernel refuses."""
from __future__ import annotations

import torch

from ..aten.layout import kept_dense_strides
from ..resolve.registry import rule
from ..torch_compat import check
from .reductions import wrap_dim

aten = torch.ops.aten


def _sort_checking_dim(op, name: str):
    """Corrects aten.sort's meta kernels, which accept any ``dim`` (real kernels wrap it against the
    rank) and lay a dense ``self``'s results out anew: real kernels give values and indices
    ``self``'s strides exactly, those of size-1 dims included."""
    def sort(self, *args, **kwargs):
        dim = kwargs.get("dim", args[1] if name == "sort.stable" and len(args) > 1 else
                         args[0] if name == "sort" and args else -1)
        wrap_dim(dim, self.dim())
        values, indices = op(self, *args, **kwargs)
        return kept_dense_strides(self, values), kept_dense_strides(self, indices)
    sort.__name__ = sort.__qualname__ = f"{name.replace('.', '_')}_checking_dim"
    return rule(op)(sort)


_sort_checking_dim(aten.sort.default, "sort")
_sort_checking_dim(aten.sort.stable, "sort.stable")


def _bucketize(op):
    """Corrects aten.bucketize's meta kernels, which take boundaries of any rank: real kernels take one dim."""
    def with_1d_boundaries(self, boundaries, **kwargs):
        check(boundaries.dim() == 1, lambda: f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
        return op(self, boundaries, **kwargs)
    with_1d_boundaries.__name__ = with_1d_boundaries.__qualname__ = f"{op.__name__.replace('.', '_')}_with_1d_boundaries"
    return rule(op)(with_1d_boundaries)


_bucketize(aten.bucketize.Tensor)
_bucketize(aten.bucketize.Scalar)
