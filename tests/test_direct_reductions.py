"""``sum`` and ``mean`` over dims (`fxprop.kinds.direct_reductions`) and ``_to_copy`` computed directly
equal real execution and the meta kernels they stand in for."""
from __future__ import annotations

import pytest
import torch

import fxprop
from fxprop.kinds import direct, meta, shortcuts
from test_direct import _check, _layouts, _without_shortcut

aten = torch.ops.aten


@pytest.mark.parametrize("op", [aten.sum.dim_IntList, aten.mean.dim])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 3), (4,), (), (0, 3)])
@pytest.mark.parametrize("dims", [[1], [-1], [0, -1], [], None, [0, 0], [5], [1, 2]])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype, result_dtype", [(torch.float32, None), (torch.bfloat16, None), (torch.float64, None),
                                                 (torch.float16, torch.float32), (torch.float32, torch.float32),
                                                 (torch.int64, None), (torch.bool, None)])
def test_reductions_over_dims(op, shape, dims, keepdim, dtype, result_dtype):
    kwargs = {} if result_dtype is None else {"dtype": result_dtype}
    for input in _layouts(shape, dtype)[:4]:
        _check(op, (input, dims, keepdim), kwargs)


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("source_dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 3), (4,), (), (0, 3)])
def test_to_copy(dtype, source_dtype, shape):
    kwargs = {} if dtype is None else {"dtype": dtype}
    for input in _layouts(shape, source_dtype):
        _check(aten._to_copy.default, (input,), kwargs)
        _check(aten._to_copy.default, (input,), {**kwargs, "memory_format": torch.contiguous_format})
    _check(aten._to_copy.default, (torch.randn(shape, requires_grad=True),), kwargs)


class _Calling(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def check_exported_shortcuts(fn, inputs: tuple, shortcut_ops: set, monkeypatch) -> None:
    """``fn`` exported with a dynamic batch and sequence (dims 0 and 1 of every input): every op of
    ``shortcut_ops`` takes its shortcut, and each result equals real execution at the sizes' hints
    and, as the ShapeEnv proves it, the meta kernels' result."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    batch, seq = torch.export.Dim("B", min=2, max=64), torch.export.Dim("T", min=2, max=64)
    program = torch.export.export(_Calling(fn), inputs, dynamic_shapes=(tuple({0: batch, 1: seq} for _ in inputs),))
    taken = set()

    def spy(op, args, kwargs):
        found = shortcuts.shortcut_result(op, args, kwargs)
        if found is not None:
            taken.add(op)
        return found
    monkeypatch.setattr(meta, "shortcut_result", spy)
    ours = torch.utils._pytree.tree_leaves(fxprop.propagate(program))
    assert shortcut_ops <= taken, f"no shortcut for {shortcut_ops - taken}"

    def hint(size):
        return size.node.hint if isinstance(size, torch.SymInt) else size

    real = torch.utils._pytree.tree_leaves(fn(*inputs))
    assert [([hint(size) for size in value.shape], [hint(stride) for stride in value.stride()], value.dtype)
            for value in ours] == [(list(value.shape), list(value.stride()), value.dtype) for value in real]
    with _without_shortcut():
        theirs = torch.utils._pytree.tree_leaves(fxprop.propagate(program))
    for our, their in zip(ours, theirs):
        assert our.dtype == their.dtype and all(
            statically_known_true(a == b) if isinstance(a, torch.SymInt) else a == b
            for a, b in zip((*our.shape, *our.stride()), (*their.shape, *their.stride())))


def test_reductions_copies_and_wheres_with_symbolic_sizes_equal_their_meta_kernels_and_real_execution(monkeypatch):
    def reduce_copy_and_choose(x):
        return (x.sum([1]), x.mean([-1], keepdim=True), x.sum([0, 1], keepdim=True), x.to(torch.float16),
                x.transpose(0, 1).to(torch.float64), aten.where.ScalarOther(x > 0, x, -1e9),
                aten.where.ScalarSelf(x[:, :1] > 0, 0.5, x))

    check_exported_shortcuts(reduce_copy_and_choose, (torch.randn(3, 5, 8),),
                             {aten.sum.dim_IntList, aten.mean.dim, aten._to_copy.default, aten.where.ScalarOther,
                              aten.where.ScalarSelf}, monkeypatch)


@pytest.mark.parametrize("op", [aten.where.ScalarOther, aten.where.ScalarSelf])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 1, 3), (4, 3)), ((1, 5), (5, 1)), ((2, 3), (4,)),
                                    ((2, 1, 3, 3), (2, 1, 3, 3)), ((), (2, 3))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("number", [0.5, -3, float("-inf"), True])
def test_where_with_a_number(op, shapes, dtype, number):
    """Composite: ``where.self`` over a wrapped number, laid out by TensorIterator over the three."""
    for condition, tensor in zip(_layouts(shapes[0], torch.bool), _layouts(shapes[1], dtype)[::-1]):
        arguments = (condition, tensor, number) if op is aten.where.ScalarOther else (condition, number, tensor)
        _check(op, arguments)
    _check(op, (torch.ones(shapes[0], dtype=torch.uint8), *((torch.randn(shapes[1]), 1.0) if op is aten.where.ScalarOther
                                                             else (1.0, torch.randn(shapes[1])))))
