"""Results their kernels allocate afresh, contiguous, computed directly: the triangular parts of
matrices (``triu``, ``tril``) and ``arange`` of python ints.

Their meta kernels are torch's python references: a triangular part is a mask built from two
``arange``s and a ``where``; ``arange`` is ``iota`` through the prims, each a few hundred
microseconds to a millisecond. What the kernels allocate is plain: the input's sizes (the
triangular parts; `fxprop.rules.triangular` lays them out afresh), or ``len(range(start, end, step))``
elements.

Calls the kernels refuse (a triangular part of fewer than two dims; a step of 0 or of the wrong
sign; a bool ``arange``) and anything less plain (float or symbolic bounds, whose length needs
rounding or deciding; bounds of 2**31 or more, near the kernels' int64 and double limits) return
None, and the meta kernel runs, checks and raises as before.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .direct import FLOATS, INTEGERS, contiguous_result

aten = torch.ops.aten
_EXACT = 1 << 31  # bounds whose length the kernels' int64 and double arithmetic computes exactly, as range does


def triangular_part(input: Any, diagonal: Any = 0) -> torch.Tensor | None:
    if not isinstance(input, torch.Tensor) or input.dim() < 2 or type(diagonal) is not int or input.dtype.is_complex:
        return None
    return contiguous_result(input, input.dtype)


def arange(end: Any, **options: Any) -> torch.Tensor | None:
    return arange_start_step(0, end, 1, **options)


def arange_start(start: Any, end: Any, **options: Any) -> torch.Tensor | None:
    return arange_start_step(start, end, 1, **options)


def arange_start_step(start: Any, end: Any, step: Any = 1, *, dtype: Any = None, layout: Any = None,
                      device: Any = None, pin_memory: Any = None) -> torch.Tensor | None:
    if not all(type(bound) is int and abs(bound) < _EXACT for bound in (start, end, step)) or step == 0 or \
            (end - start) * step < 0:
        return None
    if layout not in (None, torch.strided) or pin_memory not in (None, False) or \
            (dtype is not None and dtype not in FLOATS | INTEGERS):
        return None
    return torch.empty((len(range(start, end, step)),), dtype=dtype or torch.int64, device="meta")


DIRECT_CONTIGUOUS: dict[Any, Callable[..., Any]] = {
    aten.triu.default: triangular_part,
    aten.tril.default: triangular_part,
    aten.arange.default: arange,
    aten.arange.start: arange_start,
    aten.arange.start_step: arange_start_step,
}
