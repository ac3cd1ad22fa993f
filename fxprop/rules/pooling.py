"""Pooling ops whose CPU kernels lay results out differently from torch's meta kernels, or refuse what they accept."""
from __future__ import annotations

import torch

from ..engine import session as context
from ..resolve.registry import rule
from ..torch_compat import check, suggest_memory_format

aten = torch.ops.aten


@rule(aten.max_unpool2d.default)
def max_unpool2d(input: torch.Tensor, indices: torch.Tensor, output_size) -> torch.Tensor:
    """Corrects aten.max_unpool2d's meta kernel, which returns a contiguous result: the CPU kernel
    keeps a 4-d input's channels_last layout (CUDA's, and the 3-d kernels, do not)."""
    out = aten.max_unpool2d.default(input, indices, output_size)
    if context.node_on_cpu() and input.dim() == 4:
        memory_format = suggest_memory_format(input)
        if not out.is_contiguous(memory_format=memory_format):
            out = out.contiguous(memory_format=memory_format)
    return out


@rule(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Corrects the meta kernel, which wraps dims of a lower-rank input first and fails with
    IndexError, where the real kernels check the rank first (RuntimeError)."""
    # the rank first: a 4-d input never asks for its element count, which a symbolic size may leave open
    check(self.dim() == 4 or (self.dim() == 3 and (self.shape[0] == 0 or self.numel() != 0)),
          lambda: "non-empty 3D or 4D (batch mode) tensor expected for input")
    return aten.max_pool2d_with_indices.default(self, kernel_size, stride, padding, dilation, ceil_mode)


def _non_empty(name: str, input: torch.Tensor, dims: range | tuple, numbered_from_end: bool) -> None:
    for dim in dims:
        number = dim + input.dim() if numbered_from_end else dim
        check(input.shape[dim] > 0,
              lambda: f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
                      f"{list(input.shape)} with dimension {number} being empty")


@rule(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    """Corrects the meta kernel, which accepts an input whose last two dims are empty: the real
    kernels refuse it (``adaptive_avg_pool1d`` too, as a 2-d pool of one row). An output of 1x1
    never gets here: the composite takes the mean instead, which real execution accepts."""
    if self.dim() in (3, 4):
        _non_empty("adaptive_avg_pool2d", self, (-2, -1), numbered_from_end=True)
    return aten._adaptive_avg_pool2d.default(self, output_size)


@rule(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    """Corrects the meta kernel, which accepts an input with an empty non-batch dim: the CPU kernel
    refuses one (every dim after the first, channels of a 5-d input included); elsewhere the
    spatial dims, which every kernel refuses empty."""
    if self.dim() in (4, 5):
        dims = range(1, self.dim()) if context.node_on_cpu() else range(self.dim() - 3, self.dim())
        _non_empty("adaptive_avg_pool3d", self, dims, numbered_from_end=False)
    return aten._adaptive_avg_pool3d.default(self, output_size)
