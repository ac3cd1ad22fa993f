"""Calls real execution refuses, or accepts, where torch's meta kernels say otherwise.

Each case runs through `check_rule`, which runs the real op: fxprop must propagate where it
succeeds, and refuse with the same exception type where it raises.
"""
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

import fxprop
import fxprop.testing
from fxprop.testing import check_rule

x34 = torch.randn(3, 4)
_OFFS = torch.tensor([3, 7, 10], dtype=torch.int32)


def batch_norm_by_a_weight_that_requires_grad(x):
    weight = torch.ones(1, requires_grad=True)
    return F.batch_norm(x, torch.zeros(1), torch.ones(1), weight)


# Writes whose input partially overlaps the written tensor, as graphs see them.
def add_previous(b):
    return b[1:].add_(b[:-1])


def add_disjoint(b):
    return b[:2].add_(b[2:])


def add_transposed(b):
    return b.view(2, 2).t().add_(b.view(2, 2))


def add_element_inside(b):
    return b[:-1].add_(b[1])


def add_element_outside(b):
    return b[1:].add_(b[0])


def abs_shifted_out(b):
    return torch.abs(b[:-1], out=b[1:])


def copy_previous(b):
    return b[1:].copy_(b[:-1])


def clamp_previous(b):
    return b[1:].clamp_(min=b[:-1])


def mul_strided(b):
    return b[::2].mul_(b[1::2])


def copy_float16_over_float32(b):
    return b[0:4].copy_(b.view(torch.float16)[2:6])


def copy_bfloat16_over_float32(b):
    return b[0:4].copy_(b.view(torch.bfloat16)[2:6])


def frexp_outputs_overlapping_each_other(b):
    return torch.frexp(b[8:12], out=(b[0:4], b.view(torch.int32)[2:6]))


def frexp_exponent_over_the_input(b):
    return torch.frexp(b[0:4], out=(b[8:12], b.view(torch.int32)[2:6]))


def gelu_into_a_shifted_out(b):
    return torch._C._nn.gelu(b[0:4], out=b[2:6])


def where_into_a_shifted_out(b):
    return torch.where(b[0:4] > 0, b[0:4], 0.0, out=b[2:6])


def uniform_into_an_expanded_tensor(b):
    return b[0:1].expand(4).uniform_()


def bernoulli_by_overlapping_probabilities(b):
    return b[0:4].bernoulli_(b[2:6].clamp(0, 1))


# Writes into out= (or self) that an input overlaps, in kernels that are not elementwise: each
# kernel chooses its own checks.
def cat_into_an_overlapping_out(b):
    return torch.cat([b[0:4], b[4:8]], out=b[2:10])


def cat_into_its_own_input(b):
    return torch.cat([b[0:4]], out=b[0:4])


def index_select_into_an_expanded_out(b):
    return torch.index_select(b[0:8], 0, torch.tensor([0, 1, 2]), out=b[20:21].expand(3))


def mm_into_an_overlapping_out(b):
    return torch.mm(b[0:4].view(2, 2), b[4:8].view(2, 2), out=b[2:6].view(2, 2))


def mm_into_an_expanded_out(b):
    return torch.mm(b[0:4].view(2, 2), b[4:8].view(2, 2), out=b[20:22].view(1, 2).expand(2, 2))


def addmm_into_an_overlapping_out(b):
    return torch.addmm(b[0:4].view(2, 2), b[4:8].view(2, 2), b[8:12].view(2, 2), out=b[2:6].view(2, 2))


def sum_into_an_overlapping_out(b):
    return torch.sum(b[0:8].view(2, 4), 1, out=b[7:9])


def cumsum_into_an_overlapping_out(b):
    return torch.cumsum(b[0:8], 0, out=b[4:12])


def sort_into_an_overlapping_out(b):
    return torch.sort(b[0:8], out=(b[4:12], torch.empty(8, dtype=torch.long)))


def index_add_of_a_source_inside_self(b):
    return b[0:8].index_add_(0, torch.tensor([0, 1]), b[6:8])


def put_of_values_inside_self(b):
    return b[0:8].put_(torch.tensor([0, 1]), b[6:8])


def masked_scatter_of_a_source_overlapping_self(b):
    return b[0:8].masked_scatter_(torch.ones(8, dtype=torch.bool), b[4:12])


def clone_into_a_shifted_out(b):
    return torch.ops.aten.clone.out(b[0:8], out=b[4:12])


def div_by_a_number_into_a_shifted_out(b):
    return torch.ops.aten.div.Scalar_out(b[0:8], 2.0, out=b[4:12])


CASES = {
    # convolution parameters (ATen's check_shape_forward)
    "conv2d negative padding": (F.conv2d, (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), dict(padding=-1)),
    "conv2d zero stride": (F.conv2d, (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), dict(stride=0)),
    "conv2d zero dilation": (F.conv2d, (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), dict(dilation=0)),
    "conv3d zero dilation": (F.conv3d, (torch.randn(1, 2, 5, 5, 5), torch.randn(3, 2, 3, 3, 3)), dict(dilation=0)),
    "conv2d": (F.conv2d, (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), dict(padding=1, dilation=2)),
    # moving and reducing
    "mean of ints along a dim a 0-dim tensor lacks": (torch.mean, (torch.tensor(3), 1), {}),
    "mean of ints into ints along a dim past the end": (torch.mean, (torch.arange(2), 3), dict(dtype=torch.int32)),
    "mean of ints into floats": (torch.mean, (torch.arange(2), 0), dict(dtype=torch.float32)),
    "stack of a 1-d and a 0-dim tensor along dim 1": (torch.stack, ((torch.zeros(1), torch.zeros(())), 1), {}),
    "stack of a 0-dim and a 1-d tensor along dim 1": (torch.stack, ((torch.zeros(()), torch.zeros(1)), 1), {}),
    "stack of unequal sizes": (torch.stack, ((torch.zeros(2), torch.zeros(3)),), {}),
    "stack past the new dim": (torch.stack, ((torch.zeros(2), torch.zeros(2)), 2), {}),
    "stack": (torch.stack, ((torch.zeros(2), torch.zeros(2)), -2), {}),
    "combinations (a stack of data-dependent sizes)": (torch.combinations, (torch.randn(3),), dict(r=2)),
    "roll a 0-dim tensor along dim 0": (torch.roll, (torch.tensor(1.0), 1, 0), {}),
    "roll a 0-dim tensor": (torch.roll, (torch.tensor(1.0), 1), {}),
    "amax over an empty dim": (torch.amax, (torch.randn(0, 3), 0), {}),
    "amax over a nonempty dim of an empty tensor": (torch.amax, (torch.randn(0, 3), 1), {}),
    "amin over an empty dim, counted from the end": (torch.amin, (torch.randn(0, 3), [-2]), {}),
    "aminmax over an empty dim": (torch.aminmax, (torch.randn(0, 3),), dict(dim=0)),
    "aminmax of an empty tensor": (torch.aminmax, (torch.randn(0, 3),), {}),
    "argmax of an empty tensor": (torch.argmax, (torch.randn(0, 3),), {}),
    "argmin over an empty dim": (torch.argmin, (torch.randn(0, 3), 0), {}),
    "argmax over a nonempty dim of an empty tensor": (torch.argmax, (torch.randn(0, 3), 1), {}),
    "max_pool2d of a 0-dim tensor": (torch.nn.functional.max_pool2d, (torch.tensor(3.0), 1), {}),
    "max_pool2d of a 2-d tensor": (torch.nn.functional.max_pool2d, (torch.randn(2, 4), 1), {}),
    "max_pool2d of an empty 3-d tensor": (torch.nn.functional.max_pool2d, (torch.randn(0, 2, 4), 1), {}),
    "max_pool2d": (torch.nn.functional.max_pool2d, (torch.randn(1, 2, 4, 4), 2), {}),
    # the meta kernel checks the dtype first, the CPU kernel the dims
    "avg_pool2d of a 0-dim uint8 tensor": (torch.nn.functional.avg_pool2d, (torch.zeros((), dtype=torch.uint8), 2), {}),
    "avg_pool2d of a 3-d uint8 tensor": (torch.nn.functional.avg_pool2d, (torch.zeros(1, 4, 4, dtype=torch.uint8), 2), {}),
    "add of integers with a float alpha": (torch.add, (torch.tensor(2), torch.tensor(2)), dict(alpha=0.5)),
    # python meta kernels that assert where ATen raises RuntimeError
    "t_ of a 3-d tensor": ("t_", (torch.randn(2, 3, 4),), {}),
    "complex of float and long": (torch.complex, (torch.randn(3), torch.arange(3)), {}),
    # index_add / index_copy (ATen's index_func_meta_impl)
    "index_add": (torch.index_add, (x34, 1, torch.tensor([0, 1]), torch.randn(3, 2)), {}),
    "index_add of another dtype": (torch.index_add, (x34, 0, torch.tensor([0, 1]), torch.randn(2, 4).double()), {}),
    "index_add of another shape": (torch.index_add, (x34, 0, torch.tensor([0, 1]), torch.randn(2, 5)), {}),
    "index_add of a 0-dim source": (torch.index_add, (x34, 0, torch.tensor([0]), torch.tensor(1.0)), {}),
    "index_add with a 2-d index": (torch.index_add, (x34, 0, torch.tensor([[0, 1]]), torch.randn(2, 4)), {}),
    "index_add with a float index": (torch.index_add, (x34, 0, torch.tensor([0.0, 1.0]), torch.randn(2, 4)), {}),
    "index_copy with too many indices": (torch.index_copy, (x34, 0, torch.tensor([0, 1]), torch.randn(3, 4)), {}),
    "index_select from an empty dim": (torch.index_select, (torch.randn(0, 3), 0, torch.tensor([0])), {}),
    "index_select past dim 1 of a 2-d tensor (the CPU's fast path)": (torch.index_select,
                                                                       (torch.zeros(1, 1), 1, torch.tensor([0, 1])), {}),
    "index_select past dim -1 of a 2-d tensor": (torch.index_select, (torch.zeros(2, 3), -1, torch.tensor([5])), {}),
    "index_select below 0 along dim 1 of a 3-d tensor": (torch.index_select,
                                                         (torch.zeros(2, 3, 4), 1, torch.tensor([-1])), {}),
    "index_select past dim 0 of a 2-d tensor": (torch.index_select, (torch.zeros(2, 3), 0, torch.tensor([5])), {}),
    "index_select past the end of a 1-d tensor": (torch.index_select, (torch.zeros(3), 0, torch.tensor([5])), {}),
    "abs of bools into out=": (torch.abs, (torch.zeros(3, dtype=torch.bool),), {"out": torch.zeros(3, dtype=torch.bool)}),
    "bitwise_and of floats into out=": (torch.bitwise_and, (torch.zeros(3), torch.zeros(3)), {"out": torch.zeros(3)}),
    "gelu of ints into out= (its out= form is not tagged pointwise)": (
        torch._C._nn.gelu, (torch.zeros(3, dtype=torch.long),), {"out": torch.zeros(3, dtype=torch.long)}),
    "amax of complex into out=": (torch.amax, (torch.zeros(3, 2, dtype=torch.complex64), 0),
                                  {"out": torch.zeros(2, dtype=torch.complex64)}),
    "stack of floats into a long out=": (torch.stack, ([torch.zeros(2), torch.zeros(2)],),
                                         {"out": torch.zeros(2, 2, dtype=torch.long)}),
    "cat of floats into a long out=": (torch.cat, ([torch.zeros(2), torch.zeros(2)],), {"out": torch.zeros(4, dtype=torch.long)}),
    "mean into a long out=": (torch.mean, (torch.zeros(2, 2), 0), {"out": torch.zeros(2, dtype=torch.long)}),
    "_local_scalar_dense of an empty tensor": (torch.ops.aten._local_scalar_dense.default, (torch.zeros(0),), {}),
    "bincount of an empty input with float weights (int64 counts)": (
        torch.bincount, (torch.zeros(0, dtype=torch.long),), {"weights": torch.zeros(0), "minlength": 3}),
    "index_select with a 2-d index": (torch.index_select, (torch.zeros(4, 3), 0, torch.zeros(2, 2, dtype=torch.long)),
                                      {}),
    "index_select of a 0-dim tensor with a 2-d index": (torch.index_select,
                                                        (torch.tensor(1.0), 0, torch.zeros(1, 1, dtype=torch.long)), {}),
    "index_select with a float index": (torch.index_select, (torch.zeros(4, 3), 0, torch.zeros(2)), {}),
    "index_select with an int16 index": (torch.index_select, (torch.zeros(4, 3), 0, torch.zeros(2, dtype=torch.int16)),
                                         {}),
    "index_select of a 0-dim tensor with two float indices": (torch.index_select,
                                                              (torch.tensor(1.0), 0, torch.zeros(2)), {}),
    "index_select with a 0-dim int32 index": (torch.index_select, (torch.zeros(4, 3), 1, torch.tensor(2, dtype=torch.int32)),
                                              {}),
    "index_copy": (torch.index_copy, (x34, 0, torch.tensor([0, 2]), torch.randn(2, 4)), {}),
    "index_copy with a 2-d index": (torch.index_copy, (x34, 0, torch.tensor([[0, 1]]), torch.randn(2, 4)), {}),
    "index_copy of a 0-dim source at two places": (torch.index_copy, (x34, 0, torch.tensor([0, 1]), torch.tensor(1.0)),
                                                   {}),
    "index_copy of a 0-dim source": (torch.index_copy, (x34, 0, torch.tensor([0]), torch.tensor(1.0)), {}),
    "index_copy of another rank": (torch.index_copy, (x34, 0, torch.tensor([0, 1]), torch.randn(2, 4, 1)), {}),
    "index_copy of another slice shape": (torch.index_copy, (x34, 0, torch.tensor([0, 1]), torch.randn(2, 5)), {}),
    "index_copy with int32 indices": (torch.index_copy, (x34, 0, torch.tensor([0, 1]).int(), torch.randn(2, 4)), {}),
    "index_copy of another dtype": (torch.index_copy, (x34, 0, torch.tensor([0, 1]), torch.randn(2, 4).double()), {}),
    "masked_scatter with a uint8 mask": (torch.masked_scatter, (torch.randn(3), torch.tensor([1, 0, 1], dtype=torch.uint8),
                                                                 torch.randn(3)), {}),
    "masked_scatter": (torch.masked_scatter, (torch.randn(3), torch.tensor([True, False, True]), torch.randn(3)), {}),
    "bucketize with 2-d boundaries": (torch.bucketize, (torch.randn(3), torch.randn(2, 2)), {}),
    "bucketize": (torch.bucketize, (torch.randn(3), torch.arange(4.0)), {}),
    # random sampling
    "multinomial without replacement, too many samples": (torch.multinomial, (torch.rand(3), 5), {}),
    "multinomial with replacement": (torch.multinomial, (torch.rand(3), 5, True), {}),
    "multinomial of zero samples": (torch.multinomial, (torch.rand(3), 0), {}),
    "multinomial of a 3-d input": (torch.multinomial, (torch.rand(2, 2, 3), 2), {}),
    "multinomial of ints": (torch.multinomial, (torch.rand(3).int(), 1), {}),
    "uniform_ from 3 to -1": ("uniform_", (torch.randn(3), 3, -1), {}),
    "uniform_ from 3 to 3": ("uniform_", (torch.randn(3), 3, 3), {}),
    # dtypes the CPU's elementwise kernels are not compiled for
    "abs of bools": (torch.abs, (torch.tensor([True]),), {}),
    "gelu of ints": (F.gelu, (torch.arange(3, dtype=torch.int32),), {}),
    "bitwise_and of floats": (torch.bitwise_and, (torch.randn(3), torch.randn(3)), {}),
    "relu of bools": (torch.relu, (torch.tensor([True]),), {}),
    "sign of complex numbers": (torch.sign, (torch.randn(3, dtype=torch.complex64),), {}),
    # sizes are checked before the kernel's dtypes
    "atan2 of complex numbers of unequal sizes": (torch.atan2, (torch.arange(3), torch.randn(2, dtype=torch.complex64)),
                                                  {}),
    "lerp of ints of unequal sizes": (torch.lerp, (torch.arange(2), torch.arange(3), 0.25), {}),
    "addcmul of bools of unequal sizes": (torch.addcmul, (torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool),
                                                          torch.zeros(3, dtype=torch.bool)), dict(value=0.5)),
    "bitwise_and of floats of unequal sizes": (torch.bitwise_and, (torch.randn(2, 2), torch.randn(2, 3)), {}),
    "hypot of complex numbers by floats of unequal sizes": (torch.hypot, (torch.randn(3, dtype=torch.complex64),
                                                                          torch.randn(2)), {}),
    "abs of an empty bool tensor": (torch.abs, (torch.zeros(0, dtype=torch.bool),), {}),
    "bitwise_and of ints": (torch.bitwise_and, (torch.arange(3), torch.arange(3)), {}),
    "nan_to_num_ of complex numbers": ("nan_to_num_", (torch.randn(3, dtype=torch.complex64),), {}),
    "mul of float8 tensors": (torch.mul, (torch.randn(8, 16).to(torch.float8_e4m3fn),
                                          torch.randn(8, 16).to(torch.float8_e4m3fn)), {}),
    "abs_ of bools (in place, untagged)": ("abs_", (torch.tensor([True, False]),), {}),
    "clone of float4 pairs": (torch.clone, (torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),), {}),
    # in-place forms whose functional twin is another overload
    "pow_ by a number": ("pow_", (torch.randn(3), 2), {}),
    "square_": ("square_", (torch.randn(3),), {}),
    "float_power_ by a number": ("float_power_", (torch.randn(3).double(), 2), {}),
    # a generator decides values only
    "exponential with a generator": (torch.ops.aten.exponential.default, (torch.rand(3, 4), 1.0),
                                     dict(generator=torch.Generator().manual_seed(0))),
    "masked_fill of ints with inf": ("masked_fill", (torch.tensor(3), torch.tensor(True), float("inf")), {}),
    "max of complex numbers": (torch.max, (torch.randn(3, dtype=torch.complex64),), {}),
    "amax of complex numbers": (torch.amax, (torch.randn(3, dtype=torch.complex64),), {}),
    "softmax of complex numbers": (torch.softmax, (torch.randn(3, dtype=torch.complex64), 0), {}),
    # the kernel refuses before autograd sees the complex result
    "softmax of complex numbers that require grad": (torch.softmax, (torch.randn(3, dtype=torch.complex64,
                                                                                requires_grad=True), 0), {}),
    "mul of complex numbers that require grad": (torch.mul, (torch.randn(3, dtype=torch.complex64,
                                                                         requires_grad=True), 2), {}),
    "std of ints along a dim a 0-dim tensor lacks": (torch.std, (torch.tensor(3), 1), {}),
    "std of floats": (torch.std, (torch.randn(3, 4), 1), {}),
    "max of floats along a dim": (torch.max, (torch.randn(3, 4), 1), {}),
    "layer_norm of ints": (torch.nn.functional.layer_norm, (torch.arange(4), (4,)), {}),
    "layer_norm": (torch.nn.functional.layer_norm, (torch.randn(2, 4), (4,)), {}),
    # writes into a tensor whose elements share memory
    "add_ into an expanded tensor": ("add_", (torch.zeros(3, 1).expand(3, 3), 1), {}),
    "mul_ into an expanded tensor": ("mul_", (torch.zeros(1).expand(3), torch.randn(3)), {}),
    "copy_ into an expanded tensor": ("copy_", (torch.zeros(1).expand(3), torch.randn(3)), {}),
    # an input that partially overlaps the written tensor (views of one storage)
    "add_ of the previous elements": (add_previous, (torch.arange(4.0),), {}),
    "add_ of a disjoint slice": (add_disjoint, (torch.arange(4.0),), {}),
    "add_ of the same elements transposed": (add_transposed, (torch.arange(4.0),), {}),
    "add_ of a 0-dim element inside": (add_element_inside, (torch.arange(4.0),), {}),
    "add_ of a 0-dim element outside": (add_element_outside, (torch.arange(4.0),), {}),
    "abs into an out= shifted by one": (abs_shifted_out, (torch.arange(4.0),), {}),
    "copy_ of the previous elements": (copy_previous, (torch.arange(4.0),), {}),
    "clamp_ by the previous elements": (clamp_previous, (torch.arange(4.0),), {}),
    "mul_ of strided views (too hard to tell: torch lets them pass)": (
        mul_strided, (torch.arange(4.0),), {}),
    "copy_ of float16 over float32 (FBGEMM converts before any check)": (copy_float16_over_float32,
                                                                         (torch.randn(16),), {}),
    "copy_ of bfloat16 over float32": (copy_bfloat16_over_float32, (torch.randn(16),), {}),
    "frexp's two outputs overlapping each other, not the input": (frexp_outputs_overlapping_each_other,
                                                                  (torch.randn(16),), {}),
    "frexp's exponent over its input": (frexp_exponent_over_the_input, (torch.randn(16),), {}),
    "gelu into a shifted out= (its out= form is not tagged pointwise)": (gelu_into_a_shifted_out,
                                                                         (torch.randn(16),), {}),
    "where into a shifted out=": (where_into_a_shifted_out, (torch.randn(16),), {}),
    "uniform_ into an expanded tensor": (uniform_into_an_expanded_tensor, (torch.randn(16),), {}),
    "bernoulli_ by probabilities overlapping self": (bernoulli_by_overlapping_probabilities, (torch.rand(16),), {}),
    "frexp into an expanded mantissa": (torch.frexp, (torch.randn(3),),
                                        dict(out=(torch.zeros(1).expand(3), torch.zeros(3, dtype=torch.int32)))),
    "fill_ of an expanded tensor": ("fill_", (torch.zeros(1).expand(3), 1.0), {}),
    # kernels that are not TensorIterator's decide for themselves (fuzzer findings: the host's kernel is asked)
    "masked_fill_ of an expanded tensor (the CPU kernel warns and writes)": (
        "masked_fill_", (torch.zeros(1, 4).expand(3, 4), torch.rand(3, 4) > 0.5, 1.0), {}),
    "addmm_ into an expanded tensor": ("addmm_", (torch.zeros(1, 4).expand(3, 4), torch.randn(3, 2), torch.randn(2, 4)),
                                       {}),
    "addbmm_ into an expanded tensor": (
        "addbmm_", (torch.zeros(4).expand(3, 4), torch.randn(2, 3, 5), torch.randn(2, 5, 4)), {}),
    "scatter_ into an expanded tensor": (
        "scatter_", (torch.zeros(4).expand(3, 4), 0, torch.zeros(1, 4, dtype=torch.int64), 1.0), {}),
    "index_add_ into an expanded tensor": (
        "index_add_", (torch.zeros(4).expand(3, 4), 0, torch.tensor([1]), torch.ones(1, 4)), {}),
    "masked_scatter_ into an expanded tensor": (
        "masked_scatter_", (torch.zeros(4).expand(3, 4), torch.ones(3, 4, dtype=torch.bool), torch.ones(12)), {}),
    "index_fill_ of an expanded tensor": ("index_fill_", (torch.zeros(4).expand(3, 4), 0, torch.tensor([1]), 2.0), {}),
    "copy_ of a number (fuzzer finding: the FBGEMM test read its dtype)": ("copy_", (torch.zeros(()), 0), {}),
    "copy_ of a number into float16": ("copy_", (torch.zeros(3, dtype=torch.float16), 2), {}),
    "add_ into a transposed tensor": ("add_", (torch.zeros(3, 4).t(), 1), {}),
    "abs_ of an expanded tensor": ("abs_", (torch.zeros(1).expand(3),), {}),
    "conj_physical_ of an expanded real tensor": ("conj_physical_", (torch.zeros(1).expand(3),), {}),
    # an out= (or self) that an input overlaps, in kernels that are not elementwise (asked of the host)
    "cat into an out= overlapping its inputs": (cat_into_an_overlapping_out, (torch.randn(40),), {}),
    "cat into an out= that is its input": (cat_into_its_own_input, (torch.randn(40),), {}),
    "index_select into an expanded out=": (index_select_into_an_expanded_out, (torch.randn(40),), {}),
    "mm into an out= overlapping its inputs (mm does not check)": (mm_into_an_overlapping_out, (torch.randn(40),), {}),
    "mm into an expanded out=": (mm_into_an_expanded_out, (torch.randn(40),), {}),
    "addmm into an out= overlapping its inputs": (addmm_into_an_overlapping_out, (torch.randn(40),), {}),
    "sum into an out= overlapping its input (sum does not check)": (sum_into_an_overlapping_out, (torch.randn(40),), {}),
    "cumsum into an out= overlapping its input": (cumsum_into_an_overlapping_out, (torch.randn(40),), {}),
    "sort into an out= overlapping its input": (sort_into_an_overlapping_out, (torch.randn(40),), {}),
    "index_add_ of a source inside self": (index_add_of_a_source_inside_self, (torch.randn(40),), {}),
    "index_add_ of a source inside self, in a large storage (the stand-ins span the views only)": (
        index_add_of_a_source_inside_self, (torch.randn(1 << 20),), {}),
    "put_ of values inside self": (put_of_values_inside_self, (torch.randn(40),), {}),
    "masked_scatter_ of a source overlapping self (not checked)": (masked_scatter_of_a_source_overlapping_self,
                                                                   (torch.randn(40),), {}),
    # elementwise out= forms whose kernel is composite: computed, then copied, so never checked
    "clone into a shifted out=": (clone_into_a_shifted_out, (torch.randn(40),), {}),
    "div by a number into a shifted out=": (div_by_a_number_into_a_shifted_out, (torch.randn(40),), {}),
    # out= forms whose python Meta kernel takes no out= argument (a TypeError): their composite out= kernel runs
    "embedding_dense_backward into out=": (torch.ops.aten.embedding_dense_backward.out,
                                           (torch.randn(4, 2), torch.tensor([0, 1, 2, 3]), 4, -1, False),
                                           dict(out=torch.empty(4, 2))),
    "embedding_dense_backward into an empty out= (resized)": (
        torch.ops.aten.embedding_dense_backward.out, (torch.randn(4, 2), torch.tensor([0, 1, 2, 3]), 4, -1, False),
        dict(out=torch.empty(0))),
    "embedding_dense_backward into a float64 out=": (
        torch.ops.aten.embedding_dense_backward.out, (torch.randn(4, 2), torch.tensor([0, 1, 2, 3]), 4, -1, False),
        dict(out=torch.empty(4, 2, dtype=torch.float64))),
    "_weight_norm_interface into out0= and out1=": (torch.ops.aten._weight_norm_interface.out,
                                                    (torch.randn(3, 4), torch.randn(3, 1), 0),
                                                    dict(out0=torch.empty(3, 4), out1=torch.empty(3, 1))),
    "bucketize of a number into out=": (torch.ops.aten.bucketize.Scalar_out, (0.5, torch.arange(4.0)),
                                        dict(out=torch.empty((), dtype=torch.long))),
    "resize_as into out=": (torch.ops.aten.resize_as.out, (torch.randn(3), torch.randn(2, 2)), dict(out=torch.empty(0))),
    # out= tensors of another floating dtype than the inputs': TensorIterator casts, other kernels refuse
    "index_select into a float64 out=": (torch.index_select, (x34, 0, torch.tensor([0, 1])),
                                         dict(out=torch.empty(2, 4, dtype=torch.float64))),
    "take into a float64 out=": (torch.take, (x34, torch.tensor([0, 1])), dict(out=torch.empty(2, dtype=torch.float64))),
    "tril into a float64 out=": (torch.tril, (x34,), dict(out=torch.empty(3, 4, dtype=torch.float64))),
    "softmax into a float64 out=": (torch.ops.aten._softmax.out, (x34, 1, False),
                                    dict(out=torch.empty(3, 4, dtype=torch.float64))),
    "sort into a float64 values=": (torch.sort, (torch.randn(4),),
                                    dict(out=(torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.long)))),
    "aminmax into float64 min= and max=": (torch.aminmax, (torch.randn(4),), dict(
        out=(torch.empty((), dtype=torch.float64), torch.empty((), dtype=torch.float64)))),
    "complex of float32 into a complex128 out=": (torch.complex, (torch.randn(2), torch.randn(2)),
                                                  dict(out=torch.empty(2, dtype=torch.complex128))),
    "complex of float32 into a complex64 out=": (torch.complex, (torch.randn(2), torch.randn(2)),
                                                 dict(out=torch.empty(2, dtype=torch.complex64))),
    "cumsum into a float64 out= (TensorIterator casts)": (torch.cumsum, (torch.randn(4), 0),
                                                          dict(out=torch.empty(4, dtype=torch.float64))),
    "cat into a float64 out=": (torch.cat, ([torch.randn(2), torch.randn(2)],), dict(out=torch.empty(4, dtype=torch.float64))),
    "sum into a float64 out=": (torch.sum, (x34, 0), dict(out=torch.empty(4, dtype=torch.float64))),
    "angle of float32 into a float64 out=": (torch.angle, (torch.randn(2),), dict(out=torch.empty(2, dtype=torch.float64))),
    # out= forms run on the host (no meta kernel): an empty out= grows to the result, as the kernel resized it
    "geqrf into empty out= tensors": (torch.geqrf, (torch.randn(5, 5),), dict(out=(torch.empty(0), torch.empty(0)))),
    "geqrf into a transposed out=": (torch.geqrf, (torch.randn(5, 5),), dict(out=(torch.empty(5, 5).t(), torch.empty(5)))),
    "histogram into empty out= tensors": (torch.histogram, (torch.randn(8), 2), dict(out=(torch.empty(0), torch.empty(0)))),
    # integer tensors the meta kernel keeps in its result, where the CPU kernel has no integer form
    "softmax of ints": (F.softmax, (torch.ones(2, 3, dtype=torch.int64), 1), {}),
    "batch_norm of ints in inference (fuzzer finding)": (
        F.batch_norm, (torch.ones(2, 1, 1, 1, dtype=torch.int64), torch.zeros(1), torch.ones(1)), {}),
    "batch_norm of ints by a weight that requires grad": (
        batch_norm_by_a_weight_that_requires_grad, (torch.ones(2, 1, 1, 1, dtype=torch.int64),), {}),
    "cumsum of ints (its CPU kernel has an integer form)": (torch.cumsum, (torch.ones(2, 3, dtype=torch.int64), 1),
                                                            {}),
    "cat of bools": (torch.cat, ([torch.ones(2, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)],), {}),
    # index, target and sorter tensors narrower than int64, which some CPU kernels refuse and others take
    "searchsorted with an int32 sorter": (torch.searchsorted, (torch.arange(10.0), torch.randn(3)),
                                          dict(sorter=torch.arange(10, dtype=torch.int32))),
    "searchsorted with an int64 sorter": (torch.searchsorted, (torch.arange(10.0), torch.randn(3)),
                                          dict(sorter=torch.arange(10))),
    "put with an int32 index": (torch.put, (torch.randn(10), torch.tensor([1, 2], dtype=torch.int32), torch.randn(2)), {}),
    "put with a uint8 index": (torch.put, (torch.randn(10), torch.tensor([1, 2], dtype=torch.uint8), torch.randn(2)), {}),
    "put": (torch.put, (torch.randn(10), torch.tensor([1, 2]), torch.randn(2)), {}),
    "take with an int32 index": (torch.take, (x34, torch.tensor([0, 1], dtype=torch.int32)), {}),
    "nll_loss with an int32 target": (F.nll_loss, (torch.randn(3, 5), torch.tensor([1, 2, 3], dtype=torch.int32)), {}),
    "cross_entropy with an int32 target": (F.cross_entropy, (torch.randn(3, 5), torch.tensor([1, 2, 3], dtype=torch.int32)),
                                           {}),
    "nll_loss": (F.nll_loss, (torch.randn(3, 5), torch.tensor([1, 2, 3])), {}),
    "multi_margin_loss with an int32 target": (F.multi_margin_loss, (x34, torch.tensor([0, 1, 2], dtype=torch.int32)), {}),
    "index_fill with an int32 index (IndexError)": (torch.index_fill, (x34, 0, torch.tensor([0, 1], dtype=torch.int32), 1.0),
                                                    {}),
    "index_add with an int16 index": (torch.index_add, (x34, 0, torch.tensor([0, 1], dtype=torch.int16), torch.ones(2, 4)),
                                      {}),
    "max_unpool1d with int32 indices": (F.max_unpool1d, (torch.randn(1, 1, 2), torch.tensor([[[0, 1]]], dtype=torch.int32),
                                                         2), {}),
    "gather with an int32 index (its CPU kernel takes int32)": (torch.gather, (x34, 0, torch.zeros(2, 4, dtype=torch.int32)),
                                                                {}),
    "embedding with int32 indices": (F.embedding, (torch.tensor([0, 1], dtype=torch.int32), x34), {}),
    "scatter with an int32 index": (torch.scatter, (x34, 0, torch.zeros(2, 4, dtype=torch.int32), 1.0), {}),
    "bucketize by int32 boundaries": (torch.bucketize, (torch.randn(3), torch.arange(4, dtype=torch.int32)), {}),
    # inputs of dtypes a CPU pooling or sampling kernel is not compiled for
    "grid_sample of uint8": (F.grid_sample, (torch.zeros(1, 1, 4, 4, dtype=torch.uint8), torch.rand(1, 2, 2, 2)),
                             dict(align_corners=False)),
    "grid_sample": (F.grid_sample, (torch.randn(1, 1, 4, 4), torch.rand(1, 2, 2, 2)), dict(align_corners=False)),
    # a CompositeImplicitAutograd op whose CPU kernel is its own, not its parts' (max_pool2d takes ints)
    "max_pool1d of uint8": (F.max_pool1d, (torch.zeros(2, 3, 8, dtype=torch.uint8), 2), {}),
    "max_pool1d of int64": (torch.max_pool1d, (torch.zeros(2, 3, 8, dtype=torch.int64), 2), {}),
    "max_pool1d of bools, strided": (F.max_pool1d, (torch.zeros(2, 3, 8, dtype=torch.bool), 3), dict(stride=1, padding=1)),
    "MaxPool1d of int32": (torch.nn.MaxPool1d(2), (torch.zeros(2, 3, 8, dtype=torch.int32),), {}),
    "MaxPool1d": (torch.nn.MaxPool1d(2), (torch.randn(2, 3, 8),), {}),
    "max_pool1d of float16": (F.max_pool1d, (torch.randn(2, 3, 8).half(), 2), {}),
    "max_pool2d of uint8 (its CPU kernel takes integers)": (F.max_pool2d, (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), 2),
                                                             {}),
    "one_hot of int32": (F.one_hot, (torch.zeros(3, dtype=torch.int32), 4), {}),
    # in-place ops whose functional twin has another overload name (fuzzer finding: accepted)
    "floor_divide_ broadcasting self to a bigger shape": (
        torch.ops.aten.floor_divide_.Tensor, (torch.rand(5, 5) + 1, torch.rand(2, 5, 5) + 1), {}),
    "floor_divide_ by a broadcast row": (torch.ops.aten.floor_divide_.Tensor, (torch.rand(5, 5) + 1, torch.rand(5, 1) + 1),
                                         {}),
    "pow_ broadcasting self to a bigger shape": (torch.ops.aten.pow_.Tensor, (torch.rand(5, 5), torch.rand(2, 5, 5)), {}),
    "pow_ by a broadcast row": (torch.ops.aten.pow_.Tensor, (torch.rand(5, 5), torch.rand(5, 1)), {}),
    "float_power_ broadcasting self to a bigger shape": (
        torch.ops.aten.float_power_.Tensor, (torch.rand(5, 5, dtype=torch.float64), torch.rand(2, 5, 5)), {}),
    "ldexp_ broadcasting self to a bigger shape": (torch.ops.aten.ldexp_.default, (torch.rand(5, 5), torch.ones(2, 5, 5)),
                                                   {}),
    # adaptive average pooling of empty dims (the meta kernels accepted them; a 1x1 output is a mean)
    "adaptive_avg_pool2d of an empty row": (F.adaptive_avg_pool2d, (torch.randn(1, 1, 0, 5), (2, 3)), {}),
    "adaptive_avg_pool2d of an empty column, unbatched": (F.adaptive_avg_pool2d, (torch.randn(1, 4, 0), (2, 3)), {}),
    "adaptive_avg_pool2d of no channels": (F.adaptive_avg_pool2d, (torch.randn(1, 0, 4, 5), (2, 3)), {}),
    "adaptive_avg_pool2d to 1x1 of an empty row": (F.adaptive_avg_pool2d, (torch.randn(1, 1, 0, 5), (1, 1)), {}),
    "adaptive_avg_pool1d of an empty row": (F.adaptive_avg_pool1d, (torch.randn(1, 1, 0), 3), {}),
    "adaptive_avg_pool3d of no channels": (F.adaptive_avg_pool3d, (torch.randn(1, 0, 2, 4, 4), (2, 2, 2)), {}),
    "adaptive_avg_pool3d of an empty batch": (F.adaptive_avg_pool3d, (torch.randn(0, 1, 2, 4, 4), (2, 2, 2)), {}),
    "adaptive_avg_pool3d of an empty last dim, unbatched": (F.adaptive_avg_pool3d, (torch.randn(1, 2, 4, 0), (2, 2, 2)),
                                                            {}),
    # _grouped_mm on the CPU (aten/src/ATen/native/GroupedMMUtils.h), where the meta kernel checks CUDA's bfloat16
    "_grouped_mm of float32": (torch._grouped_mm, (torch.randn(10, 8), torch.randn(3, 8, 4), _OFFS), {}),
    "_grouped_mm of float64": (torch._grouped_mm, (torch.randn(10, 8).double(), torch.randn(3, 8, 4).double(), _OFFS), {}),
    "_grouped_mm of float32 into bfloat16": (torch._grouped_mm, (torch.randn(10, 8), torch.randn(3, 8, 4), _OFFS),
                                             dict(out_dtype=torch.bfloat16)),
    "_grouped_mm of rows not a multiple of 16 bytes": (torch._grouped_mm, (torch.randn(10, 8), torch.randn(3, 8, 6), _OFFS),
                                                        {}),
    "_grouped_mm of a 2-d by a 3-d tensor without offsets": (torch._grouped_mm, (torch.randn(10, 8), torch.randn(3, 8, 4)),
                                                             {}),
    "_grouped_mm with int64 offsets": (torch._grouped_mm, (torch.randn(10, 8), torch.randn(3, 8, 4), _OFFS.long()), {}),
    "_grouped_mm of 3-d tensors with offsets": (torch._grouped_mm, (torch.randn(3, 4, 8), torch.randn(3, 8, 4), _OFFS), {}),
}


@pytest.mark.filterwarnings("ignore:masked_scatter_ received a mask with dtype torch.uint8")
@pytest.mark.filterwarnings("ignore:Use of masked_fill_ on expanded tensors is deprecated")
@pytest.mark.parametrize("name", CASES)
def test_fxprop_refuses_exactly_where_real_execution_does(name):
    target, args, kwargs = CASES[name]
    try:
        check_rule(target, *args, **kwargs)
    except fxprop.PropagationError as refusal:  # check_rule re-raises only when real execution raised alike
        assert not isinstance(refusal, fxprop.InternalError), refusal


def test_copy_of_a_tensor_into_itself_writes_nothing_and_is_not_refused():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_method("expand", (x, 3, 4))
    graph.output(graph.call_method("copy_", (y, y)))
    fxprop.testing.assert_matches_real(torch.fx.GraphModule(torch.nn.Module(), graph), torch.zeros(1, 4))
    base = torch.zeros(1, 4)
    base.expand(3, 4).copy_(base.expand(3, 4))  # real execution agrees: two views alike, one memory


def _refusal_of_real_and_fxprop(fn, *inputs):
    gm = torch.fx.symbolic_trace(fn)
    with pytest.raises(Exception) as real:
        fn(*inputs)
    with pytest.raises(fxprop.PropagationError) as ours:
        fxprop.propagate(gm, *inputs)
    return real.value, ours.value


def test_index_select_with_an_arange_index_refuses_as_the_cpu_kernel_does():
    real, ours = _refusal_of_real_and_fxprop(lambda x: torch.index_select(x, 1, torch.arange(2)),
                                             torch.zeros(1, 1, dtype=torch.int64))
    assert ours.refuses_like(real) and ours.error_type is RuntimeError, ours


def test_host_stand_ins_for_an_index_stay_in_range():
    """The host is asked whether its kernel takes complex values; the stand-in index must not
    itself be refused (an index of one into a dim of size one)."""
    gm = torch.fx.symbolic_trace(lambda x: x[..., torch.arange(1)])
    fxprop.testing.assert_matches_real(gm, torch.randn(1, dtype=torch.complex64))


def test_copy_of_an_expanded_input_into_a_view_of_itself_writes_nothing():
    gm = torch.fx.symbolic_trace(lambda x: x.copy_(torch.squeeze(x)))
    fxprop.testing.assert_matches_real(gm, torch.zeros(1).expand(2))
    fxprop.propagate(gm, fxprop.TensorSpec((2,), stride=(0,)))


_SELECTED_SHAPES = [(0,), (3,), (), (1, 1, 0), (0, 3), (2, 0), (2, 3), (2, 3, 4), (0, 0), (1, 0, 2), (2, 0, 3)]


@pytest.mark.parametrize("shape", _SELECTED_SHAPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index", [[0], [1], [5], [-1], [0, 1]], ids=str)
def test_index_select_refuses_indices_as_each_cpu_path_does(shape, dim, index):
    """Out-of-range indices are an IndexError or a RuntimeError, and an empty dim refused or not,
    by which path of the CPU kernel the rank, the dim and emptiness pick."""
    try:
        check_rule(torch.index_select, torch.zeros(shape), dim, torch.tensor(index))
    except fxprop.PropagationError as refusal:
        assert not isinstance(refusal, fxprop.InternalError), refusal


@pytest.mark.parametrize("weight_shape", [(2, 0), (2, 3), (0, 3)], ids=str)
@pytest.mark.parametrize("count", [2, 3])
def test_embedding_of_an_arange_refuses_as_index_select_of_its_rows_does(weight_shape, count):
    graph = torch.fx.Graph()
    weight = graph.placeholder("weight")
    indices = graph.call_function(torch.arange, (count,))
    graph.output(graph.call_function(F.embedding, (indices, weight)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    try:
        gm(torch.zeros(weight_shape))
        real = None
    except Exception as error:
        real = error
    try:
        fxprop.propagate(gm, fxprop.TensorSpec(weight_shape))
    except fxprop.PropagationError as refusal:
        assert real is not None and refusal.refuses_like(real), (real, refusal)
    else:
        assert real is None, real


_IN_PLACE_CALLS = {
    "add_float_into_int": (lambda a, b: a.add_(b), (torch.int64, (3, 4)), (torch.float32, (4,))),
    "add_int_into_float": (lambda a, b: a.add_(b), (torch.float32, (3, 4)), (torch.int64, (4,))),
    "add_0dim_double_into_half": (lambda a, b: a.add_(b), (torch.float16, (3, 4)), (torch.float64, ())),
    "add_broadcast_into_smaller": (lambda a, b: a.add_(b), (torch.float32, (3, 1)), (torch.float32, (3, 4))),
    "mul_bool_into_int": (lambda a, b: a.mul_(b), (torch.int32, (3, 4)), (torch.bool, (3, 4))),
    "div_into_int": (lambda a, b: a.div_(b), (torch.int64, (3, 4)), (torch.int64, (3, 4))),
    "div_floor_into_int": (lambda a, b: a.div_(b, rounding_mode="floor"), (torch.int64, (3, 4)), (torch.int64, (4,))),
    "sqrt_of_int": (lambda a, b: a.sqrt_(), (torch.int64, (3, 4)), (torch.float32, ())),
    "hardtanh_of_half": (lambda a, b: torch.nn.functional.hardtanh_(a), (torch.float16, (3, 4)), (torch.float32, ())),
    "clamp_with_a_float_bound": (lambda a, b: a.clamp_(min=0.5), (torch.int64, (3, 4)), (torch.float32, ())),
    "pow_by_float": (lambda a, b: a.pow_(2.5), (torch.int64, (3, 4)), (torch.float32, ())),
    "bitwise_and_of_bools": (lambda a, b: a.bitwise_and_(b), (torch.bool, (3, 4)), (torch.bool, (4,))),
}


@pytest.mark.parametrize("name", list(_IN_PLACE_CALLS))
def test_in_place_refusals_are_the_same_when_the_result_dtype_is_remembered(name):
    """An in-place call's result dtype is kept per (op, dtypes, 0-dim flags, number types); the
    second propagation of each call reads it from there. Both must refuse, or accept with the
    right value, exactly as real execution does."""
    fn, (first_dtype, first_shape), (second_dtype, second_shape) = _IN_PLACE_CALLS[name]

    def program(a, b):
        return fn(a, b) + 0

    def make(dtype, shape):
        return (torch.rand(shape) * 4 + 1).to(dtype)
    a, b = make(first_dtype, first_shape), make(second_dtype, second_shape)
    try:
        program(a.clone(), b)
        real_error = None
    except Exception as error:  # noqa: BLE001 (the real refusal, whatever its type)
        real_error = type(error)
    gm = torch.fx.symbolic_trace(program)
    for _ in range(2):
        if real_error is None:
            fxprop.testing.assert_matches_real(gm, a.clone(), b)
        else:
            with pytest.raises(fxprop.PropagationError) as caught:
                fxprop.propagate(gm, a.clone(), b)
            assert caught.value.error_type is real_error


def test_a_uint8_mask_of_unknown_values_is_not_judged_as_an_index():
    """A uint8 tensor among index_put's indices is a mask: its zero stand-ins select nothing, so five
    values do not fit, where int64 zeros select five elements. The refusal is the stand-ins' values',
    never the node's (real execution with a mask of five ones accepts)."""
    def put_by_mask(x, mask, values):
        return torch.ops.aten.index_put(x, [mask], values)
    expected = put_by_mask(torch.zeros(5), torch.ones(5, dtype=torch.uint8), torch.ones(5))
    gm = torch.fx.symbolic_trace(put_by_mask)
    out = fxprop.propagate(gm, fxprop.TensorSpec((5,)), fxprop.TensorSpec((5,), dtype=torch.uint8),
                           fxprop.TensorSpec((5,)), cache=False)
    assert (out.shape, out.dtype, out.stride()) == (expected.shape, expected.dtype, expected.stride())


def test_calls_with_int64_indices_are_not_asked_of_the_host(monkeypatch):
    """The index family is asked only for narrower integer dtypes: int64 indices, the common case,
    cost no call of a host kernel."""
    from fxprop.aten import host_dtypes
    asked = []
    ask = host_dtypes._ask_the_host
    monkeypatch.setattr(host_dtypes, "_ask_the_host", lambda op, *rest: asked.append(op) or ask(op, *rest))

    def indexing(weight, ids, target):
        rows = F.embedding(ids, weight)
        picked = torch.gather(weight, 0, ids.view(-1, 1).expand(-1, 4))
        loss = F.nll_loss(weight[:3], target)
        return rows, picked, loss, torch.take(weight, ids), torch.index_select(weight, 1, ids)
    inputs = (torch.randn(5, 4), torch.tensor([0, 2, 1]), torch.tensor([1, 0, 2]))
    fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(indexing), *inputs)
    assert asked == []


_plain_leaves = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False, width=16), st.none(), st.booleans(),
                          st.sampled_from([torch.float32, torch.int64, "mean", torch.device("cpu")]),
                          st.builds(lambda n: torch.zeros(n), st.integers(0, 3)))
_plain_arguments = st.recursive(_plain_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["dim", "out", "alpha"]), inner, max_size=3)), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(first=st.tuples(st.lists(_plain_arguments, max_size=3).map(tuple),
                       st.dictionaries(st.sampled_from(["dim", "keepdim"]), _plain_arguments, max_size=2)),
       second=st.tuples(st.lists(_plain_arguments, max_size=3).map(tuple),
                        st.dictionaries(st.sampled_from(["dim", "keepdim"]), _plain_arguments, max_size=2)))
def test_the_host_answers_key_a_call_by_its_structure_as_pytree_does(first, second):
    """The host's answers are keyed by a call's leaves and structure: flattened as pytree
    flattens them, and two calls share a structure exactly when their pytree specs are equal."""
    from fxprop.aten.host_dtypes import _flattened
    from torch.utils import _pytree as pytree
    flat, structure = _flattened(*first)
    expected_flat, spec = pytree.tree_flatten(first)
    assert len(flat) == len(expected_flat) and all(a is b for a, b in zip(flat, expected_flat))
    other_flat, other_structure = _flattened(*second)
    assert (structure == other_structure) == (spec == pytree.tree_structure(second))


def test_the_host_answers_calls_whose_arguments_pytree_alone_flattens():
    """A named tuple among the arguments (pytree flattens it; the plain structure does not know it):
    the call is flattened by pytree, and keyed apart from a plain tuple's."""
    from collections import namedtuple
    from fxprop.aten.host_dtypes import _flattened
    from torch.utils import _pytree as pytree
    Pair = namedtuple("Pair", "a b")
    args = (Pair(torch.zeros(2), 1),)
    flat, structure = _flattened(args, {})
    assert structure == pytree.tree_structure((args, {})) and flat[1] == 1
    assert structure != _flattened((tuple(args[0]),), {})[1]


def _matches_real_or_refuses_alike(fn, *inputs):
    """``fn`` traced and propagated on ``inputs``: refused as real execution refuses it (same
    exception type), or matching real execution's result."""
    try:
        fn(*[t.clone() for t in inputs])
    except Exception as error:  # noqa: BLE001 (the refusal fxprop must match)
        with pytest.raises(fxprop.PropagationError) as ours:
            fxprop.propagate(torch.fx.symbolic_trace(fn), *inputs)
        assert ours.value.refuses_like(error), (ours.value, error)
    else:
        fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(fn), *inputs)


_MASK = torch.tensor([[True, False, True], [False, False, True]])
_INDEX_PUTS = {
    "values of another dtype": (lambda x, i, v: x.index_put_([i], v), torch.tensor([0, 1]), torch.ones(2, 3).double()),
    "out of place, another dtype": (lambda x, i, v: torch.index_put(x, [i], v), torch.tensor([0, 1]),
                                    torch.ones(3).double()),
    "accumulated, another dtype": (lambda x, i, v: x.index_put_((i,), v, accumulate=True), torch.tensor([0, 1]),
                                   torch.ones(2, 3).double()),
    "x[i] = a 0-dim tensor of another dtype": (lambda x, i, v: x.__setitem__(i, v), torch.tensor([1]),
                                                torch.tensor(2.0).double()),
    "values that do not broadcast": (lambda x, i, v: x.index_put_([i], v), torch.tensor([0, 1]), torch.ones(2)),
    "values of more dims": (lambda x, i, v: x.index_put_([i], v), torch.tensor([0, 1]), torch.ones(1, 2, 3)),
    "values that broadcast": (lambda x, i, v: x.index_put_([i], v), torch.tensor([0, 1]), torch.ones(3)),
    "a mask filled with one element of another dtype": (lambda x, m, v: x.index_put_([m], v), _MASK,
                                                        torch.tensor(1.0).double()),
    "a mask accumulating one element of another dtype": (lambda x, m, v: x.index_put_([m], v, accumulate=True),
                                                         _MASK, torch.tensor(1.0).double()),
    "a uint8 mask filled with one element": (lambda x, m, v: x.index_put_([m], v), _MASK.to(torch.uint8),
                                             torch.tensor(1.0)),
    "a mask given values of another dtype": (lambda x, m, v: x.index_put_([m], v), _MASK, torch.ones(3).double()),
    "a mask of the wrong shape": (lambda x, m, v: x.index_put_([m], v), torch.tensor([True, False, True]),
                                  torch.tensor(1.0)),
    "a mask and an index, one element of another dtype": (
        lambda x, m, i, v: torch.ops.aten.index_put_(x, [m, i], v), torch.tensor([True, False]), torch.tensor([0]),
        torch.tensor(1.0).double()),
    "one element and no mask": (lambda x, v: torch.ops.aten.index_put_(x, [None], v), torch.tensor(1.0)),
    "too many indices": (lambda x, i, v: torch.ops.aten.index_put_(x, [i, i, i], v), torch.tensor([0]),
                         torch.tensor(1.0)),
    "an index out of range": (lambda x, i, v: x.index_put_([i], v), torch.tensor([5]), torch.ones(3)),
}


@pytest.mark.parametrize("case", list(_INDEX_PUTS))
def test_index_put_checks_its_values_as_the_cpu_kernel_does(case):
    """index_put's meta kernels check nothing; ATen fills a mask with one element through
    masked_fill_, and otherwise wants values of self's dtype that broadcast to the indexed result."""
    fn, *inputs = _INDEX_PUTS[case]
    _matches_real_or_refuses_alike(fn, torch.zeros(2, 3), *inputs)


@pytest.mark.parametrize("op", [torch.bitwise_and, torch.lcm, torch.add], ids=lambda op: op.__name__)
def test_an_out_tensor_that_is_also_an_input_is_asked_of_the_host_as_the_input_it_is(op):
    """``op(x, y, out=x)``: the out= tensor stands in for the host as the full input it also is
    (an empty stand-in would make the host refuse the sizes, which hid the refusal of the dtypes)."""
    _matches_real_or_refuses_alike(lambda x, y: op(x, y, out=x), torch.randn(2, 3), torch.randn(2, 3))


@pytest.mark.parametrize("fn", [lambda x: torch.nansum(x, 0, dtype=torch.complex64),
                                lambda x: torch.sum(x, 0, dtype=torch.int8),
                                lambda x: torch.cumsum(x, 0, dtype=torch.int16),
                                lambda x: torch.prod(x, dtype=torch.complex128),
                                lambda x: x.to(torch.uint8) + 1],
                         ids=["nansum into complex64", "sum into int8", "cumsum into int16", "prod into complex128",
                              "to uint8"])
def test_the_dtype_an_op_is_told_to_compute_in_is_asked_of_the_host(fn):
    """A ``dtype=`` that few kernels implement, or a narrow integer one, is asked of the host's
    kernel as an input of that dtype would be (``nansum`` has no complex CPU kernel)."""
    _matches_real_or_refuses_alike(fn, torch.randn(2, 3))


_MASK_5 = torch.tensor([True, False, True, True, False])
_INDEX_PUTS_OF_ANY_SELF = {  # adversary findings, each against real execution
    "x[0, m] = a 0-dim int64 tensor (masked_fill_ of a view)": (lambda x, m, v: x.__setitem__((0, m), v),
                                                                torch.zeros(2, 3), torch.tensor([True, False, True]),
                                                                torch.tensor(1)),
    "x[1:, m] = a 0-dim int64 tensor": (lambda x, m, v: x.__setitem__((slice(1, None), m), v), torch.zeros(2, 3),
                                         torch.tensor([True, False, True]), torch.tensor(1)),
    "a mask of more dims than self has": (lambda x, m, v: x.index_put_([m], v), torch.zeros(5),
                                          torch.ones(5, 1, dtype=torch.bool), torch.tensor(1.0)),
    "a mask of more dims, accumulated": (lambda x, m, v: x.index_put_([m], v, accumulate=True), torch.zeros(5, 3),
                                         torch.ones(5, 3, 1, dtype=torch.bool), torch.ones(15)),
    "only Nones, accumulated": (lambda x, v: torch.ops.aten.index_put_(x, [None], v, True), torch.zeros(5, 3),
                                torch.tensor(2.0)),
    "only Nones, several values": (lambda x, v: torch.ops.aten.index_put_(x, [None], v), torch.zeros(5, 3),
                                   torch.ones(5, 3)),
    "a 0-dim mask, values of one more dim": (lambda x, m, v: torch.ops.aten.index_put_(x, [m], v), torch.zeros(5, 3),
                                             torch.tensor(True), torch.ones(1, 5, 3)),
    "a mask and an index, values of another dtype": (lambda x, m, i, v: x.index_put_((m, i), v), torch.zeros(5, 3),
                                                     _MASK_5, torch.tensor([0, 2, 1]), torch.ones(3, dtype=torch.int64)),
}


@pytest.mark.parametrize("case", list(_INDEX_PUTS_OF_ANY_SELF))
def test_index_put_writes_and_refuses_as_the_cpu_kernel_does(case):
    fn, *inputs = _INDEX_PUTS_OF_ANY_SELF[case]
    _matches_real_or_refuses_alike(fn, *inputs)


def test_index_put_on_the_meta_device_is_checked_as_the_meta_device_checks_it():
    """An index_put on the meta device runs the meta device's kernels, not the CPU's checks."""
    fn = lambda x, m, v: x.__setitem__(m, v)  # noqa: E731
    inputs = (torch.zeros(5, 3, device="meta"), torch.ones(5, 3, dtype=torch.bool, device="meta"),
              torch.ones((), dtype=torch.int64, device="meta"))
    fn(*inputs)
    fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(fn), *inputs)


def test_index_put_with_symbolic_values_refuses_another_dtype_whatever_their_count():
    """With an index tensor (or accumulate) ATen never fills a mask, so values of another dtype are
    refused whether or not they turn out to be one element."""
    gm = torch.fx.symbolic_trace(lambda x, i, v: x.index_put_([i], v))
    for count in (1, 2):
        with pytest.raises(RuntimeError):
            gm(torch.zeros(4, 3), torch.tensor([0, 1][:count]), torch.ones(count, dtype=torch.int64))
    with pytest.raises(fxprop.PropagationError) as ours:
        fxprop.propagate(gm, fxprop.TensorSpec(("B", 3)), fxprop.TensorSpec(("N",), dtype=torch.int64),
                         fxprop.TensorSpec(("K",), dtype=torch.int64))
    assert ours.value.error_type is RuntimeError


_BITWISE_OPERATORS = [operator.lshift, operator.rshift, operator.and_, operator.or_, operator.xor,
                      operator.ilshift, operator.irshift, operator.iand, operator.ior, operator.ixor]
_BITWISE_OPERANDS = {"bool": torch.tensor([True, False]), "int8": torch.tensor([1, 2], dtype=torch.int8),
                     "int64": torch.tensor([1, 2]), "float32": torch.tensor([1.0, 2.0])}


@pytest.mark.parametrize("operator_", _BITWISE_OPERATORS, ids=lambda op: op.__name__)
@pytest.mark.parametrize("self_dtype", _BITWISE_OPERANDS)
@pytest.mark.parametrize("other", [3, True, 2.0, *_BITWISE_OPERANDS], ids=str)
def test_bitwise_operators_refuse_and_promote_as_real_execution(operator_, self_dtype, other):
    """``bool << 3`` shifts in int64, as the real kernel does after type promotion, where the meta
    kernels of the shift dunders refused any tensor whose own dtype is not integral; ``x &= 1`` of
    floats has no CPU kernel, which the in-place dunders' twins (``__and__`` of ``__iand__``) say."""
    other = _BITWISE_OPERANDS[other].clone() if isinstance(other, str) else other
    try:
        check_rule(operator_, _BITWISE_OPERANDS[self_dtype].clone(), other)
    except fxprop.PropagationError as refusal:  # check_rule re-raises only when real execution raised alike
        assert not isinstance(refusal, fxprop.InternalError), refusal


@pytest.mark.parametrize("overload", [torch.ops.aten.__lshift__.Scalar_out, torch.ops.aten.__rshift__.Scalar_out])
@pytest.mark.parametrize("self_dtype", _BITWISE_OPERANDS)
def test_shift_dunders_into_out_shift_in_the_promoted_dtype(overload, self_dtype):
    out = torch.empty(2, dtype=torch.int64)
    try:
        check_rule(overload, _BITWISE_OPERANDS[self_dtype].clone(), 3, out=out)
    except fxprop.PropagationError as refusal:
        assert not isinstance(refusal, fxprop.InternalError), refusal


@pytest.mark.parametrize("other", [_BITWISE_OPERANDS["int8"], _BITWISE_OPERANDS["bool"]], ids=["int8", "bool"])
@pytest.mark.parametrize("overload", [torch.ops.aten.__lshift__.Tensor_out, torch.ops.aten.__rshift__.Tensor_out])
def test_shift_dunders_by_a_tensor_into_out(overload, other):
    try:
        check_rule(overload, _BITWISE_OPERANDS["int64"].clone(), other.clone(), out=torch.empty(2, dtype=torch.int64))
    except fxprop.PropagationError as refusal:
        assert not isinstance(refusal, fxprop.InternalError), refusal


@pytest.mark.parametrize("operator_", [operator.lshift, operator.ilshift, operator.rshift, operator.irshift],
                         ids=lambda op: op.__name__)
def test_shifts_of_floats_on_a_cuda_target_have_no_kernel(operator_):
    """CUDA's shift kernels, like the CPU's, are compiled for integral dtypes only, and no host
    kernel can be asked for a cuda target: the rule says so itself."""
    graph = torch.fx.Graph()
    graph.output(graph.call_function(operator_, (graph.placeholder("x"), 3)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(fxprop.PropagationError) as refusal:
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3), device="cuda"))
    assert refusal.value.error_type is NotImplementedError
    out = fxprop.propagate(gm, fxprop.TensorSpec((2, 3), dtype=torch.int32, device="cuda"))
    assert (out.dtype, out.device) == (torch.int32, torch.device("cuda", 0))


_RESHAPE_AND_LINEAR_SPELLINGS = [
    ("call_function", torch.reshape, (-1,), {}), ("call_function", torch.reshape, (2, -1), {}),
    ("call_function", torch.reshape, (), {"shape": -1}), ("call_function", torch.ops.aten.reshape.default, (-1,), {}),
    ("call_function", torch.ops.aten.reshape.default, (), {"shape": [-1]}),
    ("call_method", "reshape", (), {"shape": -1}), ("call_method", "reshape", ((2, 3), 4), {}),
    ("call_method", "reshape", (True, -1), {}), ("call_method", "reshape", (), {"shape": (-1,)}),
    ("call_function", torch.Tensor.reshape, (), {"shape": -1}), ("call_function", torch.Tensor.reshape, (-1, 6), {}),
    ("call_function", F.linear, (), {}), ("call_function", F.linear, (torch.ones(3, 6),), {"bias": torch.ones(3)}),
    ("call_function", torch.ops.aten.linear.default, (torch.ones(3, 6),), {"bias": torch.ones(4)}),
]


@pytest.mark.parametrize("op, target, args, kwargs", _RESHAPE_AND_LINEAR_SPELLINGS,
                         ids=[f"{target}-{args}-{kwargs}" for _, target, args, kwargs in _RESHAPE_AND_LINEAR_SPELLINGS])
@pytest.mark.parametrize("sizes", ["static", "symbolic"])
def test_reshapes_and_linears_spelled_any_way_refuse_as_real_execution(op, target, args, kwargs, sizes):
    """The rules of `fxprop.rules.reshaping` and `linalg.linear` take a call torch takes, and leave a
    call it refuses (an int shape, sizes spread where a sequence is due, bools, missing or wrong
    weights) to torch, whose refusal is the model's error, of real execution's type."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    graph, root = torch.fx.Graph(), torch.nn.Module()
    x = graph.placeholder("x")

    def attribute(value):
        if not isinstance(value, torch.Tensor):
            return value
        name = f"constant{len(root._buffers)}"
        root.register_buffer(name, value)
        return graph.get_attr(name)
    graph.output(graph.create_node(op, target, (x, *map(attribute, args)),
                                   {key: attribute(value) for key, value in kwargs.items()}))
    gm = torch.fx.GraphModule(root, graph)
    example = torch.randn(1, 4, 6)
    try:
        real = tuple(gm(example).shape)
    except (TypeError, RuntimeError) as error:
        real = type(error)
    if sizes == "symbolic":
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC])
        example = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(example, symbolic_context=context)
    try:
        ours = fxprop.propagate(gm, example)
    except fxprop.PropagationError as error:
        assert error.error_type is real
    else:
        assert [size.node.hint if isinstance(size, torch.SymInt) else size for size in ours.shape] == list(real)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint16, torch.float32])
@pytest.mark.parametrize("linear", [F.linear, torch.ops.aten.linear.default])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_asks_the_cpu_kernel_of_its_dtype(dtype, linear, bias):
    """A node's linear runs the fxprop rule, which hands concrete sizes back to torch's composite;
    the CPU's addmm has no bool or uint16 form (NotImplementedError), which is asked as for any
    composite a node calls."""
    shapes = [(2, 3, 4), (5, 4)] + ([(5,)] if bias else [])
    graph = torch.fx.Graph()
    graph.output(graph.call_function(linear, tuple(graph.placeholder(f"x{i}") for i in range(len(shapes)))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    try:
        gm(*(torch.ones(shape, dtype=dtype) for shape in shapes))
        real = None
    except NotImplementedError as refusal:
        real = type(refusal)
    try:
        fxprop.propagate(gm, *(fxprop.TensorSpec(shape, dtype=dtype) for shape in shapes))
    except fxprop.PropagationError as refused:
        assert refused.error_type is real
    else:
        assert real is None
