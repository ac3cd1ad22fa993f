"""Elementwise ops of a tensor and python numbers computed directly: ``clamp``, ``clamp_min``,
``clamp_max``, ``hardtanh``, ``relu6`` and ``pow`` to a number, and their in-place forms.

Their meta kernels are torch's python references: a clamp is a ``where`` of two comparisons, each
dispatched again, about a millisecond a call. What they give is the input's sizes and dtype, laid out
as TensorIterator lays out an elementwise result (`fxprop.kinds.direct.elementwise_result`).

Only calls whose dtype no number changes take the shortcut: a floating tensor with real numbers,
an integer tensor with python ints. Anything else -- a float bound that promotes an integer
tensor, bools, which the kernels refuse, clamp without a bound, a negative power of an integer --
returns None, and the meta kernel runs, checks and raises as before.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .direct import FLOATS, INTEGERS, elementwise_result, in_place_forms

aten = torch.ops.aten


def _keeps_dtype(input: Any, *numbers: Any) -> bool:
    if not isinstance(input, torch.Tensor):
        return False
    if input.dtype in FLOATS:
        return all(type(number) in (int, float) for number in numbers)
    return input.dtype in INTEGERS and all(type(number) is int for number in numbers)


def _same_elementwise(input: torch.Tensor) -> torch.Tensor | None:
    return elementwise_result(input.shape, input.dtype, (input,))


def clamp(input: Any, min: Any = None, max: Any = None) -> torch.Tensor | None:
    bounds = [bound for bound in (min, max) if bound is not None]
    if not bounds or not _keeps_dtype(input, *bounds):
        return None
    return _same_elementwise(input)


def clamp_min(input: Any, min: Any) -> torch.Tensor | None:
    return clamp(input, min=min)


def clamp_max(input: Any, max: Any) -> torch.Tensor | None:
    return clamp(input, max=max)


def hardtanh(input: Any, min_val: Any = -1, max_val: Any = 1) -> torch.Tensor | None:
    return _same_elementwise(input) if _keeps_dtype(input, min_val, max_val) else None


def relu6(input: Any) -> torch.Tensor | None:
    return hardtanh(input, 0, 6)


def pow_to_a_number(input: Any, exponent: Any) -> torch.Tensor | None:
    """A floating tensor to a real power."""
    if not isinstance(input, torch.Tensor) or input.dtype not in FLOATS or type(exponent) not in (int, float):
        return None
    return _same_elementwise(input)


_FUNCTIONAL: dict[Any, Callable[..., Any]] = {
    aten.clamp.default: clamp,
    aten.clamp_min.default: clamp_min,
    aten.clamp_max.default: clamp_max,
    aten.hardtanh.default: hardtanh,
    aten.relu6.default: relu6,
    aten.pow.Tensor_Scalar: pow_to_a_number,
}

DIRECT_POINTWISE: dict[Any, Callable[..., Any]] = {**_FUNCTIONAL, **in_place_forms(_FUNCTIONAL)}
