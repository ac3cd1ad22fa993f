"""CUDA-only kernels with no meta kernel and no decomposition in torch.

On a CPU-only build, the host fallback cannot run them (their only kernels are CUDA ones),
so a cuda-target graph that reaches them needs these rules. Each computes the result's
metadata from the op's documented semantics; none ever runs on a device.
(The fused SDPA kernels, `_scaled_mm`, `_fused_adam_` and the `_foreach_*` ops have meta
kernels in torch and need nothing here.)
"""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from ..devices import META, device_of
from ..errors import DeviceMismatchError, PropagationError
from .registry import rule

aten = torch.ops.aten


def _cudnn_memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """cuDNN keeps channels_last when the input or the weight uses it, except for float64
    (`cudnn_conv_suggest_memory_format`; torch's own helper answers "contiguous" on a build without cuDNN)."""
    if torch.float64 in (input.dtype, weight.dtype) or weight.dim() not in (4, 5):
        return torch.contiguous_format
    wanted = torch.channels_last if weight.dim() == 4 else torch.channels_last_3d
    if wanted in (suggest_memory_format(input), suggest_memory_format(weight)):
        return wanted
    return torch.contiguous_format


@rule(aten.cudnn_convolution.default)
def cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32):
    out = aten.convolution.default(self, weight, None, stride, padding, dilation, False, [0] * len(padding), groups)
    return out.contiguous(memory_format=_cudnn_memory_format(self, weight))


@rule(aten.cudnn_convolution_transpose.default)
def cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, groups, benchmark,
                                deterministic, allow_tf32):
    out = aten.convolution.default(self, weight, None, stride, padding, dilation, True, output_padding, groups)
    return out.contiguous(memory_format=_cudnn_memory_format(self, weight))


@rule(aten.cudnn_grid_sampler.default)
def cudnn_grid_sampler(self, grid):
    """(N, C, H, W) sampled at a (N, H_out, W_out, 2) grid gives (N, C, H_out, W_out)."""
    torch._check(self.dim() == 4 and grid.dim() == 4 and grid.size(-1) == 2,
                 lambda: f"cudnn_grid_sampler: expected a 4-D input and a (N, H, W, 2) grid, got input of shape "
                         f"{tuple(self.shape)} and grid of shape {tuple(grid.shape)}")
    return self.new_empty((self.size(0), self.size(1), grid.size(1), grid.size(2)))


def _check_fused_step(name: str, params, *per_param_lists) -> None:
    """What the fused optimizers check: one entry per parameter, each on its parameter's device and shape.

    (Step counters and ``lr`` are not checked: torch lets them be 0-dim tensors.)"""
    for values in per_param_lists:
        if values and len(values) != len(params):
            raise PropagationError(f"{name}: every tensor list must have one entry per parameter, "
                                   f"got {len(params)} parameters and a list of {len(values)}")
        for param, value in zip(params, values):
            if META not in (device_of(value), device_of(param)) and device_of(value) != device_of(param):
                raise DeviceMismatchError(f"{name}: expected all tensors to be on the device of their parameter "
                                          f"({device_of(param)}), got one on {device_of(value)}")
            if value.dim() != 0 and value.shape != param.shape:
                raise PropagationError(f"{name}: expected tensors shaped like their parameter "
                                       f"{tuple(param.shape)}, got {tuple(value.shape)}")


@rule(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def fused_sgd_(self, grads, momentum_buffer_list, **options):
    _check_fused_step("_fused_sgd_", self, grads, momentum_buffer_list)


@rule(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
def fused_adagrad_(self, grads, state_sums, state_steps, **options):
    _check_fused_step("_fused_adagrad_", self, grads, state_sums)


@rule(aten._fused_adam_.tensor_lr, aten._fused_adamw_.tensor_lr)
def fused_adam_tensor_lr(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **options):
    _check_fused_step("_fused_adam_", self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
