"""Strides the CPU kernels choose where torch's meta kernels return a contiguous result.

Each rule runs the meta kernel for the shape and dtype, then lays the result out as the
node's device would. Found by the OpInfo conformance sweep (`tools/coverage_report.py
--verify`); FakeTensorMode has the same gaps.
"""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from .. import context
from .registry import rule

aten = torch.ops.aten


def _on_cpu() -> bool:
    device = context.node_device()
    return device is not None and device.type == "cpu"


@rule(aten.max_unpool2d.default)
def max_unpool2d(input: torch.Tensor, indices: torch.Tensor, output_size) -> torch.Tensor:
    """The CPU kernel keeps a 4-d input's channels_last layout (CUDA's, and the 3-d kernels, do not)."""
    out = aten.max_unpool2d.default(input, indices, output_size)
    if _on_cpu() and input.dim() == 4:
        memory_format = suggest_memory_format(input)
        if not out.is_contiguous(memory_format=memory_format):
            out = out.contiguous(memory_format=memory_format)
    return out
