"""Convolution: torch's meta kernel returns contiguous strides where the real kernels keep
channels_last, so the output's memory format is chosen here as the device's backend would."""
from __future__ import annotations

import torch

from .. import context
from .registry import rule

aten = torch.ops.aten
_REDUCED_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


def _backend(input: torch.Tensor, device: torch.device | None):
    backends = torch._C._ConvBackend
    if device is not None and device.type == "cpu":
        if torch.backends.mkldnn.is_available() and input.dtype in _REDUCED_PRECISION:
            return backends.Mkldnn
        return backends.Slow2d
    # cuDNN, like oneDNN, keeps channels_last when the input or the weight uses it.
    return backends.Mkldnn


def _output_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format | None:
    if weight.dim() not in (4, 5):
        return None
    backend = _backend(input, context.node_device())
    if backend == torch._C._ConvBackend.Slow2d and weight.dim() == 4:
        # The slow 2d kernels keep channels_last when the input or the weight suggests it, but ATen
        # asks that only of CPU tensors, so for meta tensors it would answer contiguous.
        suggested = {torch._prims_common.suggest_memory_format(t) for t in (input, weight)}
        return torch.channels_last if torch.channels_last in suggested else torch.contiguous_format
    return torch._C._conv_determine_backend_memory_format(input, weight, backend)


@rule(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    # Every backend's _select_conv_backend refuses an empty input unless its batch or channels are 0.
    torch._check(input.numel() != 0 or input.dim() < 2 or input.shape[0] == 0 or input.shape[1] == 0,
                 lambda: f"Only zero batch or zero channel inputs are supported, but got input shape: {list(input.shape)}")
    # ... and, past that empty-batch/empty-channel shortcut, weights or a bias of another dtype.
    empty = input.dim() >= 2 and (input.shape[0] == 0 or input.shape[1] == 0)
    for other in (weight, bias):
        torch._check(empty or other is None or other.dtype == input.dtype,
                     lambda: f"expected scalar type {input.dtype} but found {other.dtype}")
    out = aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed,
                                   output_padding, groups)
    memory_format = _output_format(input, weight)
    if memory_format is not None and not out.is_contiguous(memory_format=memory_format):
        out = out.to(memory_format=memory_format)
    return out
