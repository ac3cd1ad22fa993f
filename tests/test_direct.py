"""Results computed directly (`fxprop.kinds.direct`) equal real execution and the meta kernels they stand in for.

Every op in the table is called on operands of many layouts and dtypes: broadcasting, transposed,
channels-last, expanded, offset and size-1 dims with odd strides, empty, 0-dim, python numbers.
Real CPU execution decides shape, dtype, strides and the refusal type (`check_rule`); the same
call with the shortcut switched off must give the very same result.
"""
from __future__ import annotations

import contextlib
import itertools
import sys

import pytest
import torch

import fxprop
from fxprop.kinds import direct, meta, shortcuts
from fxprop.testing import call_graph, check_rule

aten = torch.ops.aten


def _layouts(shape: tuple, dtype: torch.dtype) -> list[torch.Tensor]:
    def values(size):
        if dtype is torch.bool:
            return torch.rand(size) > 0.5
        if not dtype.is_floating_point:
            return torch.randint(1, 5, size, dtype=dtype)
        return torch.rand(size, dtype=torch.float64).add(0.5).to(dtype)

    base = values(shape)
    found = [base]
    if len(shape) >= 2:
        found.append(values(shape[::-1]).transpose(0, -1) if len(shape) == 2 else values(shape).transpose(0, 1))
        found.append(values((*shape[:-1], shape[-1] * 2))[..., ::2])
        found.append(values(shape[:-1] + (1,)).expand(shape))
    if len(shape) == 4:
        found.append(base.contiguous(memory_format=torch.channels_last))
    if 1 in shape:
        odd = torch.empty_strided(shape, [7 if size == 1 else stride for size, stride in zip(shape, base.stride())],
                                  dtype=dtype).copy_(base) if 0 not in shape else base
        found.append(odd)
    found.append(values((base.numel() + 3,))[3:].view(shape) if base.numel() else base)
    return found


_SHAPE_PAIRS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 3)), ((2, 1, 3, 3), (2, 1, 3, 3)),
                ((), (2, 3)), ((2, 0, 3), (3,)), ((1, 5), (5, 1)), ((2, 3), (4,))]
_DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                (torch.int64, torch.int64), (torch.int32, torch.float64), (torch.bool, torch.bool),
                (torch.int64, torch.bool)]


def _binary_cases():
    for op, (shapes, dtypes) in itertools.product(sorted(direct._BINARY, key=str),
                                                  itertools.product(_SHAPE_PAIRS, _DTYPE_PAIRS)):
        yield pytest.param(op, shapes, dtypes, id=f"{op}-{shapes}-{dtypes}")


@contextlib.contextmanager
def _without_shortcut():
    """The meta kernels alone, as before `fxprop.kinds.direct`."""
    tables = [(table, dict(table)) for table in (direct.DIRECT, shortcuts.SHORTCUTS)]
    for table, _ in tables:
        table.clear()
    try:
        yield
    finally:
        for table, entries in tables:
            table.update(entries)


def _same_without_shortcut(op, args, kwargs, got):
    with _without_shortcut():
        gm, tensors = call_graph(op, args, kwargs)
        try:
            slow = fxprop.propagate(gm, *tensors, cache=False)
        except fxprop.PropagationError as error:
            raise AssertionError(f"the meta kernel refuses what the shortcut answered: {error}") from None
    for fast_value, slow_value in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(slow)):
        if fast_value is None or slow_value is None:  # an output a mask leaves out
            assert fast_value is slow_value
            continue
        assert (fast_value.shape, fast_value.stride(), fast_value.dtype, fast_value.requires_grad) == \
               (slow_value.shape, slow_value.stride(), slow_value.dtype, slow_value.requires_grad)


def _check(op, args, kwargs=None):
    kwargs = kwargs or {}
    try:
        got = check_rule(op, *args, **kwargs)
    except fxprop.PropagationError:
        return  # refused as real execution refuses it (check_rule compares the error types)
    _same_without_shortcut(op, args, kwargs, got)


@pytest.mark.parametrize("op, shapes, dtypes", list(_binary_cases()))
def test_binary_ops_of_two_tensors(op, shapes, dtypes):
    for first, second in itertools.product(_layouts(shapes[0], dtypes[0])[:3], _layouts(shapes[1], dtypes[1])[::2]):
        _check(op, (first, second))


@pytest.mark.parametrize("op", sorted({*direct._BINARY, *direct._SCALAR_FORMS}, key=str))
@pytest.mark.parametrize("number", [2, 0.5, -3, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_binary_ops_of_a_tensor_and_a_number(op, number, dtype):
    for tensor in _layouts((2, 1, 3, 3), dtype):
        _check(op, (tensor, number))


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((2, 1, 3), (4, 3), (3,)), ((1, 5), (5, 1), (1,)),
                                    ((2, 3), (4,), (2, 3))])
@pytest.mark.parametrize("dtypes", [(torch.bool, torch.float32, torch.float32), (torch.bool, torch.int64, torch.int64),
                                    (torch.bool, torch.float16, torch.float32), (torch.uint8, torch.float32, torch.float32)])
def test_where_of_three_tensors(shapes, dtypes):
    for condition, input, other in zip(_layouts(shapes[0], dtypes[0]), _layouts(shapes[1], dtypes[1])[::-1],
                                       _layouts(shapes[2], dtypes[2])):
        _check(aten.where.self, (condition, input, other))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 4, 1), (3, 5), (), (0, 3)])
@pytest.mark.parametrize("dtype, result_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                 (torch.float32, torch.float64), (torch.float16, torch.float32),
                                                 (torch.int64, None), (torch.float64, torch.float16)])
def test_safe_softmax_is_contiguous_whatever_the_layout(shape, dtype, result_dtype):
    for tensor in _layouts(shape, dtype):
        for dim in (-1, 0, max(len(shape) - 2, 0), 7):
            _check(aten._safe_softmax.default, (tensor, dim, result_dtype))


@pytest.mark.parametrize("op", sorted(direct._UNARY_FLOAT | {aten.gelu.default}, key=str))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(2, 3), (2, 1, 3, 3), (), (0, 3), (4, 1)])
def test_unary_ops(op, dtype, shape):
    for tensor in _layouts(shape, dtype):
        _check(op, (tensor,))


@pytest.mark.parametrize("approximate", ["none", "tanh", "exact"])
def test_gelu_approximations(approximate):
    _check(aten.gelu.default, (torch.randn(2, 3),), {"approximate": approximate})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((3, 4), (5, 4)), ((0, 4), (4, 2)), ((3, 0), (0, 2)),
                                    ((3, 4, 1), (4, 5))])
def test_mm(dtype, shapes):
    first, second = (torch.randn(shape).to(dtype) for shape in shapes)
    def column_major(t):
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    for left, right in ((first, second), (first, column_major(second)), (column_major(first), second)):
        _check(aten.mm.default, (left, right))
    _check(aten.mm.default, (first, second.to(torch.float16)))


@pytest.mark.parametrize("self_shape", [(5,), (3, 5), (1, 5), (3, 1), (), (4,), (2, 3, 5)])
@pytest.mark.parametrize("scales", [{}, {"beta": 0, "alpha": 2}, {"beta": 0.5}])
def test_addmm(self_shape, scales):
    _check(aten.addmm.default, (torch.randn(self_shape), torch.randn(3, 4), torch.randn(4, 5)), scales)
    _check(aten.addmm.default, (torch.randn(self_shape), torch.randn(4, 3).t(), torch.randn(5, 4).t()), scales)
    _check(aten.addmm.default, (torch.randn(self_shape, dtype=torch.float64), torch.randn(3, 4), torch.randn(4, 5)))


@pytest.mark.parametrize("dtype, parameter_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                                    (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                    (torch.float32, torch.float64)])
@pytest.mark.parametrize("shape, normalized", [((2, 5, 8), [8]), ((2, 5, 8), [5, 8]), ((4, 8), [8]), ((0, 8), [8]),
                                               ((2, 5, 8), [4]), ((8,), [8]), ((2, 5, 8), [2, 5, 8])])
@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm(dtype, parameter_dtype, shape, normalized, affine):
    weight, bias = (torch.randn(normalized, dtype=parameter_dtype) if affine else None for _ in range(2))
    for input in _layouts(shape, dtype)[:4]:
        _check(aten.native_layer_norm.default, (input, normalized, weight, bias, 1e-5))
    _check(aten.native_layer_norm.default, (torch.randn(shape, dtype=dtype), normalized,
                                           torch.randn(3, dtype=parameter_dtype), None, 1e-5))


def test_symbolic_sizes_that_may_be_one_keep_the_meta_kernel_where_the_layout_depends_on_them():
    """A TensorSpec's symbol may be 1, where TensorIterator would skip a dim: the meta kernel lays the result out."""
    gm = torch.fx.symbolic_trace(lambda x, y, z: (x + y, x.transpose(0, 1) + z, torch.relu(x) * 2))
    same, transposed, scaled = fxprop.propagate(gm, fxprop.TensorSpec(("B", 8)), fxprop.TensorSpec(("B", 8)),
                                                fxprop.TensorSpec((8, "B")))
    assert tuple(map(str, same.stride())) == ("8", "1")
    assert tuple(map(str, scaled.stride())) == ("8", "1")
    assert tuple(map(str, transposed.stride())) == ("1", "8")


_ITERATED = {  # elementwise ops over views of two (B, T, 8, 4) inputs
    "transposed pair": lambda x, y: x.transpose(1, 2) + y.transpose(1, 2),
    "transposed and permuted": lambda x, y: x.transpose(1, 2) * y.permute(0, 2, 1, 3),
    "permuted and a number": lambda x, y: x.permute(0, 2, 3, 1) + 1.5,
    "unary of a transposed": lambda x, y: torch.relu(x.transpose(0, 1)),
    "broadcast of a size-1 dim": lambda x, y: x[:, :1] + y,
    "transposed and a broadcast slice": lambda x, y: x.transpose(1, 2)[..., :1] * y.transpose(1, 2),
    "integers and an int": lambda x, y: x.long().transpose(1, 2) + 3,
    "comparison of transposes": lambda x, y: x.transpose(2, 3) == y.transpose(2, 3),
    "transposed and a reduced transpose": lambda x, y: x.transpose(1, 2) - y.sum(1, keepdim=True).transpose(1, 2),
    "channels-last and contiguous": lambda x, y: x.contiguous(memory_format=torch.channels_last) + y,
    "sliced pair": lambda x, y: x[..., ::2] * y[..., 1::2],
    "a size-1 dim of a large stride, broadcast": lambda x, y: (x[:1, :, 0].contiguous().permute(1, 0, 2)
                                                               + y[:, :, :1].contiguous()),
    "where over transposes": lambda x, y: torch.where(x.transpose(1, 2) > 0, x.transpose(1, 2), y.transpose(1, 2)),
    "a transpose times a number": lambda x, y: torch.ops.aten.mul.Scalar(x.transpose(0, 1), 0.5),
    "safe softmax of a transpose": lambda x, y: torch.ops.aten._safe_softmax(x.transpose(1, 3), -1),
    "dropout in training of a transpose": lambda x, y: torch.nn.functional.dropout(x.transpose(1, 2), 0.25, True),
}


class _Iterated(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


@pytest.mark.parametrize("sizes", [(2, 3), (5, 2)])
@pytest.mark.parametrize("name", sorted(_ITERATED))
def test_symbolic_elementwise_results_lay_out_as_real_execution_where_the_ranges_decide(name, sizes, monkeypatch):
    """Sizes of at least 2 (export's Dims here, dynamo's dynamic sizes) decide TensorIterator's
    comparisons: the shortcut lays the result out for every value of the symbols, as the CPU does
    at the traced sizes, and as the meta kernels do where ShapeEnv can tell."""
    from fxprop.torch_compat import has_symbolic_sizes
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    fn = _ITERATED[name]
    x, y = torch.randn(*sizes, 8, 4), torch.randn(*sizes, 8, 4)
    batch, seq = torch.export.Dim("B", min=2, max=64), torch.export.Dim("T", min=2, max=64)
    program = torch.export.export(_Iterated(fn), (x, y), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    from fxprop.kinds import meta
    direct_results = []

    def spy(op, args, kwargs):
        direct_results.append(shortcuts.shortcut_result(op, args, kwargs))
        return direct_results[-1]
    monkeypatch.setattr(meta, "shortcut_result", spy)
    ours = fxprop.propagate(program)
    assert any(isinstance(found, torch.Tensor) and has_symbolic_sizes(found) and not found._is_view()
               for found in torch.utils._pytree.tree_leaves(direct_results)), "the shortcut was not taken"

    def hint(size):
        return size.node.hint if isinstance(size, torch.SymInt) else size

    real = fn(x, y)
    assert ([hint(size) for size in ours.shape], [hint(stride) for stride in ours.stride()], ours.dtype) == \
           (list(real.shape), list(real.stride()), real.dtype)
    with _without_shortcut():
        theirs = fxprop.propagate(program)
    assert all(statically_known_true(a == b) if isinstance(a, torch.SymInt) else a == b
               for a, b in zip((*ours.shape, *ours.stride()), (*theirs.shape, *theirs.stride())))
    assert str(ours.untyped_storage().nbytes()) == str(theirs.untyped_storage().nbytes())


_ITERATED_ON_STAND_INS = {  # elementwise ops without a rule of their own, over views of two (B, T, 8, 4) inputs
    "gelu_backward": lambda x, y: aten.gelu_backward(x.transpose(1, 2), y.transpose(1, 2)),
    "gelu_backward, tanh": lambda x, y: aten.gelu_backward(x.transpose(1, 2), y.transpose(1, 2), approximate="tanh"),
    "threshold_backward (self first)": lambda x, y: aten.threshold_backward(x.transpose(1, 2), y.permute(0, 2, 1, 3), 0.0),
    "native_dropout_backward of a bool mask": lambda x, y: aten.native_dropout_backward(x.transpose(1, 2),
                                                                                       y.transpose(1, 2) > 0, 2.0),
    "pow of a tensor": lambda x, y: x.transpose(1, 2) ** y.transpose(1, 2),
    "pow of integers to a float": lambda x, y: x.long().transpose(1, 2) ** 0.5,
    "minimum": lambda x, y: torch.minimum(x.transpose(1, 2), y.transpose(1, 2)),
    "clamp to a tensor": lambda x, y: torch.clamp(x.permute(0, 2, 3, 1), y.permute(0, 2, 3, 1)),
    "sigmoid_backward": lambda x, y: aten.sigmoid_backward(x.transpose(0, 1), y.transpose(0, 1)),
    "silu_backward of a broadcast": lambda x, y: aten.silu_backward(x[:, :1], y),
    "isnan": lambda x, y: torch.isnan(x.transpose(1, 2)),
    "lerp": lambda x, y: torch.lerp(x.transpose(1, 2), y.transpose(1, 2), 0.3),
    "addcmul of three": lambda x, y: torch.addcmul(x.transpose(1, 2), y.transpose(1, 2), x[:, :1].transpose(1, 2)),
    "atan2": lambda x, y: torch.atan2(x.transpose(1, 2), y.transpose(1, 2)),
    "hypot of float16": lambda x, y: torch.hypot(x.half().permute(0, 2, 3, 1), y.half().permute(0, 2, 3, 1)),
}


@pytest.mark.parametrize("sizes", [(2, 3), (5, 2)])
@pytest.mark.parametrize("name", sorted(_ITERATED_ON_STAND_INS))
def test_elementwise_results_of_symbolic_sizes_from_stand_ins_equal_real_execution_and_the_meta_kernels(
        name, sizes, monkeypatch):
    """`fxprop.kinds.iterated`: the dtype from the kernel on one-element stand-ins, the layout
    TensorIterator's, for every elementwise op: as the CPU lays the result out at the traced sizes,
    and, where the meta kernel lays it out as the CPU does (``native_dropout_backward``'s does not),
    as the meta kernel does for every value of the symbols."""
    from fxprop.kinds import iterated, meta
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    fn = _ITERATED_ON_STAND_INS[name]
    x, y = torch.randn(*sizes, 8, 4), torch.randn(*sizes, 8, 4)
    batch, seq = torch.export.Dim("B", min=2, max=64), torch.export.Dim("T", min=2, max=64)
    program = torch.export.export(_Iterated(fn), (x, y), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    taken = []

    def spy(op, args, kwargs):
        taken.append(iterated.iterated_result(op, args, kwargs))
        return taken[-1]
    monkeypatch.setattr(meta, "iterated_result", spy)
    iterated._results_on_stand_ins.clear()
    ours = torch.utils._pytree.tree_leaves(fxprop.propagate(program))
    assert any(found is not None for found in taken), "the stand-ins were not asked"

    def hint(size):
        return size.node.hint if isinstance(size, torch.SymInt) else size

    real = torch.utils._pytree.tree_leaves(fn(x, y))
    assert [([hint(size) for size in t.shape], [hint(stride) for stride in t.stride()], t.dtype) for t in ours] == \
           [(list(t.shape), list(t.stride()), t.dtype) for t in real]
    monkeypatch.setattr(meta, "iterated_result", lambda op, args, kwargs: None)
    theirs = torch.utils._pytree.tree_leaves(fxprop.propagate(program))
    for a, b, c in zip(ours, theirs, real):
        assert a.dtype == b.dtype and not a._is_view()
        assert [hint(stride) for stride in b.stride()] != list(c.stride()) or all(statically_known_true(p == q) if isinstance(p, torch.SymInt) else p == q
                   for p, q in zip((*a.shape, *a.stride()), (*b.shape, *b.stride())))


def test_elementwise_stand_ins_refused_leave_the_refusal_to_the_kernel():
    """Integers to a negative power: the stand-ins are refused, so the meta kernel runs on the call and
    fxprop refuses it as real execution does; a symbolic number argument is never put to the stand-ins."""
    x = torch.randint(0, 5, (3, 4))
    program = torch.export.export(_Iterated(lambda x, y: x.transpose(0, 1) ** -1), (x, x),
                                  dynamic_shapes=({0: torch.export.Dim("B", min=2)}, {0: torch.export.Dim("B", min=2)}))
    with pytest.raises(RuntimeError):
        x.transpose(0, 1) ** -1
    with pytest.raises(fxprop.PropagationError) as refused:
        fxprop.propagate(program)
    assert refused.value.error_type is RuntimeError
    from fxprop.kinds import iterated
    symbolic_number = torch.export.export(_Iterated(lambda x, y: aten.mul.Scalar(x.transpose(0, 1), x.shape[0])),
                                          (x.float(), x.float()), dynamic_shapes=({0: torch.export.Dim("B", min=2)},
                                                                                  {0: torch.export.Dim("B", min=2)}))
    before = dict(iterated._results_on_stand_ins)
    out = fxprop.propagate(symbolic_number)
    assert out.shape[1].node.expr == symbolic_number.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].shape[0].node.expr
    assert not any(isinstance(v, torch.SymInt) for key in set(iterated._results_on_stand_ins) - set(before)
                   for v in torch.utils._pytree.tree_leaves(key))


@pytest.mark.parametrize("op", sorted(set(direct.DIRECT) - set(direct._FUNCTIONAL), key=str))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_in_place_forms(op, dtype):
    """``self`` comes back where the result fits it; real execution decides every refusal."""
    if op.__name__.split(".")[0] in ("mm_", "addmm_"):
        operands = [(torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5))]
    elif len([a for a in op._schema.arguments if a.type.isSubtypeOf(torch.TensorType.get())]) >= 2:
        operands = [(self, other) for self in _layouts((2, 1, 3, 3), dtype)[:3]
                    for other in (*_layouts((2, 1, 3, 3), dtype)[:2], *_layouts((3,), torch.float32)[:1],
                                  torch.randn(4, 2, 1, 3, 3), 2, 0.5)]
    else:
        operands = [(self,) for self in _layouts((2, 1, 3, 3), dtype)]
    for args in operands:
        _check(op, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))


_VIEW_CALLS = [(aten.transpose.int, (0, 1)), (aten.transpose.int, (-1, 1)), (aten.transpose.int, (2, 5)),
               (aten.transpose.int, (0, 0)), (aten.t.default, ()), (aten.permute.default, ([2, 0, 1],)),
               (aten.permute.default, ([0, 0, 1],)), (aten.permute.default, ([-1, 0, 1],)),
               (aten.permute.default, ([1, 0],)), (aten.unsqueeze.default, (0,)), (aten.unsqueeze.default, (-1,)),
               (aten.unsqueeze.default, (3,)), (aten.unsqueeze.default, (5,)), (aten.unsqueeze.default, (1,)),
               (aten.expand.default, ([2, 4, 3],)), (aten.expand.default, ([5, -1, 4, 3],)),
               (aten.expand.default, ([-1, 4, 3],)), (aten.expand.default, ([2, 3, 3],)),
               (aten.expand.default, ([3],)), (aten.expand.default, ([-1, -1, -1, -1],)),
               (aten.expand.default, ([0, 2, 4, 3],)), (aten.expand.default, ([2, 1, -1, -1, -1],)),
               (aten.expand.default, ([1, 1, 2, 4, 3],)),
               (aten.slice.Tensor, ()), (aten.slice.Tensor, (1, 1)), (aten.slice.Tensor, (-1, -2)),
               (aten.slice.Tensor, (0, 0, 1, 2)), (aten.slice.Tensor, (1, 5, 0)), (aten.slice.Tensor, (0, -9, 100, 3)),
               (aten.slice.Tensor, (-1, None, sys.maxsize)), (aten.slice.Tensor, (0, 1, -1)),
               (aten.slice.Tensor, (0, None, None, 0)), (aten.slice.Tensor, (0, None, None, -1)),
               (aten.slice.Tensor, (3, 0, 1)), (aten.alias.default, ()), (aten.detach.default, ())]


@pytest.mark.parametrize("op, arguments", _VIEW_CALLS, ids=[f"{op}-{a}" for op, a in _VIEW_CALLS])
@pytest.mark.parametrize("shape", [(2, 1, 3), (2, 3), (4,), (), (2, 0, 3)])
def test_views_that_decide_nothing(op, arguments, shape):
    for input in _layouts(shape, torch.float32)[:3]:
        _check(op, (input, *arguments))
    _check(op, (torch.randn(shape, requires_grad=True), *arguments))


def test_views_with_symbolic_sizes_equal_their_meta_kernels():
    def views(x):
        return (x.transpose(0, 1), x.unsqueeze(1), x.unsqueeze(0).expand(3, -1, -1), x.permute(1, 0),
                x[:, :1].expand(-1, 5), x[:, 2:7:2], x[:, -3:], x[:], x[: x.shape[0]], x[1:], x[::2],
                x.transpose(0, 1).detach())

    def propagated():
        gm = torch.fx.symbolic_trace(views)
        fxprop.propagate(gm, fxprop.TensorSpec(("B", 8)))
        return [(fxprop.shape_of(node), str(node.meta["val"].stride())) for node in gm.graph.nodes
                if node.op == "call_method"]

    fast = propagated()
    with _without_shortcut():
        assert propagated() == fast


def test_products_and_layer_norm_with_symbolic_sizes_equal_their_meta_kernels():
    def products(x, w):
        hidden = torch.nn.functional.layer_norm(x, (8,))
        return torch.addmm(w[0], hidden.view(-1, 8), w), hidden.view(-1, 8).mm(w), torch.nn.functional.layer_norm(
            x.transpose(0, 1), (8,))

    def propagated():
        gm = torch.fx.symbolic_trace(products)
        fxprop.propagate(gm, fxprop.TensorSpec(("B", "T", 8)), fxprop.TensorSpec((8, 8)))
        return [(fxprop.shape_of(node), str(node.meta["val"].stride()), node.meta["val"].dtype)
                for node in gm.graph.nodes if node.op in ("call_function", "call_method")]

    fast = propagated()
    with _without_shortcut():
        assert propagated() == fast


_NORM_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("input_dtype", _NORM_DTYPES)
@pytest.mark.parametrize("parameter_dtypes", [(None, None), (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.float64, torch.float64), (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_statistics_dtypes_and_mixed_refusals_follow_the_cpu_kernel(input_dtype, parameter_dtypes, training):
    weight_dtype, stats_dtype = parameter_dtypes
    weight = torch.randn(3, dtype=weight_dtype) if weight_dtype else None
    running = (torch.zeros(3, dtype=stats_dtype or input_dtype), torch.ones(3, dtype=stats_dtype or input_dtype))
    input = torch.randn(2, 3, 4, 4, dtype=input_dtype)
    _check(aten.native_batch_norm.default, (input, weight, weight, *running, training, 0.1, 1e-5))
    if not training:
        _check(aten._native_batch_norm_legit_no_training.default, (input, weight, weight, *running, 0.1, 1e-5))


@pytest.mark.parametrize("input_dtype", _NORM_DTYPES)
@pytest.mark.parametrize("weight_dtype, bias_dtype", [(torch.float32, torch.float32), (torch.float64, None),
                                                      (torch.bfloat16, torch.float32), (None, torch.float32)])
def test_layer_norm_mixed_dtypes_follow_the_cpu_kernel(input_dtype, weight_dtype, bias_dtype):
    weight, bias = (torch.randn(8, dtype=dtype) if dtype else None for dtype in (weight_dtype, bias_dtype))
    _check(aten.native_layer_norm.default, (torch.randn(2, 8, dtype=input_dtype), [8], weight, bias, 1e-5))


@pytest.mark.parametrize("reshape", [lambda x: x.view(-1, 8), lambda x: x.view(x.shape[0], -1, 2, 4),
                                     lambda x: x.view(x.shape[0] * x.shape[1], 8), lambda x: x.view(-1),
                                     lambda x: x.transpose(0, 1).reshape(-1, 8), lambda x: x.view(1, -1, 8, 1),
                                     lambda x: x[:, 1:].reshape(-1, 4)])
def test_symbolic_views_equal_their_meta_kernels_and_real_execution(reshape):
    def propagated():
        gm = torch.fx.symbolic_trace(reshape)
        out = fxprop.propagate(gm, fxprop.TensorSpec(("B", "T", 8)))
        return gm, (fxprop.shape_of(next(n for n in gm.graph.nodes if n.op == "output").args[0]), str(out.stride()))

    gm, fast = propagated()
    with _without_shortcut():
        assert propagated()[1] == fast
    real = reshape(torch.randn(3, 5, 8))
    sizes = [int(size.subs({symbol: {"B": 3, "T": 5}[symbol.name] for symbol in size.free_symbols}))
             if hasattr(size, "free_symbols") else size for size in fast[0]]
    assert sizes == list(real.shape)


@pytest.mark.parametrize("name, dynamic", [("clip", False), ("swin", True)])
def test_a_compiled_model_equals_dynamos_values_on_every_node(name, dynamic):
    """Expressions dynamo's ShapeEnv can prove equal to its own example values (a new leading dim
    of size 1 keeps ATen's stride; views keep the meta kernel's expressions)."""
    from corpus import models as corpus
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    def same_size(a, b):
        return statically_known_true(a == b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b

    differing = []

    def backend(gm, example_inputs):
        fxprop.propagate(gm, *example_inputs)
        for node in gm.graph.nodes:
            theirs, ours = node.meta.get("example_value"), node.meta.get("val")
            if isinstance(theirs, torch.Tensor) and not (
                    isinstance(ours, torch.Tensor) and theirs.dim() == ours.dim()
                    and all(map(same_size, theirs.shape, ours.shape)) and all(map(same_size, theirs.stride(), ours.stride()))
                    and (theirs.dtype, theirs.requires_grad) == (ours.dtype, ours.requires_grad)):
                differing.append(node.name)
        return gm.forward

    model, inputs = corpus.build(name)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model.eval(), backend=backend, dynamic=dynamic)(**inputs)
    assert differing == []


@pytest.mark.parametrize("shape", [("B", "T", 8), (1, "B", 1, "T"), ("B",), ("B", 0, "T"), ("B", "u"), ("B", "T+1", 8),
                                   ("T+1", 8, "B"), (4, "max(B, T)"), ("max(B, T)", 2, "min(B, T)")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.float64])
def test_an_empty_result_of_symbolic_sizes_is_torch_empty(shape, dtype):
    """The direct rules' contiguous results: the sizes, strides, storage bytes and autograd state
    ``torch.empty`` gives, as expressions (``u``: a data-dependent size, left to ``torch.empty``),
    and a storage whose symbolic size C++ refuses to read as an int, as ``torch.empty``'s does."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    env = ShapeEnv()
    sizes = {name: env.create_symintnode(env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC),
                                         hint=hint) for name, hint in (("B", 3), ("T", 5))}
    sizes["u"] = env.create_unbacked_symint()
    sizes["T+1"] = sizes["T"] + 1
    sizes["max(B, T)"], sizes["min(B, T)"] = torch.sym_max(sizes["B"], sizes["T"]), torch.sym_min(sizes["B"], sizes["T"])
    shape = tuple(sizes.get(size, size) for size in shape)
    ours, torchs = direct.empty_contiguous(shape, dtype), torch.empty(shape, dtype=dtype, device="meta")

    def described(tensor):
        return (tuple(map(str, (*tensor.shape, *tensor.stride(), tensor.storage_offset(),
                                tensor.untyped_storage().nbytes()))), tensor.dtype, tensor._is_view(), tensor.requires_grad)
    assert described(ours) == described(torchs)

    def size_read_by_cpp(tensor):
        try:
            return len(tensor.untyped_storage())
        except RuntimeError:
            return "refused"
    assert size_read_by_cpp(ours) == size_read_by_cpp(torchs)


def test_results_of_sizes_the_shape_env_fixed_have_storages_of_ints():
    """``x.view(3, 8)`` of (B, 8) fixes B to 3: torch's arithmetic on B then gives ints, and so a
    storage of an int size, which C++ reads."""
    def fixed(x):
        x.view(3, 8)
        return torch.nn.functional.layer_norm(x, (8,)), x * 2, x.sum(-1)
    gm = torch.fx.symbolic_trace(fixed)
    for result, real in zip(fxprop.propagate(gm, fxprop.TensorSpec(("B", 8)), cache=False), fixed(torch.randn(3, 8))):
        assert (len(result.untyped_storage()), result.stride()) == (len(real.untyped_storage()), real.stride())
