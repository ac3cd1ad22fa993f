"""Rules for ops whose meta kernel disagrees with every real kernel, found by the fuzzer.

Each rule states the real kernels' behaviour it restores; tests/test_fuzz.py holds a
regression test per rule.
"""
from __future__ import annotations

import math

import torch

from .. import context
from .registry import rule

aten = torch.ops.aten


@rule(aten.where.self)
def where(condition, self, other):
    """Real kernels still accept a uint8 condition (deprecated, with a warning) as if it were bool;
    the meta kernel refuses it."""
    if condition.dtype == torch.uint8:
        condition = torch.empty_strided(condition.shape, condition.stride(), dtype=torch.bool, device=condition.device)
    return aten.where.self(condition, self, other)


def _reduction_needing_elements(op, name: str, default_dim: int | None = None):
    """Reductions that return an element of the input (max, min, median, mode) have no value on an
    empty slice: every real kernel refuses a zero-size reduced dim, the meta kernels do not."""
    def check(self, *args, **kwargs):
        if args or "dim" in kwargs or default_dim is not None:
            dim = args[0] if args else kwargs.get("dim", default_dim)
            if self.dim() > 0:
                wrapped = dim + self.dim() if dim < 0 else dim
                torch._check_index(not (0 <= wrapped < self.dim()) or self.shape[wrapped] != 0,
                                   lambda: f"{name}(): Expected reduction dim {wrapped} to have non-zero size.")
        else:
            torch._check_index(self.numel() != 0, lambda: f"{name}(): Expected reduction dim to be specified for "
                                                           "input.numel() == 0.")
        return op(self, *args, **kwargs)
    check.__name__ = check.__qualname__ = f"{name}_of_nonempty"
    return rule(op)(check)


for _op, _name in [(aten.max.dim, "max"), (aten.min.dim, "min"), (aten.max.default, "max"),
                   (aten.min.default, "min"), (aten.median.dim, "median"), (aten.nanmedian.dim, "nanmedian")]:
    _reduction_needing_elements(_op, _name)
_reduction_needing_elements(aten.mode.default, "mode", default_dim=-1)


def _wrap_dim(dim: int, ndim: int) -> int:
    """torch's maybe_wrap_dim: a 0-dim tensor takes dims -1 and 0; the error is torch's IndexError."""
    return torch._prims_common.canonicalize_dim(max(ndim, 1), dim)


def _softmax_checking_dim(op):
    """Every real kernel wraps ``dim`` against the input's rank; the meta kernel accepts any dim."""
    def softmax(self, dim, half_to_float):
        _wrap_dim(dim, self.dim())
        return op(self, dim, half_to_float)
    softmax.__name__ = softmax.__qualname__ = f"{op.__name__.split('.')[0].lstrip('_')}_checking_dim"
    return rule(op)(softmax)


_softmax_checking_dim(aten._softmax.default)
_softmax_checking_dim(aten._log_softmax.default)


@rule(aten.index_select.default)
def index_select(self, dim, index):
    """Real kernels wrap ``dim`` (a 0-dim tensor takes -1 and 0) and take exactly one index into a
    0-dim tensor; the meta kernel checks neither."""
    _wrap_dim(dim, self.dim())
    if self.dim() == 0:
        torch._check(index.numel() == 1,
                     lambda: f"index_select(): Index to scalar can have only 1 value, got {index.numel()} value(s)")
    return aten.index_select.default(self, dim, index)


@rule(aten.roll.default)
def roll(self, shifts, dims=()):
    """The real kernels return a copy of an empty tensor before looking at ``dims``; the meta
    kernel checks ``dims`` first and refuses what they accept. On the CPU a roll is a `cat` of
    two narrowed views, one dim at a time, so its strides are cat's, not the meta kernel's."""
    if self.numel() == 0:
        return torch.empty_like(self, memory_format=torch.preserve_format)
    device = context.node_device()
    if device is None or device.type != "cpu" or len(shifts) != max(len(dims), 1):
        return aten.roll.default(self, shifts, dims)
    if not dims:
        return roll(self.contiguous().view(-1), shifts, [0]).view(self.shape)
    if len(dims) > 1:
        return roll(roll(self, shifts[:1], dims[:1]), shifts[1:], dims[1:])
    dim = torch._prims_common.canonicalize_dim(self.dim(), dims[0])
    size = self.shape[dim]
    start = (size - shifts[0]) % size
    return aten.cat.default([self.narrow(dim, start, size - start), self.narrow(dim, 0, start)], dim)


def _sort_checking_dim(op, name: str):
    """Every real kernel wraps ``dim`` against the input's rank; the meta kernel accepts any dim."""
    def sort(self, *args, **kwargs):
        dim = kwargs.get("dim", args[1] if name == "sort.stable" and len(args) > 1 else
                         args[0] if name == "sort" and args else -1)
        _wrap_dim(dim, self.dim())
        return op(self, *args, **kwargs)
    sort.__name__ = sort.__qualname__ = f"{name.replace('.', '_')}_checking_dim"
    return rule(op)(sort)


_sort_checking_dim(aten.sort.default, "sort")
_sort_checking_dim(aten.sort.stable, "sort.stable")


def _check_integral_power(self, exponent) -> None:
    integral = not (self.dtype.is_floating_point or self.dtype.is_complex)
    torch._check(not (integral and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0),
                 lambda: "Integers to negative integer powers are not allowed.")


@rule(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(self, exponent):
    """Every real kernel refuses an integral tensor to a negative integral power, and raises a bool
    tensor to a bool power as bool; the meta kernel allows the first and promotes the second to int64."""
    _check_integral_power(self, exponent)
    out = aten.pow.Tensor_Scalar(self, exponent)
    if self.dtype == torch.bool and isinstance(exponent, bool):
        out = out.to(torch.bool)
    return out


@rule(aten.pow_.Scalar)
def pow_inplace_scalar(self, exponent):
    """In place, the same two rules: a bool tensor to a bool power stays bool (the meta kernel's int64
    result cannot be written back into it)."""
    _check_integral_power(self, exponent)
    if self.dtype == torch.bool and isinstance(exponent, bool):
        return self
    return aten.pow_.Scalar(self, exponent)


def _same_dtype(message: str, first: torch.Tensor, second: torch.Tensor) -> None:
    torch._check(first.dtype == second.dtype, lambda: message.format(first.dtype, second.dtype))


# Matrix products: every real kernel (CPU, CUDA) refuses operands of different dtypes; these
# meta kernels compute a result anyway (e.g. F.linear of a bfloat16 input by float32 weights).

@rule(aten.mm.default)
def mm(self, mat2):
    _same_dtype("expected m1 and m2 to have the same dtype, but got: {} != {}", self, mat2)
    return aten.mm.default(self, mat2)


@rule(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _same_dtype("mat1 and mat2 must have the same dtype, but got {} and {}", mat1, mat2)
    _same_dtype("self and mat2 must have the same dtype, but got {} and {}", self, mat2)
    if mat1.dim() == 2 and mat2.dim() == 2:
        self.expand(mat1.shape[0], mat2.shape[1])  # the real kernels expand self; the meta kernel never checks
    return aten.addmm.default(self, mat1, mat2, beta=beta, alpha=alpha)


@rule(aten.mv.default)
def mv(self, vec):
    _same_dtype("addmv input tensors must have the same dtype, but got {} and {}", self, vec)
    return aten.mv.default(self, vec)


@rule(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype("mat1 and mat2 must have the same dtype, but got {} and {}", batch1, batch2)
    _same_dtype("self and mat2 must have the same dtype, but got {} and {}", self, batch2)
    if batch1.dim() == 3 and batch2.dim() == 3:
        self.expand(batch1.shape[1], batch2.shape[2])
    return aten.addbmm.default(self, batch1, batch2, beta=beta, alpha=alpha)


def _nearest_upsampling_of_empty_batches(op, rank: int):
    """torch's meta kernel for nearest upsampling passes an int to ``torch._check`` when the batch is
    empty (``numel() != 0 or prod(sizes[1:])``) and dies with a TypeError; the real kernels accept
    an empty batch and refuse only an empty sample. The result of an empty batch is computed on a
    batch of one and given batch 0."""
    def upsample(input, *args, **kwargs):
        if input.numel() != 0:
            return op(input, *args, **kwargs)
        sample = tuple(input.shape[1:])
        torch._check(all(size != 0 for size in sample),
                     lambda: f"Non-empty {rank}D data tensor expected but got a tensor with sizes {list(input.shape)}")
        one = op(input.new_empty((1, *sample)), *args, **kwargs)
        return one.new_empty_strided((0, *one.shape[1:]), one.stride())
    upsample.__name__ = upsample.__qualname__ = f"{op.__name__.split('.')[0]}_of_empty_batches"
    return rule(op)(upsample)


def _interpolation_of_empty_samples(op, rank: int):
    """The CPU kernels for linear, bilinear, bicubic and trilinear upsampling refuse an empty
    sample (no elements, but not for want of a batch); the meta kernels, like CUDA's, accept it."""
    def upsample(input, *args, **kwargs):
        device = context.node_device()
        if device is not None and device.type == "cpu":
            torch._check(input.numel() != 0 or math.prod(input.shape[1:]) != 0,
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
