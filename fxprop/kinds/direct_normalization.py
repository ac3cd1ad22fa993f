"""Batch norm's results computed directly, in training and in inference.

Its meta kernels are torch's python decompositions (``native_batch_norm_helper``): a ``var_mean``,
the normalization as four elementwise ops, the running statistics' update, each dispatched again,
about a millisecond a call in training. What they give is plain: an output laid out as the input
is, and one statistic per channel.

Only calls whose input is contiguous or channels-last, with static sizes, and whose parameters
and running statistics are one value per channel of the input's floating dtype, take the
shortcut; the statistics are computed in float32 for a half or bfloat16 input, as the meta
kernel computes them. Anything else returns None and the meta kernel runs, checks and raises as
before.
The CPU's own layout and its empty statistics in inference are the rules' (`fxprop.rules.normalization`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..torch_compat import make_channels_last_2d_strides_for, make_channels_last_3d_strides_for, make_contiguous_strides_for
from .direct import FULL_PRECISION, one_float

aten = torch.ops.aten


def batch_norm_in_inference(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: Any,
                            eps: Any) -> tuple | None:
    """``_native_batch_norm_legit_no_training``: the meta kernel's result keeps the input's strides and
    gives per-channel statistics."""
    if running_mean is None or running_var is None:
        return None
    return _normalized(input, (weight, bias, running_mean, running_var), momentum, eps, statistics=2)


def batch_norm_in_training(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: Any,
                           eps: Any) -> tuple | None:
    """Training: the statistics of this batch, one value per channel (the running ones, if given, are
    updated in place). The kernels refuse an empty batch."""
    if not isinstance(input, torch.Tensor) or input.numel() == 0:
        return None
    return _normalized(input, (weight, bias, running_mean, running_var), momentum, eps, statistics=2)


def native_batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: Any,
                      momentum: Any, eps: Any) -> tuple | None:
    """``native_batch_norm`` and ``_native_batch_norm_legit``, in training or not."""
    if training is True:
        return batch_norm_in_training(input, weight, bias, running_mean, running_var, momentum, eps)
    if training is False:
        return batch_norm_in_inference(input, weight, bias, running_mean, running_var, momentum, eps)
    return None


def batch_norm_without_running_statistics(input: Any, weight: Any, bias: Any, training: Any, momentum: Any,
                                          eps: Any) -> tuple | None:
    """``_native_batch_norm_legit.no_stats``: training only (without running statistics there is nothing to infer with)."""
    if training is not True:
        return None
    return batch_norm_in_training(input, weight, bias, None, None, momentum, eps)


def functional_batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: Any,
                          momentum: Any, eps: Any) -> tuple | None:
    """``_native_batch_norm_legit_functional`` in training: the updated running statistics come back
    as two more results, fresh. (In inference its meta kernel returns the statistics it copied
    as the saved ones as well, one tensor twice: that call runs its kernel.)"""
    if training is not True or running_mean is None or running_var is None or not isinstance(input, torch.Tensor) \
            or input.numel() == 0:
        return None
    return _normalized(input, (weight, bias, running_mean, running_var), momentum, eps, statistics=4)


def _normalized(input: Any, per_channel: tuple, momentum: Any, eps: Any, statistics: int) -> tuple | None:
    if not isinstance(input, torch.Tensor) or input.dim() < 2 or type(eps) not in (int, float) or \
            type(momentum) not in (int, float):
        return None
    given = [t for t in per_channel if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in given):
        return None
    dtype = one_float(input, *given, static=True)
    channels = (input.shape[1],)
    if dtype is None or any(tuple(t.shape) != channels for t in given) or \
            input.stride() not in (make_contiguous_strides_for(input.shape), _channels_last_strides(input.shape)):
        return None
    computed_in = dtype if dtype in FULL_PRECISION else torch.float32
    return (torch.empty_strided(input.shape, input.stride(), dtype=dtype, device="meta"),
            *(torch.empty(channels, dtype=computed_in, device="meta") for _ in range(statistics)))


def _channels_last_strides(shape: tuple) -> tuple | None:
    if len(shape) == 4:
        return make_channels_last_2d_strides_for(shape)
    return make_channels_last_3d_strides_for(shape) if len(shape) == 5 else None


DIRECT_NORMALIZATION: dict[Any, Callable[..., Any]] = {
    aten._native_batch_norm_legit_no_training.default: batch_norm_in_inference,
    aten.native_batch_norm.default: native_batch_norm,
    aten._native_batch_norm_legit.default: native_batch_norm,
    aten._native_batch_norm_legit.no_stats: batch_norm_without_running_statistics,
    aten._native_batch_norm_legit_functional.default: functional_batch_norm,
}
