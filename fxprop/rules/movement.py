"""Ops that move elements to new positions: roll, joining tensors (cat, stack), and constant padding."""
from __future__ import annotations

import torch

from ..engine import session as context
from ..resolve.registry import rule
from ..symbolic import resolve
from ..torch_compat import canonicalize_dim, check, check_index

aten = torch.ops.aten


@rule(aten.cat.default)
def cat(tensors, dim=0):
    """Corrects aten.cat's meta kernel, which fails with its own IndexError on 0-dim tensors: real
    kernels refuse the first 0-dim tensor by its position."""
    for position, tensor in enumerate(tensors):
        check(tensor.dim() != 0, lambda: f"zero-dimensional tensor (at position {position}) cannot be concatenated")
    return aten.cat.default(tensors, dim)


@rule(aten.stack.default)
def stack(tensors, dim=0):
    """Corrects aten.stack's meta kernel, which wraps ``dim`` by each tensor's own rank: real
    kernels wrap it by the first tensor's rank plus one, then refuse tensors of unequal sizes."""
    if tensors:
        canonicalize_dim(tensors[0].dim() + 1, dim)
        first = tensors[0].shape
        for position, tensor in enumerate(tensors[1:], start=1):
            def unequal() -> str:
                return (f"stack expects each tensor to be equal size, but got {list(first)} at entry 0 and "
                        f"{list(tensor.shape)} at entry {position}")
            check(tensor.dim() == len(first), unequal)
            for size, first_size in zip(tensor.shape, first):
                check(size == first_size, unequal)  # symbolic sizes: an assumption, not a guard
    return aten.stack.default(tensors, dim)


@rule(aten.roll.default)
def roll(self, shifts, dims=()):
    """Corrects aten.roll's meta kernel twice: real kernels return a copy of an empty tensor before
    looking at ``dims`` (the meta kernel refuses what they accept), and on the CPU a roll is a
    `cat` of two narrowed views, one dim at a time, so its strides are cat's."""
    if self.numel() == 0:
        return torch.empty_like(self, memory_format=torch.preserve_format)
    device = context.node_device()
    if device is None or device.type != "cpu" or len(shifts) != max(len(dims), 1):
        return aten.roll.default(self, shifts, dims)
    if not dims:
        return roll(self.contiguous().view(-1), shifts, [0]).view(self.shape)
    if len(dims) > 1:
        return roll(roll(self, shifts[:1], dims[:1]), shifts[1:], dims[1:])
    check_index(self.dim() > 0, lambda: f"Dimension specified as {dims[0]} but tensor has no dimensions")
    dim = canonicalize_dim(self.dim(), dims[0])
    size = self.shape[dim]
    start = (size - shifts[0]) % size
    return aten.cat.default([self.narrow(dim, start, size - start), self.narrow(dim, 0, start)], dim)


@rule(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    """Corrects aten.constant_pad_nd's meta kernel and the decomposition symbolic pads run through
    (``torch._refs.constant_pad_nd``). Real kernels first narrow the input by each negative pad
    (``narrow(): length must be non-negative.``), which the meta kernel skips with symbolic sizes:
    ``F.pad(x, (-2, 2))`` of a last dim of 1 is refused; with a named dim W it assumes ``W >= 2``.
    Where no pad is positive, ATen's kernel returns a clone of the narrowed input, which keeps the
    input's layout; the decomposition does so only where every pad is negative (the gradient of a
    padding by a symbolic amount, ``-((4 - L % 4) % 4)`` in mamba2's chunks, is never positive and
    may be zero); where the narrowed input is known row-major that clone is too, and the meta
    kernel's result stands (`_known_row_major`). A pad whose sign depends on the sizes is left to
    the meta kernel (the output's size does not depend on it)."""
    dims = self.dim()
    if len(pad) % 2 or len(pad) // 2 > dims:
        return aten.constant_pad_nd.default(self, pad, value)  # its own message
    narrowed = self
    for dim in range(dims - len(pad) // 2, dims):
        before, after = pad[2 * (dims - dim - 1)], pad[2 * (dims - dim - 1) + 1]
        if resolve(before <= 0) is True:
            narrowed = narrowed.narrow(dim, -before, narrowed.shape[dim] + before)
        if resolve(after <= 0) is True:
            narrowed = narrowed.narrow(dim, 0, narrowed.shape[dim] + after)
    if (any(isinstance(p, torch.SymInt) for p in pad) and all(resolve(p <= 0) is True for p in pad)
            and not _known_row_major(narrowed)):
        return narrowed.clone()
    return aten.constant_pad_nd.default(self, pad, value)


def _known_row_major(tensor: torch.Tensor) -> bool:
    """Whether every size is known to be at least 2 and the strides are known to fall from each dim
    to the next: then ATen's clone, which keeps a dense tensor's strides and orders any other's
    dims by their strides (``infer_dense_strides``), is row-major as the meta kernel lays its
    result out, and the meta kernel's expressions are the ones a compiler's ShapeEnv matches (in
    dynamo's swin graph a pad guarded to be 0, ``Mod(4 - Mod(H, 4), 4) <= 0``, leaves the padded
    sizes ``H + Mod(...)``; the input's strides in ``H`` equal them only under that guard)."""
    shape, stride = tensor.shape, tensor.stride()
    if not all(resolve(size >= 2) is True for size in shape):
        return False
    return all(resolve(stride[dim] > stride[dim + 1]) is True for dim in range(len(shape) - 1))

