"""Histograms: ``torch.histogram``, whose sizes are the bins' (never the data's), and which has
no meta kernel, so that without a rule it would run on real tensors of the bins' size.

The CPU kernels check the bin count, the range, the bins tensor's rank and dtype, then the
input's dtype and the weight (in an order that depends on whether a range is given). There
are no kernels for other devices.
"""
from __future__ import annotations

import torch

from ..engine import session as context
from ..errors import PropagationError
from ..aten.in_place import scalar_type_name
from ..resolve.registry import rule
from ..torch_compat import check

aten = torch.ops.aten


def _check_cpu(op_name: str) -> None:
    device = context.node_device()
    if device is not None and device.type not in ("cpu", "meta"):
        raise PropagationError(f"Could not run 'aten::{op_name}' with arguments from the '{device.type.upper()}' "
                               "backend: torch.histogram has CPU kernels only", error_type=NotImplementedError)


def _check_bin_count(count) -> None:
    check(count > 0, lambda: f"torch.histogram(): bins must be > 0, but got {count} for dimension 0")


def _check_input_and_weight(self: torch.Tensor, weight: torch.Tensor | None, edges_known: bool = False) -> None:
    """Where the bin edges come from the data (a bin count, no range) the kernel takes float and
    double and dispatches on them before it looks at the weight; where the edges are known (a
    range, or edges given) it checks the weight first, and takes half and bfloat16 too."""
    def check_dtype() -> None:
        implemented = (torch.float32, torch.float64) + ((torch.float16, torch.bfloat16) if edges_known else ())
        if self.dtype not in implemented:
            kernel = "histogram_cpu" if edges_known else "histogramdd"
            raise PropagationError(f'"{kernel}" not implemented for \'{scalar_type_name(self.dtype)}\'',
                                   error_type=NotImplementedError)

    if not edges_known:
        check_dtype()
    if weight is not None:
        check(weight.dtype == self.dtype, lambda: "torch.histogramdd: if weight tensor is provided, input tensor and "
              f"weight tensor should have the same dtype, but got input({self.dtype}), and weight({weight.dtype})")
        check(weight.numel() == self.numel(),
              lambda: "torch.histogramdd: if weight tensor is provided it should have the same shape as the input")
    if edges_known:
        check_dtype()


@rule(aten.histogram.bin_ct)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    """``(hist, bin_edges)`` of sizes ``(bins,)`` and ``(bins + 1,)``, in the input's dtype."""
    _check_cpu("histogram.bin_ct")
    _check_bin_count(bins)
    if range is not None:
        check(range[0] <= range[1], lambda: f"torch.histogramdd: min should not exceed max, but got min {range[0]} "
                                            f"max {range[1]} for dimension 0")
    _check_input_and_weight(self, weight, edges_known=range is not None)
    return self.new_empty((bins,)), self.new_empty((bins + 1,))


@rule(aten.histogram.bins_tensor)
def histogram_with_edges(self, bins, *, weight=None, density=False):
    """``(hist, bin_edges)`` for given edges: one bin fewer than edges, in the input's dtype."""
    _check_cpu("histogram.bins_tensor")
    check(bins.dim() == 1, lambda: "torch.histogramdd: bins tensor should have one dimension, but got "
                                   f"{bins.dim()} dimensions in the bins tensor for dimension 0")
    _check_bin_count(bins.numel() - 1)
    check(bins.dtype == self.dtype, lambda: "torch.histogramdd: input tensor and bins tensors should have the same "
                                            f"dtype, but got input {self.dtype} and bins {bins.dtype}")
    _check_input_and_weight(self, weight, edges_known=True)
    return self.new_empty((bins.numel() - 1,)), self.new_empty((bins.numel(),))
