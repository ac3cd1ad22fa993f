"""Triangular parts and ``arange`` computed directly (`fxprop.kinds.direct_contiguous`) equal real
execution and the meta kernels they stand in for, and so do the calls the kernels refuse."""
from __future__ import annotations

import pytest
import torch

from fxprop.kinds import direct_contiguous
from test_direct import _check, _layouts
from test_direct_reductions import check_exported_shortcuts

aten = torch.ops.aten


@pytest.mark.parametrize("op", [aten.triu.default, aten.tril.default])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("diagonal", [0, 1, -2, 5])
def test_triangular_parts(op, dtype, diagonal):
    for shape in ((3, 4), (2, 1, 3, 3), (0, 3), (4,), ()):
        for input in _layouts(shape, dtype) if dtype is not torch.complex64 else [torch.randn(shape, dtype=dtype)]:
            _check(op, (input, diagonal))


_ARANGES = [(aten.arange.default, (5,), {}), (aten.arange.default, (0,), {}), (aten.arange.default, (-1,), {}),
            (aten.arange.default, (5,), {"dtype": torch.float16}), (aten.arange.default, (300,), {"dtype": torch.int8}),
            (aten.arange.default, (3,), {"dtype": torch.bool}), (aten.arange.default, (5.5,), {}),
            (aten.arange.default, (True,), {}), (aten.arange.start, (2, 7), {}), (aten.arange.start, (7, 7), {}),
            (aten.arange.start, (7, 2), {}), (aten.arange.start, (-3, 4), {"dtype": torch.float64}),
            (aten.arange.start_step, (2, 7, -1), {}), (aten.arange.start_step, (2, 7, 0), {}),
            (aten.arange.start_step, (7, 2, -2), {}), (aten.arange.start_step, (-3, 10, 4), {"dtype": torch.int32}),
            (aten.arange.start_step, (0, 1, 0.25), {}), (aten.arange.start_step, (0, 10, 3), {"dtype": torch.bfloat16}),
            # past int64: the kernels refuse with a RuntimeError, where python's range would answer
            (aten.arange.default, (2**63,), {}), (aten.arange.start, (0, 2**63), {}),
            (aten.arange.start, (0, 2**63), {"dtype": torch.float32}), (aten.arange.start_step, (2**62, 2**63, 2**61), {})]


@pytest.mark.parametrize("op, args, kwargs", _ARANGES, ids=[f"{op}-{args}-{kwargs}" for op, args, kwargs in _ARANGES])
def test_arange(op, args, kwargs):
    _check(op, args, kwargs)


def test_plain_calls_take_the_shortcut():
    assert direct_contiguous.arange_start_step(-3, 10, 4, dtype=torch.int32).shape == (4,)
    assert direct_contiguous.triangular_part(torch.empty(3, 4, device="meta"), 1) is not None


@pytest.mark.parametrize("fn", [lambda x: x.triu(1), lambda x: x.transpose(0, 2).tril(), lambda x: x[:, :1].triu()])
def test_symbolic_sizes(fn, monkeypatch):
    check_exported_shortcuts(fn, (torch.randn(3, 5, 4),), {aten.triu.default} if "triu" in str(fn.__code__.co_names)
                             else {aten.tril.default}, monkeypatch)
