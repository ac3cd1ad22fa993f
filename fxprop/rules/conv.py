"""Convolution: torch's meta kernel returns contiguous strides where the real kernels keep
channels_last, so the output's memory format is chosen here as the device's backend would."""
from __future__ import annotations

import torch

from ..engine import session as context
from ..engine.blame import boundary
from ..resolve.registry import rule
from ..torch_compat import (ConvBackend, check, conv_determine_backend_memory_format, select_conv_backend,
                           suggest_memory_format)

aten = torch.ops.aten
_REDUCED_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


def _host_stand_in(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU tensor of ``tensor``'s shape and dtype backed by one element, for asking ATen's
    backend choice (which looks at sizes, dtype and device, never at data)."""
    if tensor is None:
        return None
    return torch.empty((), dtype=tensor.dtype, device="cpu").expand(tensor.shape)


def _cpu_backend(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The CPU kernel ATen would pick on this host: oneDNN or the slow kernels, by dtype, sizes,
    thread count and the host's bf16/fp16 support."""
    backends = ConvBackend
    if any(isinstance(size, torch.SymInt) for size in (*input.shape, *weight.shape)):
        return backends.Mkldnn if input.dtype in _REDUCED_PRECISION and torch.backends.mkldnn.is_available() \
            else backends.Slow2d
    with context.on_host():
        return _select_backend(_host_stand_in(input), _host_stand_in(weight), _host_stand_in(bias), stride, padding,
                               dilation, transposed, output_padding, groups)


@boundary
def _select_backend(*args):
    return select_conv_backend(*args)  # what it refuses, the real convolution refuses


def _output_format(input, weight, bias, *conv_args) -> torch.memory_format | None:
    if weight.dim() not in (4, 5):
        return None
    device = context.node_device()
    # cuDNN, like oneDNN, keeps channels_last when the input or the weight uses it.
    backend = ConvBackend.Mkldnn
    if device is not None and device.type == "cpu":
        backend = _cpu_backend(input, weight, bias, *conv_args)
    slow_2d = (ConvBackend.Slow2d, ConvBackend.SlowDilated2d, ConvBackend.SlowTranspose2d)
    if backend in slow_2d and weight.dim() == 4:
        # The slow 2d kernels keep channels_last when the input or the weight suggests it, but ATen
        # asks that only of CPU tensors, so for meta tensors it would answer contiguous.
        suggested = {suggest_memory_format(t) for t in (input, weight)}
        return torch.channels_last if torch.channels_last in suggested else torch.contiguous_format
    return conv_determine_backend_memory_format(input, weight, backend)


def check_conv_params(stride, padding, dilation, output_padding) -> None:
    """ATen's ``check_shape_forward``, which the meta kernel skips."""
    check(all(p >= 0 for p in padding), lambda: "negative padding is not supported")
    check(all(p >= 0 for p in output_padding), lambda: "negative output_padding is not supported")
    check(all(s > 0 for s in stride), lambda: "non-positive stride is not supported")
    check(all(d > 0 for d in dilation), lambda: f"dilation should be greater than zero, but got {list(dilation)}")


@rule(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    check_conv_params(stride, padding, dilation, output_padding)
    # Every backend's _select_conv_backend refuses an empty input unless its batch or channels are 0.
    check(input.numel() != 0 or input.dim() < 2 or input.shape[0] == 0 or input.shape[1] == 0,
                 lambda: f"Only zero batch or zero channel inputs are supported, but got input shape: {list(input.shape)}")
    # ... and, past that empty-batch/empty-channel shortcut, weights or a bias of another dtype.
    empty = input.dim() >= 2 and (input.shape[0] == 0 or input.shape[1] == 0)
    for other in (weight, bias):
        check(empty or other is None or other.dtype == input.dtype,
                     lambda: f"expected scalar type {input.dtype} but found {other.dtype}")
    out = aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed,
                                   output_padding, groups)
    if weight.dim() == 3:
        return _as_2d_convolution(out, input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                  groups)
    memory_format = _output_format(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                   groups)
    if memory_format is not None and not out.is_contiguous(memory_format=memory_format):
        out = out.contiguous(memory_format=memory_format)
    return out


def _as_2d_convolution(out, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """ATen runs a 1-d convolution as a 2-d one of height 1 (``view1d_as_2d``, on the input made
    contiguous), so the 2-d kernels' choice of memory format decides the layout: a (1, 1, L) input
    whose channel stride is 1 reads as channels_last there."""
    input_2d = input.contiguous().unsqueeze(2)
    memory_format = _output_format(input_2d, weight.unsqueeze(2), bias, [1, *stride], [0, *padding], [1, *dilation],
                                   transposed, [0, *output_padding], groups)
    if memory_format is None:
        return out
    return torch.empty((*out.shape[:2], 1, *out.shape[2:]), dtype=out.dtype, device=out.device,
                       memory_format=memory_format).squeeze(2)


# cuDNN's convolutions: CUDA-only kernels with no meta kernel, shaped as aten.convolution.

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
