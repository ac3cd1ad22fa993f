"""``sum`` and ``mean`` over dims, computed directly.

Their meta kernels are torch's python references under symbolic sizes (a reduction prim, a
division, a broadcast back for ``keepdim``: several milliseconds a call). What the structured
kernels allocate is plain: a contiguous tensor of the input's sizes with the reduced dims made 1
(``keepdim``) or dropped, on every device and whatever the input's layout.

Only a floating input kept in its own dtype takes the shortcut, reduced over distinct dims in
range; anything else (an integer sum's promotion, a duplicated dim) returns None, and the meta
kernel runs, checks and raises as before.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .direct import FLOATS, empty_contiguous, wrapped_dim

aten = torch.ops.aten

def reduced_over_dims(input: Any, dim: Any = None, keepdim: Any = False, *, dtype: Any = None) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or (dtype is not None and dtype != input.dtype) \
            or type(keepdim) is not bool:
        return None
    rank = input.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        reduced = set(range(rank))
    elif isinstance(dim, (list, tuple)):
        wrapped = [wrapped_dim(d, rank) for d in dim]
        if None in wrapped or len(set(wrapped)) != len(wrapped):
            return None
        reduced = set(wrapped)
    else:
        return None
    shape = [1 if i in reduced else size for i, size in enumerate(input.shape) if keepdim or i not in reduced]
    return empty_contiguous(shape, input.dtype)


DIRECT_REDUCTIONS: dict[Any, Callable[..., Any]] = {
    aten.sum.dim_IntList: reduced_over_dims,
    aten.mean.dim: reduced_over_dims,
}
