"""Fused optimizer steps (CUDA kernels with no meta kernel): they check their tensor lists and
return nothing."""
from __future__ import annotations

import torch

from ..devices import META, device_of
from ..errors import DeviceMismatchError, PropagationError
from ..resolve.registry import rule

aten = torch.ops.aten


def _check_fused_step(name: str, params, *per_param_lists) -> None:
    """What the fused optimizers check: one entry per parameter, each on its parameter's device and shape.

    (Step counters and ``lr`` are not checked: torch lets them be 0-dim tensors.)"""
    for values in per_param_lists:
        if values and len(values) != len(params):
            raise PropagationError(f"{name}: every tensor list must have one entry per parameter, "
                                   f"got {len(params)} parameters and a list of {len(values)}", error_type=RuntimeError)
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
