"""Elementwise ops with python numbers computed directly (`fxprop.kinds.direct_pointwise`) equal real
execution and the meta kernels they stand in for: every layout, dtype and bound, in place too, and
with symbolic sizes."""
from __future__ import annotations

import pytest
import torch

from fxprop.kinds import direct_pointwise
from test_direct import _check, _layouts
from test_direct_reductions import check_exported_shortcuts

aten = torch.ops.aten

_CALLS = [(aten.clamp.default, (0.5, None)), (aten.clamp.default, (None, 2)), (aten.clamp.default, (1, 3)),
          (aten.clamp.default, (2, 1)), (aten.clamp.default, (None, None)), (aten.clamp.default, (True, None)),
          (aten.clamp_min.default, (0.5,)), (aten.clamp_min.default, (2,)), (aten.clamp_max.default, (-1,)),
          (aten.clamp_max.default, (2.5,)), (aten.hardtanh.default, ()), (aten.hardtanh.default, (0, 6)),
          (aten.hardtanh.default, (2, 1)), (aten.hardtanh.default, (0.5, 2.5)), (aten.pow.Tensor_Scalar, (2,)),
          (aten.pow.Tensor_Scalar, (0.5,)), (aten.pow.Tensor_Scalar, (-1,)), (aten.pow.Tensor_Scalar, (3,)),
          (aten.pow.Tensor_Scalar, (True,)), (aten.relu6.default, ())]
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("op, numbers", _CALLS, ids=[f"{op}-{numbers}" for op, numbers in _CALLS])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_ops_of_a_tensor_and_numbers(op, numbers, dtype):
    for shape in ((2, 1, 3, 3), (), (0, 3)):
        for input in _layouts(shape, dtype):
            _check(op, (input, *numbers))


_IN_PLACE = sorted(set(direct_pointwise.DIRECT_POINTWISE) - set(direct_pointwise._FUNCTIONAL), key=str)


@pytest.mark.parametrize("op", _IN_PLACE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("numbers", [(0, 1), (0.5, 2.5)])
def test_in_place_forms(op, dtype, numbers):
    """``self`` comes back where the result fits it; real execution decides every refusal."""
    arity = len([a for a in op._schema.arguments if not a.kwarg_only]) - 1
    for input in _layouts((2, 1, 3, 3), dtype):
        _check(op, (input.clone(), *numbers[:arity]))


def test_plain_calls_take_the_shortcut():
    x = torch.empty(2, 3, device="meta")
    for op, numbers in [(aten.clamp.default, (0, 1)), (aten.clamp_min.default, (0.5,)), (aten.hardtanh_.default, (0, 6)),
                        (aten.pow.Tensor_Scalar, (2,)), (aten.clamp_.default, (None, 3))]:
        assert direct_pointwise.DIRECT_POINTWISE[op](x, *numbers) is not None


_SYMBOLIC = [(lambda x: x.clamp(0, 1), aten.clamp.default), (lambda x: x.transpose(0, 1).clamp(min=0.5), aten.clamp.default),
             (lambda x: torch.nn.functional.relu6(x), aten.relu6.default),
             (lambda x: x.transpose(0, 1).pow(2), aten.pow.Tensor_Scalar),
             (lambda x: x.clone().clamp_(max=2), aten.clamp_.default),
             (lambda x: torch.nn.functional.hardtanh(x[:, :1], 0, 2), aten.hardtanh.default),
             (lambda x: x.transpose(0, 2).clamp_min(0.5), aten.clamp_min.default)]


@pytest.mark.parametrize("fn, op", _SYMBOLIC)
def test_symbolic_sizes(fn, op, monkeypatch):
    check_exported_shortcuts(fn, (torch.randn(3, 5, 4),), {op}, monkeypatch)
