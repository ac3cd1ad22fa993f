"""Batch norm in inference: the CPU kernels return empty saved statistics, where torch's meta
kernel (written for CUDA's layout) returns one value per channel. The shapes follow the
node's device, as `torch._decomp.decompositions.native_batch_norm_helper` documents:
"Very annoying inconsistency where CPU and CUDA give different shapes"."""
from __future__ import annotations

import torch

from .. import context
from .registry import rule

aten = torch.ops.aten


def _saved_statistics_for_device(result: tuple, training: bool) -> tuple:
    """Empty ``save_mean``/``save_invstd`` (results 1 and 2) for an inference run on the CPU."""
    device = context.node_device()
    if training or device is None or device.type != "cpu":
        return result
    output, save_mean, save_invstd, *rest = result
    return (output, save_mean.new_empty((0,)), save_invstd.new_empty((0,)), *rest)


@rule(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    result = aten.native_batch_norm.default(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _saved_statistics_for_device(result, training)


@rule(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    result = aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training,
                                                   momentum, eps)
    return _saved_statistics_for_device(result, training)


@rule(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    result = aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                               momentum, eps)
    return _saved_statistics_for_device(result, False)


@rule(aten._batch_norm_impl_index.default)
def batch_norm_impl_index(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    result = aten._batch_norm_impl_index.default(input, weight, bias, running_mean, running_var, training, momentum,
                                                 eps, cudnn_enabled)
    return _saved_statistics_for_device(result, training)


@rule(aten._batch_norm_no_update.default)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    result = aten._batch_norm_no_update.default(input, weight, bias, running_mean, running_var, momentum, eps)
    return _saved_statistics_for_device(result, False)
