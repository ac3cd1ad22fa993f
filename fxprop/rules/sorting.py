"""Sorting ops whose meta kernels accept what every real kernel refuses."""
from __future__ import annotations

import torch

from ..registry import rule
from .reductions import wrap_dim

aten = torch.ops.aten


def _sort_checking_dim(op, name: str):
    """Corrects aten.sort's meta kernels, which accept any ``dim``: real kernels wrap it against the rank."""
    def sort(self, *args, **kwargs):
        dim = kwargs.get("dim", args[1] if name == "sort.stable" and len(args) > 1 else
                         args[0] if name == "sort" and args else -1)
        wrap_dim(dim, self.dim())
        return op(self, *args, **kwargs)
    sort.__name__ = sort.__qualname__ = f"{name.replace('.', '_')}_checking_dim"
    return rule(op)(sort)


_sort_checking_dim(aten.sort.default, "sort")
_sort_checking_dim(aten.sort.stable, "sort.stable")
