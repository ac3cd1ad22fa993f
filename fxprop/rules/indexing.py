"""Indexing: where the real kernels check what the meta kernels do not, and boolean masks.

(Which device index tensors may live on is a device rule: `fxprop.devices.indexing`; bounds
on index values built with ``arange`` are checked by `fxprop.aten.index_values`.)
"""
from __future__ import annotations

import torch

from .. import symbolic
from ..engine import session as context
from ..torch_compat import scalar_type_name
from ..aten.index_values import index_select_range_check
from ..resolve.registry import rule
from ..torch_compat import check, check_index, meta_index_tensor
from .data_dependent import known_values, nonzero
from .reductions import wrap_dim

aten = torch.ops.aten


@rule(aten.index_select.default)
def index_select(self, dim, index):
    """Corrects aten.index_select's meta kernel: real kernels wrap ``dim`` (a 0-dim tensor takes -1
    and 0), take an index of at most one dim, exactly one index into a 0-dim tensor, an int32 or
    int64 index, and refuse an index outside ``[0, size)`` (checked where the index's values are
    known); the meta kernel checks none of these."""
    dim = wrap_dim(dim, self.dim())
    check_index(index.dim() <= 1, lambda: "index_select(): Index is supposed to be a vector")
    if self.dim() == 0:
        check(index.numel() == 1,
              lambda: f"index_select(): Index to scalar can have only 1 value, got {index.numel()} value(s)")
    check(index.dtype in (torch.int32, torch.int64), lambda: "index_select(): Expected dtype int32 or int64 for index")
    values = known_values(index)
    if values is not None and values.numel():
        size = self.size(dim) if self.dim() else 1
        check(self.dim() <= 1 or size > 0, lambda: "index_select(): self indexing axis dim should be positive")
        with context.on_host():
            in_range = bool(((values >= 0) & (values < size)).all())
        index_select_range_check(self, dim)(in_range, lambda: "index out of range in self")
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
    _check_masks_fit(input, indices)
    expanded: list = []
    for index_tensor in indices:
        if _is_mask(index_tensor):
            rows = nonzero(index_tensor)
            expanded.extend(rows.select(1, j) for j in range(index_tensor.dim()))
        else:
            expanded.append(index_tensor)
    return meta_index_tensor(input, expanded)


def _is_mask(index: torch.Tensor | None) -> bool:
    return index is not None and index.dtype in (torch.bool, torch.uint8)


def _check_masks_fit(input: torch.Tensor, indices: list) -> None:
    """A boolean (or uint8) mask among the indices must have the sizes of the dims it covers."""
    dim = 0
    for index_tensor in indices:
        if _is_mask(index_tensor):
            for j, size in enumerate(index_tensor.shape):
                check_index(dim + j >= input.dim() or size == input.shape[dim + j],
                            lambda: f"The shape of the mask {list(index_tensor.shape)} at index {j} does not match "
                                    f"the shape of the indexed tensor {list(input.shape)} at index {dim + j}")
            dim += index_tensor.dim()
        else:
            dim += 1


def _index_put(op):
    """Corrects the meta kernels of index_put (``x[i] = v``), which check nothing, on the CPU. ATen
    writes one element through ``masked_fill_`` where the indices are one mask and Nones, and the
    mask must then be bool; otherwise the indexed result ``self[indices]`` must take ``values`` by
    broadcasting, ``values`` must have ``self``'s dtype, and an index tensor must be given. With a
    mask among the indices the indexed result's size depends on the mask's values: only the dtype
    is checked (a size that does not fit raises the same RuntimeError). A call whose symbolic sizes
    leave undecided whether ``values`` is one element is left to the meta kernel, as are other
    devices' calls (the meta device's kernel checks nothing; CUDA's sorting kernel has its own)."""
    def checking_values(self, indices, values, accumulate=False, *rest):
        device = context.node_device()
        if device is None or device.type != "cpu":
            return op(self, indices, values, accumulate, *rest)
        check_index(len(indices) <= self.dim(),
                    lambda: f"too many indices for tensor of dimension {self.dim()} (got {len(indices)})")
        covered = sum(index.dim() if _is_mask(index) else 1 for index in indices)
        check_index(covered <= self.dim(), lambda: "Dimension out of range (expected to be in range of "
                                                   f"[{-max(self.dim(), 1)}, {max(self.dim(), 1) - 1}], but got {self.dim()})")
        _check_masks_fit(self, indices)
        given = [index for index in indices if index is not None]
        masks = [index for index in given if _is_mask(index)]
        if not accumulate and len(masks) == len(given) <= 1:
            one_element = symbolic.resolve(values.numel() == 1)
            if one_element is None:
                return op(self, indices, values, accumulate, *rest)  # which kernel writes is undecided
            if one_element:
                check(bool(masks), lambda: "index_put_: one element to write and no mask among the indices "
                                           "(ATen's masked_fill_ is given an undefined mask)")
                check(masks[0].dtype == torch.bool, lambda: "masked_fill_ only supports boolean masks, but got mask "
                                                            f"with dtype {scalar_type_name(masks[0].dtype)}")
                return op(self, indices, values, accumulate, *rest)
        # a 0-dim mask covers no dim: ATen's kernel drops it (and indexes all of self with what is left)
        kernel_indices = [None if _is_mask(index) and index.dim() == 0 else index for index in indices]
        given = [index for index in kernel_indices if index is not None]
        if not any(_is_mask(index) for index in given):  # a mask selects a data-dependent count of elements
            indexed = aten.index.Tensor(self, kernel_indices).shape if given else self.shape
            check(_expandable_to(values.shape, indexed) is not False,
                  lambda: f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing "
                          f"result of shape {list(indexed)}")
        check(values.dtype == self.dtype, lambda: "Index put requires the source and destination dtypes match, got "
                                                  f"{scalar_type_name(self.dtype)} for the destination and "
                                                  f"{scalar_type_name(values.dtype)} for the source.")
        check(bool(given), lambda: "index_put_: no index tensor among the indices (ATen's index kernel asserts "
                                   "ntensor >= 3)")
        return op(self, indices, values, accumulate, *rest)
    checking_values.__name__ = checking_values.__qualname__ = f"{op.__name__.replace('.', '_')}_checking_values"
    return rule(op)(checking_values)


def _expandable_to(shape: torch.Size, desired: torch.Size) -> bool | None:
    """Whether ``expand`` takes ``shape`` to ``desired`` (None where symbolic sizes leave it undecided)."""
    if len(shape) > len(desired):
        return False
    decided = [_either(symbolic.resolve(size == 1), symbolic.resolve(size == wanted))
               for size, wanted in zip(reversed(shape), reversed(desired))]
    return False if False in decided else None if None in decided else True


def _either(first: bool | None, second: bool | None) -> bool | None:
    """``first or second`` of two three-valued truths (None: undecided)."""
    return True if True in (first, second) else None if None in (first, second) else False


def _index_func(op, name: str):
    """Corrects the meta kernels of index_add, which skip ATen's
    ``index_func_meta_impl`` checks of the index and of ``source`` against ``self``."""
    def checking_source(self, dim, index, source, *args, **kwargs):
        dim = wrap_dim(dim, self.dim())
        check_index(index.dim() <= 1, lambda: f"{name}_(): Index is supposed to be a vector, but got dim: {index.dim()} "
                                              f"with type: {scalar_type_name(index.dtype)} and size: {list(index.shape)}")
        check(index.dtype in (torch.int64, torch.int32),
              lambda: f"{name}_(): Expected dtype int32/int64 for index but got: {scalar_type_name(index.dtype)}")
        check(self.dtype == source.dtype, lambda: f"{name}_(): self ({scalar_type_name(self.dtype)}) and source "
                                                  f"({scalar_type_name(source.dtype)}) must have the same scalar type")
        check(dim == 0 or dim < source.dim(),
              lambda: f"{name}_(): Indexing dim {dim} is out of bounds of the source tensor with dim {source.dim()}")
        indexed = 1 if source.dim() == 0 else source.shape[dim]
        check(index.numel() == indexed, lambda: f"{name}_(): Number of indices ({index.numel()}) should be equal to "
                                                f"source.size(dim): ({indexed}), for dim: {dim}")
        self_sizes, source_sizes = list(self.shape), list(source.shape)
        if source.dim() != 0 and self.dim() != 0:
            del self_sizes[dim], source_sizes[dim]
        check(self_sizes == source_sizes, lambda: "source tensor shape must match self tensor shape, excluding the "
                                                  f"specified dimension. Got self.shape = {list(self.shape)} "
                                                  f"source.shape = {list(source.shape)}")
        return op(self, dim, index, source, *args, **kwargs)
    checking_source.__name__ = checking_source.__qualname__ = f"{op.__name__.replace('.', '_')}_checking_source"
    return rule(op)(checking_source)


for _op in (aten.index_add.default, aten.index_add_.default):
    _index_func(_op, "index_add")


def _index_copy(op):
    """Corrects index_copy's decomposition, which checks with RuntimeError what ATen checks with
    IndexError, and takes int32 indices and a source of another dtype, which ATen refuses."""
    def checking_source(self, dim, index, source):
        dim = wrap_dim(dim, self.dim())
        check_index(index.dim() <= 1, lambda: f"index_copy_(): Index should have dimension 1 or 0 (got {index.dim()})")
        check_index(source.dim() != 0 or index.numel() == 1, lambda: "index_copy_(): When source is scalar, index "
                                                                     f"should have one element (got {index.numel()})")
        check_index(source.dim() == self.dim() or source.dim() == 0 or self.dim() == 0,
                    lambda: "index_copy_(): When source and destination are not scalars, their dimensionality must "
                            f"match. Source dimensionality ({source.dim()}), destination dimensionality ({self.dim()})")
        check(index.dtype == torch.int64,
              lambda: f"index_copy_(): Expected a long tensor for index, but got {scalar_type_name(index.dtype)}")
        check(self.dtype == source.dtype, lambda: "index_copy_(): self and source expected to have the same dtype, but "
                                                  f"got (self) {scalar_type_name(self.dtype)} and (source) "
                                                  f"{scalar_type_name(source.dtype)}")
        self_slice = tuple(self.shape[:dim] + self.shape[dim + 1:]) if self.dim() else ()
        source_slice = tuple(source.shape[:dim] + source.shape[dim + 1:]) if source.dim() else ()
        check(self_slice == source_slice, lambda: "index_copy_(): Source/destination tensor must have same slice shapes. "
                                                  f"Destination slice shape: {self_slice} at dimension {dim} and source "
                                                  f"slice shape: {source_slice} at dimension 0.")
        check_index(source.dim() == 0 or index.numel() == source.shape[dim],
                    lambda: f"index_copy_(): Number of indices ({index.numel()}) should be equal to source.size(dim) "
                            f"({source.shape[dim]})")
        return op(self, dim, index, source)
    checking_source.__name__ = checking_source.__qualname__ = f"{op.__name__.replace('.', '_')}_checking_source"
    return rule(op)(checking_source)


def _masked_scatter(op):
    """Corrects the meta kernels of masked_scatter, which take a uint8 mask that real kernels refuse."""
    def with_boolean_mask(self, mask, source):
        check(mask.dtype == torch.bool, lambda: "masked_scatter_ only supports boolean masks, but got mask with "
                                                f"dtype {scalar_type_name(mask.dtype)}")
        return op(self, mask, source)
    with_boolean_mask.__name__ = with_boolean_mask.__qualname__ = f"{op.__name__.replace('.', '_')}_with_boolean_mask"
    return rule(op)(with_boolean_mask)


_index_copy(aten.index_copy.default)
_index_copy(aten.index_copy_.default)
_masked_scatter(aten.masked_scatter.default)
_masked_scatter(aten.masked_scatter_.default)
for _op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default,
            aten._unsafe_index_put.default):
    _index_put(_op)
