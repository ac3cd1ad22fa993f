"""Elementwise ops whose meta kernels disagree with every real kernel.

(How elementwise results are laid out is not a rule: `fxprop.aten.layout` restrides every
elementwise meta result as TensorIterator would.)
"""
from __future__ import annotations

import torch

from ..aten.layout import cast_copy
from ..resolve.registry import rule
from ..torch_compat import check, check_not_implemented

aten = torch.ops.aten


@rule(aten.where.self)
def where(condition, self, other):
    """Corrects aten.where.self's meta kernel, which refuses a uint8 condition that every real
    kernel still accepts (deprecated, with a warning), as ``condition.to(kBool)``."""
    if condition.dtype == torch.uint8:
        condition = cast_copy(condition, torch.bool)
    return aten.where.self(condition, self, other)


def _check_integral_power(self, exponent) -> None:
    integral = not (self.dtype.is_floating_point or self.dtype.is_complex)
    check(not (integral and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0),
          lambda: "Integers to negative integer powers are not allowed.")


@rule(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(self, exponent):
    """Corrects aten.pow.Tensor_Scalar's meta kernel: real kernels refuse an integral tensor to a
    negative integral power, and raise a bool tensor to a bool power as bool (the meta kernel
    allows the first and promotes the second to int64)."""
    _check_integral_power(self, exponent)
    out = aten.pow.Tensor_Scalar(self, exponent)
    if self.dtype == torch.bool and isinstance(exponent, bool):
        out = out.to(torch.bool)
    return out


@rule(aten.pow_.Scalar)
def pow_inplace_scalar(self, exponent):
    """Corrects aten.pow_.Scalar's meta kernel by the same two rules: a bool tensor to a bool power
    stays bool (the meta kernel's int64 result cannot be written back into it)."""
    _check_integral_power(self, exponent)
    if self.dtype == torch.bool and isinstance(exponent, bool):
        return self
    return aten.pow_.Scalar(self, exponent)


@rule(aten.nan_to_num_.default)
def nan_to_num_(self, nan=None, posinf=None, neginf=None):
    """Corrects nan_to_num_'s python meta kernel, which refuses complex tensors (through isneginf):
    the real kernel replaces the parts of each complex number in place, as nan_to_num does."""
    aten.nan_to_num.default(self, nan, posinf, neginf)  # its checks
    return self




def _check_integral_shift(name: str, self, other) -> None:
    """Shift kernels, the CPU's and CUDA's, are compiled for integral dtypes only (bool excluded),
    and run in the dtype ``self`` and ``other`` promote to."""
    dtype = torch.result_type(self, other)
    check_not_implemented(not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool),
                          lambda: f'"{name}" not implemented for \'{str(dtype).removeprefix("torch.")}\'')


@rule(aten.__lshift__.Scalar, aten.__lshift__.Tensor, aten.__lshift__.Scalar_out, aten.__lshift__.Tensor_out)
def lshift(self, other, *, out=None):
    """Corrects ``<<``'s meta kernels, which refuse a tensor whose own dtype is not integral: the
    real kernel shifts in the promoted dtype, as ``bitwise_left_shift`` does (``bool << 3`` is int64;
    ``bool << True`` stays bool, for which no kernel is compiled)."""
    _check_integral_shift("lshift", self, other)
    return torch.bitwise_left_shift(self, other, out=out)


@rule(aten.__rshift__.Scalar, aten.__rshift__.Tensor, aten.__rshift__.Scalar_out, aten.__rshift__.Tensor_out)
def rshift(self, other, *, out=None):
    """Corrects ``>>``'s meta kernels as `lshift` corrects ``<<``'s."""
    _check_integral_shift("rshift", self, other)
    return torch.bitwise_right_shift(self, other, out=out)


@rule(aten.__ilshift__.Scalar, aten.__ilshift__.Tensor)
def ilshift(self, other):
    """Corrects ``<<=``'s meta kernels, which refuse a shift by a bool tensor that the real kernel
    promotes (``int64 <<= bool`` shifts by 0 or 1)."""
    _check_integral_shift("lshift", self, other)
    return self.bitwise_left_shift_(other)


@rule(aten.__irshift__.Scalar, aten.__irshift__.Tensor)
def irshift(self, other):
    """Corrects ``>>=``'s meta kernels as `ilshift` corrects ``<<=``'s."""
    _check_integral_shift("rshift", self, other)
    return self.bitwise_right_shift_(other)
