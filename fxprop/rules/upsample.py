"""Upsampling and grid sampling: what the real kernels accept where the meta kernels differ."""
from __future__ import annotations

import math

import torch

from ..engine import session as context
from ..resolve.registry import rule
from ..torch_compat import check

aten = torch.ops.aten


def _nearest_upsampling_of_empty_batches(op, rank: int):
    """Corrects the nearest-upsampling meta kernels, which pass an int to ``torch._check`` when the batch is
    empty (``numel() != 0 or prod(sizes[1:])``) and dies with a TypeError; the real kernels accept
    an empty batch and refuse only an empty sample. The result of an empty batch is computed on a
    batch of one and given batch 0."""
    def upsample(input, *args, **kwargs):
        if input.numel() != 0:
            return op(input, *args, **kwargs)
        sample = tuple(input.shape[1:])
        check(all(size != 0 for size in sample),
                     lambda: f"Non-empty {rank}D data tensor expected but got a tensor with sizes {list(input.shape)}")
        one = op(input.new_empty((1, *sample)), *args, **kwargs)
        return one.new_empty_strided((0, *one.shape[1:]), one.stride())
    upsample.__name__ = upsample.__qualname__ = f"{op.__name__.split('.')[0]}_of_empty_batches"
    return rule(op)(upsample)


def _interpolation_of_empty_samples(op, rank: int):
    """Corrects the linear, bilinear, bicubic and trilinear upsampling meta kernels: the CPU kernels refuse an empty
    sample (no elements, but not for want of a batch); the meta kernels, like CUDA's, accept it."""
    def upsample(input, *args, **kwargs):
        device = context.node_device()
        if device is not None and device.type == "cpu":
            check(input.numel() != 0 or math.prod(input.shape[1:]) != 0,
                         lambda: f"Non-empty {rank}D data tensor expected but got a tensor with sizes "
                                 f"{list(input.shape)}")
        return op(input, *args, **kwargs)
    upsample.__name__ = upsample.__qualname__ = f"{op.__name__.split('.')[0]}_of_empty_samples"
    return rule(op)(upsample)


for _op, _rank in [(aten.upsample_linear1d.default, 3), (aten.upsample_bilinear2d.default, 4),
                   (aten.upsample_bicubic2d.default, 4), (aten.upsample_trilinear3d.default, 5),
                   (aten._upsample_bilinear2d_aa.default, 4), (aten._upsample_bicubic2d_aa.default, 4)]:
    _interpolation_of_empty_samples(_op, _rank)


for _op, _rank in [(aten.upsample_nearest1d.default, 3), (aten._upsample_nearest_exact1d.default, 3),
                   (aten.upsample_nearest2d.default, 4), (aten._upsample_nearest_exact2d.default, 4),
                   (aten.upsample_nearest3d.default, 5), (aten._upsample_nearest_exact3d.default, 5)]:
    _nearest_upsampling_of_empty_batches(_op, _rank)


@rule(aten.cudnn_grid_sampler.default)
def cudnn_grid_sampler(self, grid):
    """A CUDA-only kernel with no meta kernel: (N, C, H, W) sampled at a (N, H_out, W_out, 2) grid
    gives (N, C, H_out, W_out)."""
    check(self.dim() == 4 and grid.dim() == 4 and grid.size(-1) == 2,
          lambda: f"cudnn_grid_sampler: expected a 4-D input and a (N, H, W, 2) grid, got input of shape "
                  f"{tuple(self.shape)} and grid of shape {tuple(grid.shape)}")
    return self.new_empty((self.size(0), self.size(1), grid.size(1), grid.size(2)))
