"""Indexing: where the real kernels check what the meta kernels do not, and boolean masks.

(Which device index tensors may live on is a device rule: `fxprop.devices.indexing`; bounds
on index values built with ``arange`` are checked by `fxprop.index_values`.)
"""
from __future__ import annotations

import torch

from .. import context
from ..registry import rule
from ..torch_compat import check, check_index, meta_index_tensor
from .data_dependent import known_values, nonzero
from .reductions import wrap_dim

aten = torch.ops.aten


@rule(aten.index_select.default)
def index_select(self, dim, index):
    """Corrects aten.index_select's meta kernel: real kernels wrap ``dim`` (a 0-dim tensor takes -1
    and 0), take exactly one index into a 0-dim tensor, and refuse an index outside
    ``[0, size)`` (checked where the index's values are known); the meta kernel checks none."""
    dim = wrap_dim(dim, self.dim())
    if self.dim() == 0:
        check(index.numel() == 1,
              lambda: f"index_select(): Index to scalar can have only 1 value, got {index.numel()} value(s)")
    values = known_values(index)
    if values is not None and values.numel():
        size = self.size(dim) if self.dim() else 1
        with context.on_host():
            in_range = bool(((values >= 0) & (values < size)).all())
        check_index(in_range, lambda: "index out of range in self")
    return aten.index_select.default(self, dim, index)


@rule(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Corrects aten.embedding's meta kernel, which asserts (AssertionError) where real kernels
    refuse a weight that is not 2-D with a RuntimeError."""
    check(weight.dim() == 2, lambda: "'weight' must be 2-D")
    return aten.embedding.default(weight, indices, padding_idx, scale_grad_by_freq, sparse)


@rule(aten.index.Tensor)
def index(input: torch.Tensor, indices: list) -> torch.Tensor:
    """Boolean masks select a data-dependent number of elements: they become ``nonzero`` indices.
    A mask must have the shape of the dims it covers, which the meta kernel does not check."""
    expanded: list = []
    dim = 0
    for index_tensor in indices:
        if index_tensor is not None and index_tensor.dtype in (torch.bool, torch.uint8):
            for j, size in enumerate(index_tensor.shape):
                check_index(dim + j >= input.dim() or size == input.shape[dim + j],
                            lambda: f"The shape of the mask {list(index_tensor.shape)} at index {j} does not match "
                                    f"the shape of the indexed tensor {list(input.shape)} at index {dim + j}")
            dim += index_tensor.dim()
            rows = nonzero(index_tensor)
            expanded.extend(rows.select(1, j) for j in range(index_tensor.dim()))
        else:
            dim += 1
            expanded.append(index_tensor)
    return meta_index_tensor(input, expanded)
