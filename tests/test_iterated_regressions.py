"""Regressions of `fxprop.kinds.iterated` (symbolic elementwise results from stand-ins), each found by an
adversarial round: cases where the shortcut was wrong and the meta kernel right."""
import pytest
import torch

import fxprop
from test_direct_reductions import _Calling

aten = torch.ops.aten


def _hint(size):
    return size.node.hint if isinstance(size, torch.SymInt) else size


@pytest.fixture
def default_dtype():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize("fn", [lambda x: torch.sigmoid(x.transpose(0, 1)), lambda x: x.transpose(0, 1) ** 0.5],
                         ids=["sigmoid of ints", "ints to a float power"])
def test_stand_in_dtypes_follow_the_default_dtype(fn, default_dtype):
    """An integer input's floating result is torch's default dtype: the stand-ins' kept answer must not
    outlive a ``set_default_dtype``."""
    x = torch.randint(1, 5, (3, 4))
    program = torch.export.export(_Calling(fn), (x,), dynamic_shapes=(({0: torch.export.Dim("B", min=2, max=64)},),))
    assert fxprop.propagate(program).dtype == fn(x).dtype == torch.float32
    torch.set_default_dtype(torch.float64)
    assert fxprop.propagate(program).dtype == fn(x).dtype == torch.float64


_h, _f, _g = torch.rand(1, 6).half() + 0.5, torch.rand(6, 4) + 0.5, torch.rand(6, 4) + 0.5
_B = torch.export.Dim("B", min=2, max=64)
_CAST_FIRST = {  # an operand of another dtype than the common one is cast (a dense copy) before TensorIterator lays out
    "where": (lambda c, h, f: torch.where(c, h.expand(4, -1), f.t()), (torch.rand(1, 1) > 0.5, _h, _f), ({}, {1: _B}, {0: _B})),
    "addcmul": (lambda h, f, g: torch.addcmul(h.expand(4, -1), f.t(), g.t()), (_h, _f, _g), ({1: _B}, {0: _B}, {0: _B})),
    "addcdiv": (lambda h, f, g: torch.addcdiv(h.expand(4, -1), f.t(), g.t()), (_h, _f, _g), ({1: _B}, {0: _B}, {0: _B})),
    "clamp.Tensor": (lambda h, f, g: torch.clamp(h.expand(4, -1), f.t(), g.t()), (_h, _f, _g), ({1: _B}, {0: _B}, {0: _B})),
    "pow.Tensor_Tensor": (lambda h, f: torch.pow(h.expand(4, -1), f.t()), (_h, _f), ({1: _B}, {0: _B})),
    "gelu_backward": (lambda h, f: aten.gelu_backward(h.expand(4, -1), f.t()), (_h, _f), ({1: _B}, {0: _B})),
    "sigmoid_backward": (lambda h, f: aten.sigmoid_backward(h.expand(4, -1), f.t()), (_h, _f), ({1: _B}, {0: _B})),
    "threshold_backward": (lambda h, f: aten.threshold_backward(f.t(), h.expand(4, -1), 0.5), (_h, _f), ({1: _B}, {0: _B})),
}


@pytest.mark.parametrize("name", sorted(_CAST_FIRST))
def test_symbolic_layout_of_mixed_dtypes_with_an_expanded_operand(name):
    """A float16 operand expanded beside float32 ones is cast to a dense copy before TensorIterator lays the
    result out (ternary ops, ``where``, binary ops whose operands are not named self and other): the result is
    contiguous, not laid out as the transposed operands."""
    fn, inputs, dims = _CAST_FIRST[name]
    program = torch.export.export(_Calling(fn), inputs, dynamic_shapes=(dims,))
    ours, real = fxprop.propagate(program), fn(*inputs)
    assert ([_hint(s) for s in ours.shape], [_hint(s) for s in ours.stride()], ours.dtype) == \
           (list(real.shape), list(real.stride()), real.dtype)
