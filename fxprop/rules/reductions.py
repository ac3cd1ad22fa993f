"""Reductions whose meta kernels accept what every real kernel refuses."""
from __future__ import annotations

import torch

from ..registry import rule
from ..torch_compat import canonicalize_dim, check, check_index

aten = torch.ops.aten


def wrap_dim(dim: int, ndim: int) -> int:
    """torch's maybe_wrap_dim: a 0-dim tensor takes dims -1 and 0; the error is torch's IndexError."""
    return canonicalize_dim(max(ndim, 1), dim)


def _reduction_needing_elements(op, name: str, default_dim: int | None = None):
    """Corrects the meta kernel of a reduction that returns an element of its input (max, min,
    median, mode): real kernels refuse a zero-size reduced dim, which has no element to return."""
    def of_nonempty(self, *args, **kwargs):
        if args or "dim" in kwargs or default_dim is not None:
            dim = args[0] if args else kwargs.get("dim", default_dim)
            if self.dim() > 0:
                wrapped = dim + self.dim() if dim < 0 else dim
                check_index(not (0 <= wrapped < self.dim()) or self.shape[wrapped] != 0,
                            lambda: f"{name}(): Expected reduction dim {wrapped} to have non-zero size.")
        else:
            check(self.numel() != 0, lambda: f"{name}(): Expected reduction dim to be specified for "
                                              "input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
        return op(self, *args, **kwargs)
    of_nonempty.__name__ = of_nonempty.__qualname__ = f"{name}_of_nonempty"
    return rule(op)(of_nonempty)


for _op, _name in [(aten.max.dim, "max"), (aten.min.dim, "min"), (aten.max.default, "max"),
                   (aten.min.default, "min"), (aten.median.dim, "median"), (aten.nanmedian.dim, "nanmedian")]:
    _reduction_needing_elements(_op, _name)
_reduction_needing_elements(aten.mode.default, "mode", default_dim=-1)


def _softmax_checking_dim(op):
    """Corrects the softmax meta kernels, which accept any ``dim``: real kernels wrap it against the rank."""
    def softmax(self, dim, half_to_float):
        wrap_dim(dim, self.dim())
        return op(self, dim, half_to_float)
    softmax.__name__ = softmax.__qualname__ = f"{op.__name__.split('.')[0].lstrip('_')}_checking_dim"
    return rule(op)(softmax)


_softmax_checking_dim(aten._softmax.default)
_softmax_checking_dim(aten._log_softmax.default)
