"""Batch norm's results computed directly (`fxprop.kinds.direct_normalization`) equal real execution
and the meta kernels they stand in for, in training and in inference, over many layouts and dtypes."""
from __future__ import annotations

import pytest
import torch

import fxprop
from fxprop.kinds import direct_normalization
from fxprop.testing import check_rule
from test_direct import _check, _same_without_shortcut

aten = torch.ops.aten

_INPUTS = [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
           torch.randn(2, 3, 5, 4).transpose(2, 3), torch.randn(4, 3), torch.randn(2, 3, 4),
           torch.randn(2, 3, 1, 5)[:, :, ::1, ::2], torch.randn(1, 3, 1, 1), torch.randn(2, 1, 4, 4),
           torch.randn(2, 3, 1, 4).contiguous(memory_format=torch.channels_last), torch.randn(2, 3, 2, 3, 4),
           torch.randn(2, 3, 2, 3, 4).contiguous(memory_format=torch.channels_last_3d), torch.randn(0, 3, 4, 4),
           torch.randn(2, 3, 0, 4)]
_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _parameters(channels: int, dtype: torch.dtype, affine: bool, running: bool) -> tuple:
    weight, bias = (torch.randn(channels, dtype=dtype) if affine else None for _ in range(2))
    statistics = (torch.randn(channels, dtype=dtype), torch.rand(channels, dtype=dtype)) if running else (None, None)
    return weight, bias, *statistics


@pytest.mark.parametrize("input", _INPUTS)
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_in_inference(input, dtype, affine):
    parameters = _parameters(input.shape[1], dtype, affine, running=True)
    _check(aten._native_batch_norm_legit_no_training.default, (input.to(dtype), *parameters, 0.1, 1e-5))
    _check(aten.native_batch_norm.default, (input.to(dtype), *parameters, False, 0.1, 1e-5))
    _check(aten._native_batch_norm_legit.default, (input.to(dtype), *parameters, False, 0.1, 1e-5))


def _check_training(op, args):
    """As `_check`; where the input has one value per channel, torch's decomposition divides by zero
    updating the running variance (``n / (n - 1)``) where the CPU kernel does not: there only real
    execution decides."""
    if args[0].numel() != args[0].shape[1] or op is aten._native_batch_norm_legit.no_stats:
        return _check(op, args)
    try:
        got = check_rule(op, *args)
    except fxprop.PropagationError:
        return
    try:
        _same_without_shortcut(op, args, {}, got)
    except AssertionError as error:
        assert "ZeroDivisionError" in str(error)


@pytest.mark.parametrize("input", _INPUTS)
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("running", [True, False])
def test_batch_norm_in_training(input, dtype, affine, running):
    parameters = _parameters(input.shape[1], dtype, affine, running)
    _check_training(aten.native_batch_norm.default, (input.to(dtype), *parameters, True, 0.1, 1e-5))
    _check_training(aten._native_batch_norm_legit.default,
                    (input.to(dtype), *_parameters(input.shape[1], dtype, affine, running), True, 0.1, 1e-5))
    if running:
        _check_training(aten._native_batch_norm_legit_functional.default, (input.to(dtype), *parameters, True, 0.1, 1e-5))
    else:
        _check_training(aten._native_batch_norm_legit.no_stats, (input.to(dtype), *parameters[:2], True, 0.1, 1e-5))


@pytest.mark.parametrize("call", [
    lambda x, c: (aten.native_batch_norm.default, (x, *c, True, 0.1, 1e-5)),
    lambda x, c: (aten._native_batch_norm_legit.default, (x, *c, True, 0.1, 1e-5)),
    lambda x, c: (aten._native_batch_norm_legit_functional.default, (x, *c, True, 0.1, 1e-5)),
    lambda x, c: (aten._native_batch_norm_legit.no_stats, (x, *c[:2], True, 0.1, 1e-5)),
    lambda x, c: (aten._native_batch_norm_legit_no_training.default, (x, *c, 0.1, 1e-5)),
])
def test_a_plain_call_takes_the_shortcut(call):
    op, args = call(torch.empty(2, 3, 4, 4, device="meta"), [torch.empty(3, device="meta") for _ in range(4)])
    assert direct_normalization.DIRECT_NORMALIZATION[op](*args) is not None


@pytest.mark.parametrize("mismatched", [torch.randn(4), torch.randn(3, dtype=torch.float64), torch.randn(1, 3)])
def test_parameters_that_do_not_fit_are_left_to_the_kernel(mismatched):
    input = torch.randn(2, 3, 4, 4)
    for position in range(4):
        parameters = list(_parameters(3, torch.float32, True, True))
        parameters[position] = mismatched
        assert direct_normalization.native_batch_norm(input.to("meta"), *(p.to("meta") for p in parameters), True,
                                                      0.1, 1e-5) is None
        if mismatched.dtype != torch.float32:  # (the CPU reads as many values as it needs from one of another size)
            _check(aten.native_batch_norm.default, (input, *parameters, True, 0.1, 1e-5))


def test_a_size_one_dim_with_an_odd_stride_keeps_its_meta_kernel_on_other_devices():
    input = torch.empty_strided((2, 3, 1, 4), (12, 4, 7, 1), device="meta")
    channels = [torch.empty(3, device="meta") for _ in range(4)]
    assert direct_normalization.batch_norm_in_inference(input, *channels, 0.1, 1e-5) is None
    assert direct_normalization.batch_norm_in_training(input, *channels, 0.1, 1e-5) is None


@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("training", [True, False])
def test_functional_batch_norm_of_mixed_dtypes_follows_the_cpu_kernel(input_dtype, training):
    input = torch.randn(2, 3, 4, 4, dtype=input_dtype)
    weight, running = torch.randn(3), (torch.zeros(3), torch.ones(3))
    _check_training(aten._native_batch_norm_legit_functional.default, (input, weight, weight, *running, training, 0.1, 1e-5))
