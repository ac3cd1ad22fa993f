"""Ops whose output sizes depend on the data: each such size is a fresh, bounded symbol.

No size is guessed from example data: ``nonzero`` on any input gives ``(u0, ndim)`` with
``0 <= u0 <= numel``, recorded with the node that defined it (`fxprop.symbolic`). This holds
for concrete inputs too, so a graph with concrete inputs may carry symbolic sizes downstream.
Modelled on torch's own fake implementations (`torch/_subclasses/fake_impls.py`).
"""
from __future__ import annotations

import math

import torch

from .. import context, symbolic
from .registry import rule

aten = torch.ops.aten


def _numel(tensor: torch.Tensor):
    return math.prod(tensor.shape) if tensor.dim() else 1


def _count(upper) -> int | torch.SymInt:
    """A fresh size in [0, upper]; an empty input has exactly 0 elements selected."""
    if isinstance(upper, int) and upper == 0:
        return 0
    return symbolic.current().fresh_size(upper)


@rule(aten.nonzero.default)
def nonzero(input: torch.Tensor) -> torch.Tensor:
    count = _count(_numel(input))
    return torch.empty_strided((count, input.dim()), (1, count), dtype=torch.int64, device="meta")


@rule(aten.masked_select.default)
def masked_select(input: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(input.shape, mask.shape)
    return torch.empty((_count(math.prod(shape)),), dtype=input.dtype, device="meta")


def _unique(input: torch.Tensor, dim: int | None, return_inverse: bool, return_counts: bool):
    if dim is not None:
        dim = dim % max(input.dim(), 1)
    count = _count(_numel(input) if dim is None else input.shape[dim])
    values = (torch.empty((count,), dtype=input.dtype, device="meta") if dim is None else
              torch.empty((*input.shape[:dim], count, *input.shape[dim + 1:]), dtype=input.dtype, device="meta"))
    inverse_shape = tuple(input.shape) if dim is None else (input.shape[dim],)
    inverse = torch.empty(inverse_shape if return_inverse else (0,), dtype=torch.int64, device="meta")
    counts = torch.empty((count,) if return_counts else (0,), dtype=torch.int64, device="meta")
    return values, inverse, counts


@rule(aten._unique2.default)
def unique2(input: torch.Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False):
    return _unique(input, None, return_inverse, return_counts)


@rule(aten._unique.default)
def unique(input: torch.Tensor, sorted: bool = True, return_inverse: bool = False):
    values, inverse, _ = _unique(input, None, return_inverse, False)
    return values, inverse


@rule(aten.unique_dim.default)
def unique_dim(input: torch.Tensor, dim: int, sorted: bool = True, return_inverse: bool = False,
               return_counts: bool = False):
    return _unique(input, dim, return_inverse, return_counts)


@rule(aten.unique_consecutive.default)
def unique_consecutive(input: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None):
    return _unique(input, dim, return_inverse, return_counts)


@rule(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats: torch.Tensor, *, output_size: int | None = None) -> torch.Tensor:
    if output_size is None:
        # The sum of the repeats has no bound a static pass can know; sizes are non-negative.
        output_size = symbolic.current().fresh_size(None)
    return torch.empty((output_size,), dtype=repeats.dtype, device="meta")


@rule(aten._local_scalar_dense.default)
def local_scalar_dense(input: torch.Tensor):
    """A value read from data: a fresh symbol, unless the tensor is one the user passed in for real."""
    session = context.current_session()
    known = session.real_values.get(id(input)) if session is not None else None
    if known is not None:
        with context.on_host():
            return known.item()
    return symbolic.current().fresh_value(input.dtype)


@rule(aten.index.Tensor)
def index(input: torch.Tensor, indices: list) -> torch.Tensor:
    """Boolean masks select a data-dependent number of elements: they become ``nonzero`` indices."""
    from torch._meta_registrations import meta_index_Tensor
    expanded: list = []
    for index_tensor in indices:
        if index_tensor is not None and index_tensor.dtype in (torch.bool, torch.uint8):
            rows = nonzero(index_tensor)
            expanded.extend(rows.select(1, j) for j in range(index_tensor.dim()))
        else:
            expanded.append(index_tensor)
    return meta_index_Tensor(input, expanded)
