"""The backward results computed directly (`fxprop.kinds.direct_backward`) equal real execution and
the meta kernels they stand in for, on many layouts, dtypes, dims and output masks."""
from __future__ import annotations

import itertools
import sys

import pytest
import torch

import fxprop
from fxprop.kinds import direct_backward
from fxprop.testing import check_rule
from test_direct import _check, _layouts
from test_direct_reductions import check_exported_shortcuts

aten = torch.ops.aten

_DTYPES = [(torch.float32, torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16, torch.bfloat16),
           (torch.float16, torch.float16, torch.float16), (torch.float64, torch.float64, torch.float64),
           (torch.float32, torch.float32, torch.float16), (torch.float64, torch.float32, torch.float64),
           (torch.int64, torch.int64, torch.int64)]


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 1, 3, 3), (5,), (), (0, 3)])
@pytest.mark.parametrize("dtypes", _DTYPES, ids=str)
@pytest.mark.parametrize("dim", [-1, 0, 1, 3])
@pytest.mark.parametrize("op", [aten._softmax_backward_data.default, aten._log_softmax_backward_data.default])
def test_softmax_backward_data(op, shape, dtypes, dim):
    grad_dtype, output_dtype, input_dtype = dtypes
    for grad, output in itertools.product(_layouts(shape, grad_dtype)[:3], _layouts(shape, output_dtype)[:2]):
        if op is aten._log_softmax_backward_data.default and grad.shape != output.shape:
            continue  # its CPU kernel reads the output at the grad's sizes, whatever they are
        _check(op, (grad, output, dim, input_dtype))


def test_softmax_backward_data_of_different_sizes_is_left_to_the_kernel():
    _check(aten._softmax_backward_data.default, (torch.randn(2, 3), torch.randn(3, 3), 1, torch.float32))
    _check(aten._softmax_backward_data.default, (torch.randn(2, 3), torch.randn(1, 3), 1, torch.float32))


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32, torch.float16), (torch.float32, torch.float64, torch.float32)])
def test_log_softmax_backward_refuses_dtypes_only_over_an_output_of_elements(dtypes):
    """The CPU kernel returns early for an empty output, not for an empty grad (whose sizes the meta
    kernel broadcasts against the output's)."""
    grad_dtype, output_dtype, input_dtype = dtypes
    with pytest.raises(fxprop.PropagationError) as refused:
        check_rule(aten._log_softmax_backward_data.default, torch.randn(0, 3, dtype=grad_dtype),
                   torch.randn(1, 3, dtype=output_dtype), 1, input_dtype)
    assert refused.value.error_type is RuntimeError


def _layer_norm_arguments(shape, normalized, dtype, affine):
    input = torch.randn(shape, dtype=dtype)
    weight = torch.randn(normalized, dtype=dtype) if affine else None
    bias = torch.randn(normalized, dtype=dtype) if affine else None
    _, mean, rstd = aten.native_layer_norm(input, normalized, weight, bias, 1e-5)
    return input, weight, bias, mean, rstd


@pytest.mark.parametrize("shape, normalized", [((2, 5, 8), [8]), ((2, 5, 8), [5, 8]), ((4, 8), [8]), ((0, 8), [8]),
                                               ((3, 1, 4), [1, 4])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mask", [[True, True, True], [True, False, True], [False, True, False], [False, False, False]])
def test_native_layer_norm_backward(shape, normalized, dtype, mask):
    input, weight, bias, mean, rstd = _layer_norm_arguments(shape, normalized, dtype, affine=True)
    layouts = [tensor for tensor in _layouts(shape, dtype) if tensor.shape == shape]
    for grad, layout_of_input in itertools.product(layouts, layouts[:3]):
        _check(aten.native_layer_norm_backward.default,
               (grad, layout_of_input, normalized, mean, rstd, weight, bias, mask))
    without_parameters = [mask[0], False, False]
    _check(aten.native_layer_norm_backward.default,
           (torch.randn(shape, dtype=dtype), input, normalized, mean, rstd, None, None, without_parameters))


@pytest.mark.parametrize("case", ["statistics of another shape", "mixed dtypes", "grad of another shape",
                                  "a strided input", "no weight for its grad"])
def test_native_layer_norm_backward_off_the_plain_case_is_left_to_the_kernel(case):
    input, weight, bias, mean, rstd = (tensor if tensor is None else tensor.to("meta") for tensor in
                                       _layer_norm_arguments((2, 5, 8), [8], torch.float32, affine=True))
    grad = torch.empty(2, 5, 8, device="meta")
    if case == "statistics of another shape":
        mean, rstd = mean.reshape(10, 1), rstd.reshape(10, 1)
    elif case == "mixed dtypes":
        weight = weight.double()
    elif case == "grad of another shape":
        grad = torch.empty(1, 5, 8, device="meta")
    elif case == "a strided input":
        input = torch.empty(5, 2, 8, device="meta").transpose(0, 1)
    else:
        weight = None
    assert direct_backward.native_layer_norm_backward(grad, input, [8], mean, rstd, weight, bias,
                                                      [True, True, True]) is None


_SLICES = [(0, 0, 1, 1), (1, 1, sys.maxsize, 1), (-1, -2, sys.maxsize, 1), (0, 0, 2, 2), (1, 5, 0, 1),
           (0, -9, 100, 3), (2, 0, 1, 1), (0, 1, -1, 1), (5, 0, 1, 1), (0, 0, 1, 0)]


@pytest.mark.parametrize("shape", [(2, 3, 4), (3,), (2, 0, 3)])
@pytest.mark.parametrize("dim, start, end, step", _SLICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_slice_backward(shape, dim, start, end, step, dtype):
    source = torch.zeros(shape, dtype=dtype)
    try:
        sliced = aten.slice.Tensor(source, dim, start, end, step)
    except (IndexError, RuntimeError):
        sliced = source  # a slice real execution refuses: its backward is asked of the grad of the whole
    for grad in _layouts(tuple(sliced.shape), dtype)[:3]:
        _check(aten.slice_backward.default, (grad, list(shape), dim, start, end, step))
    for sizes in [(1,), (*sliced.shape[:-1], 1), (2, *sliced.shape), (3,), (*sliced.shape[:-1], 7)]:
        _check(aten.slice_backward.default, (torch.zeros(sizes, dtype=dtype), list(shape), dim, start, end, step))


def test_backward_results_with_symbolic_sizes_equal_their_meta_kernels_and_real_execution(monkeypatch):
    weight, bias = torch.randn(8), torch.randn(8)

    def backward(grad, x):
        _, mean, rstd = aten.native_layer_norm(x, [8], weight, bias, 1e-5)
        normalized = aten.native_layer_norm_backward(grad, x, [8], mean, rstd, weight, bias, [True, True, True])
        probabilities = aten._softmax(x, -1, False)
        return normalized, aten._softmax_backward_data(grad, probabilities, -1, torch.float32), \
            aten._log_softmax_backward_data(grad.transpose(0, 1), probabilities.transpose(0, 1), 0, torch.float32), \
            aten.slice_backward(grad[..., 2:6], list(x.shape), -1, 2, 6, 1), \
            aten.slice_backward(grad.transpose(0, 1), list(x.transpose(0, 1).shape), 1, 0, sys.maxsize, 1), \
            aten.slice_backward(grad[..., ::2], list(x.shape), 2, 0, sys.maxsize, 2)

    check_exported_shortcuts(backward, (torch.randn(3, 5, 8), torch.randn(3, 5, 8)),
                             {aten.native_layer_norm_backward.default, aten._softmax_backward_data.default,
                              aten._log_softmax_backward_data.default, aten.slice_backward.default,
                              aten.slice.Tensor}, monkeypatch)
