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
    return torch._C._conv_determine_backend_memory_format(input, weight, _backend(input, context.node_device()))


@rule(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed,
                                   output_padding, groups)
    memory_format = _output_format(input, weight)
    if memory_format is not None and not out.is_contiguous(memory_format=memory_format):
        out = out.to(memory_format=memory_format)
    return out
