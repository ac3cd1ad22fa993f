"""Normalization on the CPU.

Batch norm: in inference the kernels return empty saved statistics of the input's dtype, where torch's meta kernel
(written for CUDA's layout) returns one value per channel, as
`torch._decomp.decompositions.native_batch_norm_helper` documents: "Very annoying inconsistency
where CPU and CUDA give different shapes". And the CPU output is laid out contiguous or
channels_last as the input is, where the meta kernel copies the input's strides.

Group norm: the composite kernel (aten/src/ATen/native/group_norm.cpp) makes a CPU input
contiguous in its suggested memory format, any other contiguous; run on meta tensors it takes
the second branch, so on the CPU the result is laid out again in the input's suggested format.

The backward kernels allocate the input's gradient as the CPU kernels do, where the meta kernels
follow the grad: layer norm's contiguous (``layer_norm_backward_cpu`` makes its input contiguous
and allocates ``empty_like`` of that), batch norm's in the input's suggested memory format.

Layer norm: a half or bfloat16 input keeps its dtype for the statistics on the CPU, where the
meta kernel gives float32 ones, as the CUDA kernel does."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..engine import session as context
from ..resolve.registry import rule
from ..torch_compat import check, suggest_memory_format

aten = torch.ops.aten


def _cpu_output_format(input: torch.Tensor) -> torch.memory_format:
    """The input's own layout where it is dense in one (size-1 dims aside), else its suggestion."""
    for memory_format in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
        if input.is_contiguous(memory_format=memory_format):
            return memory_format
    return suggest_memory_format(input)


def _in_format(tensor: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    return tensor if tensor.is_contiguous(memory_format=memory_format) else tensor.contiguous(memory_format=memory_format)


def _cpu_statistics_dtype(input: torch.Tensor, *parameters: torch.Tensor | None) -> torch.dtype:
    """The dtype of a CPU norm kernel's statistics. Parameters of another dtype than the input's
    make the call mixed-type, which the kernels accept only for float32 parameters of a half or
    bfloat16 input (``check_mixed_data_type``); the statistics then are float32."""
    defined = [p for p in parameters if p is not None]
    if all(p.dtype == input.dtype for p in defined):
        return input.dtype
    check(all(p.dtype == torch.float32 for p in defined),
          lambda: "mixed dtype (CPU): expect parameter to have scalar type of Float")
    check(input.dtype in (torch.bfloat16, torch.float16), lambda: "mixed dtype (CPU): all inputs must share same datatype.")
    return torch.float32


def _batch_norm(run: Callable[[], tuple], input, parameters: tuple, training: bool) -> tuple:
    """The results of ``run`` (the op on meta tensors), laid out on the CPU as the CPU kernel lays
    them out: the output in the input's memory format, the statistics in `_cpu_statistics_dtype`
    (of the input and its ``parameters``), empty in inference (the meta kernel follows CUDA: one
    float32 value per channel). The CPU kernel refuses to train on an empty batch."""
    on_the_cpu = context.node_on_cpu()
    if on_the_cpu:
        dtype = _cpu_statistics_dtype(input, *parameters)
        check(not training or input.numel() != 0,
              lambda: f"input tensor must have at least one element, but got input_sizes = {list(input.shape)}")
    output, save_mean, save_invstd, *more = run()
    if not on_the_cpu:
        return (output, save_mean, save_invstd, *more)
    output = _in_format(output, _cpu_output_format(input))
    shape = save_mean.shape if training else (0,)
    if save_mean.dtype != dtype or tuple(save_mean.shape) != tuple(shape):
        save_mean, save_invstd = (stat.new_empty(shape, dtype=dtype) for stat in (save_mean, save_invstd))
    return (output, save_mean, save_invstd, *more)


@rule(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(lambda: aten.native_batch_norm.default(input, weight, bias, running_mean, running_var, training,
                                                              momentum, eps),
                       input, (weight, bias, running_mean, running_var), training)


@rule(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(lambda: aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var,
                                                                     training, momentum, eps),
                       input, (weight, bias, running_mean, running_var), training)


@rule(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(lambda: aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps),
                       input, (weight, bias), training)


@rule(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """On the CPU the updated running statistics keep their own dtype (the meta kernel computes
    them in float32 for a half or bfloat16 input)."""
    *results, new_mean, new_var = _batch_norm(lambda: aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps),
        input, (weight, bias, running_mean, running_var), training)
    if context.node_on_cpu():
        new_mean, new_var = (new if new.dtype == old.dtype else new.new_empty(new.shape, dtype=old.dtype)
                             for new, old in ((new_mean, running_mean), (new_var, running_var)))
    return (*results, new_mean, new_var)


@rule(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(lambda: aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean,
                                                                                 running_var, momentum, eps),
                       input, (weight, bias, running_mean, running_var), False)


@rule(aten._batch_norm_impl_index.default)
def batch_norm_impl_index(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    return _batch_norm(lambda: aten._batch_norm_impl_index.default(input, weight, bias, running_mean, running_var,
                                                                   training, momentum, eps, cudnn_enabled),
                       input, (weight, bias, running_mean, running_var), training)


@rule(aten._batch_norm_no_update.default)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(lambda: aten._batch_norm_no_update.default(input, weight, bias, running_mean, running_var,
                                                                  momentum, eps),
                       input, (weight, bias, running_mean, running_var), False)


@rule(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """On the CPU, the statistics take `_cpu_statistics_dtype` (the meta kernel gives a half or
    bfloat16 input float32 statistics, as the CUDA kernel does), and a mixed-type call is refused
    as the CPU kernel refuses it."""
    on_the_cpu = context.node_on_cpu()
    if on_the_cpu:
        dtype = _cpu_statistics_dtype(input, weight, bias)
    output, mean, rstd = aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps)
    if not on_the_cpu or mean.dtype == dtype:
        return output, mean, rstd
    return output, mean.new_empty(mean.shape, dtype=dtype), rstd.new_empty(rstd.shape, dtype=dtype)


def _group_norm_laid_out_on_the_cpu(group_norm):
    def laid_out(input, *args, **kwargs):
        out = group_norm(input, *args, **kwargs)
        return _in_format(out, suggest_memory_format(input)) if context.node_on_cpu() else out
    laid_out.__name__ = laid_out.__qualname__ = "group_norm"
    return laid_out


for _target in (aten.group_norm.default, torch.group_norm, F.group_norm):
    rule(_target)(_group_norm_laid_out_on_the_cpu(_target))


@rule(torch.nn.GroupNorm)
def group_norm_module(module: torch.nn.GroupNorm, input):
    out = module(input)
    return _in_format(out, suggest_memory_format(input)) if context.node_on_cpu() else out


@rule(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    grad_input, *rest = aten.native_layer_norm_backward.default(grad_out, input, normalized_shape, mean, rstd, weight,
                                                                bias, output_mask)
    if grad_input is not None and context.node_on_cpu():
        grad_input = _in_format(grad_input, torch.contiguous_format)
    return (grad_input, *rest)


@rule(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    grad_input, *rest = aten.native_batch_norm_backward.default(grad_out, input, weight, running_mean, running_var,
                                                                save_mean, save_invstd, train, eps, output_mask)
    if grad_input is not None and context.node_on_cpu():
        grad_input = _in_format(grad_input, suggest_memory_format(input))
    return (grad_input, *rest)
