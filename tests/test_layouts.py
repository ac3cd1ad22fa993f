"""Result layouts against real CPU execution: elementwise ops (TensorIterator's layout, strides
compared in full, size-1 dims included, the backward kernels TensorIterator lays out too), batch
norm, group norm, convolution (the CPU backends' choice, strides compared where they address
memory), the backward kernels that allocate their own results, one_hot, and result shapes meta
kernels get wrong."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop.testing import significant_strides
from fxprop.aten.layout import _operand_arguments

aten = torch.ops.aten

ELEMENTWISE = sorted((getattr(getattr(aten, name), overload) for name in dir(aten)
                      if isinstance(getattr(aten, name), torch._ops.OpOverloadPacket)
                      for overload in getattr(aten, name).overloads()
                      if _operand_arguments(getattr(getattr(aten, name), overload))
                      and str(getattr(getattr(aten, name), overload)._schema.returns[0].type) == "Tensor"), key=str)

# Layouts where TensorIterator and torch's python meta kernels part ways, and ordinary ones.
LAYOUTS = {
    "size-1 dims, dense": lambda: torch.randn(4).as_strided((1, 1, 2, 1), (2, 1, 1, 1)),
    "size-1 dims, dense, last two swapped": lambda: torch.randn(4).as_strided((1, 1, 2, 2), (4, 1, 1, 2)),
    "transposed": lambda: torch.randn(3, 4).t(),
    "transposed with a size-1 dim": lambda: torch.randn(2, 1, 3).transpose(0, 2),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1),
    "strided": lambda: torch.randn(6)[::2],
    "expanded": lambda: torch.randn(1, 3).expand(2, 3),
}


def _arguments(op, base: torch.Tensor, dtype: torch.dtype) -> tuple[list, dict] | None:
    """Arguments for ``op``: ``base`` (as ``dtype``) for the first tensor, a broadcast row for the
    other tensors, a bool mask, small numbers, and the keyword-only arguments with no default
    (rounding_mode, decimals); None where the schema needs more."""
    values, keywords = [], {}
    for position, argument in enumerate(op._schema.arguments):
        if argument.kwarg_only:
            if not argument.has_default_value():
                keywords[argument.name] = "trunc" if "str" in str(argument.type) else 1
            continue
        kind = argument.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        if kind.isSubtypeOf(torch.TensorType.get()):
            if argument.name in ("mask", "condition"):
                values.append(base > 0)
            else:
                values.append(base.to(dtype) if not values or position % 2 else base[..., :1].to(dtype))
        elif kind == torch.NumberType.get() or str(kind) == "float":
            values.append(0.5 if dtype.is_floating_point else 2)
        elif str(kind) == "int":
            values.append(1)
        elif str(kind) == "str":
            values.append("trunc")
        elif str(kind) == "bool":
            values.append(False)
        else:
            return None
    return values, keywords


def _graph_of(op, arguments: list, keywords: dict) -> tuple[torch.fx.GraphModule, list]:
    graph = torch.fx.Graph()
    tensors = [value for value in arguments if isinstance(value, torch.Tensor)]
    placeholders = iter([graph.placeholder(f"t{i}") for i in range(len(tensors))])
    call_args = [next(placeholders) if isinstance(value, torch.Tensor) else value for value in arguments]
    graph.output(graph.call_function(op, tuple(call_args), keywords))
    return torch.fx.GraphModule(torch.nn.Module(), graph), tensors


@pytest.mark.parametrize("op", ELEMENTWISE, ids=str)
def test_elementwise_results_are_laid_out_as_tensor_iterator_lays_them_out(op):
    assert _compare_layouts(op, (torch.float32, torch.int64, torch.bool)), f"{op}: no layout could be run for real"


@pytest.mark.parametrize("op", ELEMENTWISE, ids=str)
def test_elementwise_results_of_complex_tensors(op):
    """abs, angle and isinf of a complex tensor are laid out by their kernels, not by TensorIterator."""
    _compare_layouts(op, (torch.complex64,))  # ops with no complex kernel compare nothing


def _compare_layouts(op, dtypes: tuple) -> int:
    """How many layouts were compared with real execution (at most one dtype each)."""
    compared = 0
    for layout, make in LAYOUTS.items():
        base = make()
        for dtype in dtypes:
            made = _arguments(op, base, dtype)
            if made is None:
                pytest.skip(f"{op}'s schema needs arguments this table does not make")
            arguments, keywords = made
            try:
                real = op(*arguments, **keywords)
            except (RuntimeError, TypeError, ValueError):
                continue  # a dtype the kernel does not implement: try the next one
            gm, tensors = _graph_of(op, arguments, keywords)
            result = fxprop.propagate(gm, *tensors)
            expected = [t.stride() for t in (real if isinstance(real, tuple) else (real,))]
            got = [t.stride() for t in (result if isinstance(result, tuple) else (result,))]
            assert got == expected, f"{op} on a {layout} {dtype} input: real strides {expected}, fxprop {got}"
            compared += 1
            break
    return compared


def _permuted(shape: tuple) -> list[torch.Tensor]:
    inverse = lambda perm: [perm.index(i) for i in range(len(shape))]  # noqa: E731
    return [torch.randn([shape[p] for p in perm]).permute(inverse(list(perm)))
            for perm in itertools.permutations(range(len(shape)))]


@pytest.mark.parametrize("shape", [(1, 2, 2), (3, 2, 4), (2, 3, 1, 1), (2, 3, 4, 5), (1, 3, 2, 2, 2), (1, 3, 1, 2)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_output_layout_on_the_cpu(shape, training):
    norm = {3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}[len(shape)](shape[1])
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(norm.train(training)))
    for x in _permuted(shape):
        expected, got = gm(x), fxprop.propagate(gm, x)
        assert significant_strides(got.shape, got.stride()) == significant_strides(expected.shape, expected.stride()), (
            f"input strides {x.stride()}: real {expected.stride()}, fxprop {got.stride()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spatial", [2, 3])
def test_conv_output_layout_follows_the_hosts_backend_choice(dtype, spatial):
    """The CPU picks oneDNN or the slow kernels by dtype, batch, kernel size, groups, thread count and
    the host's bf16/fp16 support; each keeps or drops channels_last its own way."""
    conv, conv_transpose = (F.conv2d, F.conv_transpose2d) if spatial == 2 else (F.conv3d, F.conv_transpose3d)
    channels_last = torch.channels_last if spatial == 2 else torch.channels_last_3d
    formats = (torch.contiguous_format, channels_last)

    class Conv(torch.nn.Module):
        def __init__(self, fn, options):
            super().__init__()
            self.fn, self.options = fn, options

        def forward(self, x, w):
            return self.fn(x, w, **self.options)

    for batch, kernel, options, fn, x_format, w_format in itertools.product(
            (0, 1, 17), (1, 3), ({}, {"stride": 2}, {"groups": 3}), (conv, conv_transpose), formats, formats):
        x = torch.randn(batch, 3, *(6,) * spatial, dtype=dtype).contiguous(memory_format=x_format)
        w = torch.randn(3, 1 if options.get("groups") else 3, *(kernel,) * spatial,
                        dtype=dtype).contiguous(memory_format=w_format)
        try:
            real = fn(x, w, **options)
        except RuntimeError:
            continue
        got = fxprop.propagate(torch.fx.symbolic_trace(Conv(fn, options)), x, w)
        assert significant_strides(got.shape, got.stride()) == significant_strides(real.shape, real.stride()), (
            fn.__name__, batch, kernel, options, x_format, w_format, real.stride(), got.stride())


@pytest.mark.parametrize("op", [torch.tril, torch.triu])
@pytest.mark.parametrize("layout", [((1, 2, 1, 1), (2, 1, 2, 2)), ((3, 4), (1, 3)), ((2, 3, 4), (1, 8, 2))],
                         ids=str)
def test_triangular_parts_are_laid_out_afresh_as_the_following_ops_see_them(op, layout):
    """Fuzzer finding: the meta kernel kept a contiguous input's size-1 strides, which
    TensorIterator then read when it laid out ``tril(x) + y``."""
    shape, stride = layout
    x = torch.empty_strided(shape, stride).normal_()
    y = torch.ones(3, 1)
    gm = torch.fx.symbolic_trace(lambda x, y: (op(x), op(x) + y))
    real = gm(x, y)
    got = fxprop.propagate(gm, x, y)
    assert [t.stride() for t in got] == [t.stride() for t in real]


# Layouts of a 4-d tensor of shape (2, 8, 4, 4), and of 3-d and 5-d ones.
NORM_LAYOUTS = {
    "contiguous": lambda: torch.randn(2, 8, 4, 4),
    "channels_last": lambda: torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last),
    "channels_last, batch of 1": lambda: torch.randn(1, 8, 4, 4).to(memory_format=torch.channels_last),
    "channels_last, 1x1 image": lambda: torch.randn(2, 8, 1, 1).to(memory_format=torch.channels_last),
    "transposed image": lambda: torch.randn(2, 8, 4, 4).transpose(2, 3),
    "permuted": lambda: torch.randn(4, 4, 8, 2).permute(3, 2, 1, 0),
    "strided": lambda: torch.randn(2, 8, 4, 8)[..., ::2],
    "3-d, transposed": lambda: torch.randn(2, 4, 8).transpose(1, 2),
    "5-d, channels_last_3d": lambda: torch.randn(2, 8, 2, 3, 2).to(memory_format=torch.channels_last_3d),
}


class _GroupNormThenFlatten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        return self.norm(x).flatten(2)


@pytest.mark.parametrize("layout", NORM_LAYOUTS)
def test_group_norm_keeps_the_inputs_memory_format_on_the_cpu(layout):
    """The composite kernel makes a CPU input contiguous in its suggested memory format (any other
    device's contiguous); on meta it took the other branch. Views after it inherit its strides."""
    x = NORM_LAYOUTS[layout]()
    functional = lambda x: (F.group_norm(x, 4), torch.group_norm(x, 2, torch.ones(8), torch.ones(8)),  # noqa: E731
                            torch.ops.aten.group_norm.default(x, 4).flatten(2))
    for gm in (torch.fx.symbolic_trace(functional), torch.fx.symbolic_trace(_GroupNormThenFlatten())):
        fxprop.testing.assert_matches_real(gm, x)


def test_group_norm_for_another_device_is_contiguous():
    x = fxprop.TensorSpec((2, 8, 4, 4), device="cuda:0", stride=(128, 1, 32, 8))
    assert fxprop.propagate(torch.fx.symbolic_trace(lambda x: F.group_norm(x, 4)), x).stride() == (128, 16, 4, 1)


@pytest.mark.parametrize("layout", ["transposed", "permuted", "strided", "offset", "expanded", "channels_last"])
def test_one_hot_is_contiguous_as_the_kernels_fill_zeros(layout):
    """Fuzzer finding: the meta branch of the composite kernel followed the input's layout."""
    base = torch.randint(0, 10, (4, 5, 6))
    x = {"transposed": base[0].t(), "permuted": base.permute(2, 0, 1), "strided": base[:, ::2],
         "offset": base[1:], "expanded": base[:, :1].expand(4, 3, 6),
         "channels_last": torch.randint(0, 10, (2, 3, 4, 5)).to(memory_format=torch.channels_last)}[layout]
    fxprop.testing.check_rule(F.one_hot, x, 10)
    fxprop.testing.check_rule(torch.ops.aten.one_hot.default, x, 10)


_GRAD_LAYOUTS = {name: NORM_LAYOUTS[name] for name in ("contiguous", "channels_last", "transposed image", "permuted",
                                                       "strided")}


@pytest.mark.parametrize("grad_layout", _GRAD_LAYOUTS)
@pytest.mark.parametrize("input_layout", _GRAD_LAYOUTS)
def test_norm_backward_kernels_lay_out_the_input_gradient_as_the_cpu_kernels_do(grad_layout, input_layout):
    """Layer norm's input gradient is contiguous, batch norm's in the input's suggested memory
    format, where the meta kernels follow the grad (Swin's backward graph: a transposed grad)."""
    aten = torch.ops.aten
    grad, x = _GRAD_LAYOUTS[grad_layout](), _GRAD_LAYOUTS[input_layout]()
    weight = torch.randn(8)
    _, mean, rstd = aten.native_layer_norm(x, [4, 4], None, None, 1e-5)
    fxprop.testing.check_rule(aten.native_layer_norm_backward.default, grad, x, [4, 4], mean, rstd, torch.ones(4, 4),
                              torch.ones(4, 4), [True, True, True])
    _, save_mean, save_invstd = aten.native_batch_norm(x, weight, weight, None, None, True, 0.1, 1e-5)
    fxprop.testing.check_rule(aten.native_batch_norm_backward.default, grad, x, weight, None, None, save_mean,
                              save_invstd, True, 1e-5, [True, True, True])
    fxprop.testing.check_rule(aten.native_batch_norm_backward.default, grad, x, weight, torch.zeros(8), torch.ones(8),
                              None, None, False, 1e-5, [True, False, True])


def test_layer_norm_backward_of_a_transposed_grad_then_dropout_backward_then_view():
    """Swin's backward graph: the three nodes real execution and AOT run, which fxprop refused at the
    view when the first followed the meta kernel and the second the CPU kernel."""
    aten = torch.ops.aten

    def backward(grad, x, mean, rstd, weight, bias, mask):
        grad_input = aten.native_layer_norm_backward.default(grad, x, [32], mean, rstd, weight, bias,
                                                             [True, True, True])[0]
        return aten.view.default(aten.native_dropout_backward.default(grad_input, mask, 1.0), [62, 32])

    x = torch.randn(2, 31, 32)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [32], None, None, 1e-5)
    fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(backward), torch.randn(2, 32, 31).transpose(1, 2), x,
                                       mean, rstd, torch.ones(32), torch.zeros(32), torch.ones(2, 31, 32, dtype=torch.bool))


@pytest.mark.parametrize("op", [torch.ops.aten.mse_loss_backward.default, torch.ops.aten.huber_loss_backward.default,
                                torch.ops.aten.smooth_l1_loss_backward.default], ids=str)
@pytest.mark.parametrize("grad_layout", _GRAD_LAYOUTS)
@pytest.mark.parametrize("input_layout", ["transposed image", "channels_last"])
def test_loss_backward_kernels_allocate_a_contiguous_gradient(op, grad_layout, input_layout):
    grad, x = _GRAD_LAYOUTS[grad_layout](), _GRAD_LAYOUTS[input_layout]()
    extra = () if op is torch.ops.aten.mse_loss_backward.default else (1.0,)
    fxprop.testing.check_rule(op, grad, x, x.clone(), 0, *extra)


@pytest.mark.parametrize("shape", [(), (5,), (3, 5), (0, 5)], ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_margin_losses_of_a_vector_give_one_0_dim_loss(shape, reduction):
    """The meta kernels (decompositions over atleast_2d) kept a batch of one under reduction='none'."""
    x = torch.randn(shape, requires_grad=True)
    labels = torch.randint(0, 5, shape) if shape else torch.tensor(0)
    classes = torch.randint(0, 5, shape[:-1]) if len(shape) > 1 else torch.tensor(1 if shape else 0)
    fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(torch.nn.MultiLabelMarginLoss(reduction=reduction)),
                                       x, labels)
    fxprop.testing.assert_matches_real(torch.fx.symbolic_trace(torch.nn.MultiMarginLoss(reduction=reduction)),
                                       x, classes)


_HALF = torch.float16
_NOT_DENSE = {
    "expanded": lambda: torch.randn(4, 1, dtype=_HALF).expand(4, 3),
    "transposed_slice": lambda: torch.randn(4, 6, dtype=_HALF)[:, ::2].t(),
    "permuted_slice": lambda: torch.randn(2, 3, 4, 5, dtype=_HALF).permute(0, 2, 3, 1)[:, ::2],
    "permuted_gaps": lambda: torch.randn(8, dtype=_HALF).as_strided((2, 1, 1, 2), (4, 4, 4, 2)).permute(1, 2, 3, 0),
    "expanded_permuted": lambda: torch.randn(5, 1, 3, dtype=_HALF).expand(5, 2, 3).transpose(0, 2),
}


@pytest.mark.parametrize("make", list(_NOT_DENSE.values()), ids=list(_NOT_DENSE))
@pytest.mark.parametrize("partner_shape", [(1,), ()], ids=["broadcast", "scalar_tensor"])
def test_a_binary_op_casts_a_non_dense_input_as_tensor_iterator_does(make, partner_shape):
    """Fuzz finding: ``float32 (1,) + float16 permuted slice`` was laid out contiguous; the CPU's
    TensorIterator casts the float16 input with ``Tensor.to``, which keeps its strides' order
    (dense, as ``empty_like`` lays it out), and the result follows that order."""
    def add(partner, x):
        return torch.add(partner, x)
    x = make()
    partner = torch.randn(partner_shape)
    real = add(partner, x)
    gm = torch.fx.symbolic_trace(add)
    fxprop.propagate(gm, fxprop.TensorSpec(partner_shape), fxprop.TensorSpec(tuple(x.shape), stride=x.stride(),
                                                                               dtype=torch.float16))
    fxprop.testing.assert_matches_real(gm, partner, x)
    assert fxprop.propagate(gm, partner, x).stride() == real.stride()


@pytest.mark.parametrize("layout", [((1,), (2,)), ((3,), (2,)), ((1, 3), (7, 1)), ((2, 1), (1, 5)), ((2, 3), (1, 2))],
                         ids=str)
def test_abs_of_a_complex_tensor_keeps_a_dense_inputs_own_strides(layout):
    """Campaign finding: ``abs`` of a complex (1,) tensor of stride 2 is a float tensor of stride 2
    on a real device (the kernel allocates ``empty_like(self)``, which keeps a dense input's strides,
    size-1 dims included), so a following ``view(torch.float16)`` is refused; the meta kernel's
    ``empty_like`` gives stride 1, and fxprop accepted the view."""
    shape, stride = layout
    x = torch.randn(32, dtype=torch.complex64).as_strided(shape, stride)
    gm = torch.fx.symbolic_trace(lambda x: torch.abs(x))
    assert fxprop.propagate(gm, fxprop.TensorSpec(shape, stride=stride, dtype=torch.complex64)).stride() == \
        torch.abs(x).stride()
    viewed = torch.fx.symbolic_trace(lambda x: torch.abs(x).view(torch.float16))
    try:
        torch.abs(x).view(torch.float16)
    except RuntimeError:
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(viewed, fxprop.TensorSpec(shape, stride=stride, dtype=torch.complex64))
        assert caught.value.error_type is RuntimeError
    else:
        fxprop.testing.assert_matches_real(viewed, x)


_GROUPS = torch.tensor([3, 7, 10], dtype=torch.int32)
GROUPED_MM = {
    "2-d by 3-d (experts' inputs by their weights)": (torch.randn(10, 8), torch.randn(3, 8, 8), _GROUPS),
    "2-d by 3-d column-major, 6 columns": (torch.randn(10, 8), torch.randn(3, 6, 8).transpose(1, 2), _GROUPS),
    "2-d by 2-d (the weights' gradient)": (torch.randn(10, 8).t(), torch.randn(10, 8), _GROUPS),
    "3-d by 2-d": (torch.randn(3, 4, 8), torch.randn(12, 8).t(), torch.tensor([4, 8, 12], dtype=torch.int32)),
    "3-d by 3-d, 6 columns": (torch.randn(3, 4, 8), torch.randn(3, 6, 8).transpose(1, 2), None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", GROUPED_MM)
def test_grouped_mm_on_the_cpu_takes_its_dtypes_and_pads_its_rows_to_16_bytes(case, dtype):
    """The CPU kernel multiplies float32, bfloat16 and float16 (torch's meta kernel asks for
    bfloat16, as CUDA does) and pads each row of its result to 16 bytes (the meta kernel of a build
    without CUDA allocates it contiguous): MoE experts in an eager training graph."""
    mat_a, mat_b, offs = GROUPED_MM[case]
    fxprop.testing.check_rule(torch.ops.aten._grouped_mm.default, mat_a.to(dtype), mat_b.to(dtype), offs)


ALLOCATED_LIKE_SELF_OR_CONTIGUOUS = {
    "sort": lambda t: torch.sort(t, 0),
    "sort, stable": lambda t: torch.sort(t, stable=True, dim=-1),
    "argsort": lambda t: torch.argsort(t, 0),
    "msort": torch.msort,
    "flip": lambda t: torch.flip(t, [0]),
    "empty_like": torch.empty_like,
    "zeros_like": torch.zeros_like,
    "ones_like, int32": lambda t: torch.ones_like(t, dtype=torch.int32),
    "full_like": lambda t: torch.full_like(t, 3),
    "rand_like": lambda t: torch.rand_like(t.float()),
    "randint_like": lambda t: torch.randint_like(t, 5),
    "zeros_like, contiguous": lambda t: torch.zeros_like(t, memory_format=torch.contiguous_format),
    "masked_fill": lambda t: t.masked_fill(t > 2, 0),
    "masked_fill, tensor value": lambda t: t.masked_fill(t > 2, torch.tensor(0)),
    "renorm": lambda t: torch.renorm(t.float(), 2, 0, 1.0),
    "polar": lambda t: torch.polar(t.float(), t.float()),
    "complex": lambda t: torch.complex(t.float(), t.float()),
    "nan_to_num": lambda t: torch.nan_to_num(t.double()),
    "frexp": lambda t: torch.frexp(t.float()),
    "deg2rad": lambda t: torch.deg2rad(t.float()),
    "hardtanh": lambda t: F.hardtanh(t.float()),
    "relu6": lambda t: F.relu6(t.float()),
    "hardswish": lambda t: F.hardswish(t.float()),
    "zero": lambda t: torch.ops.aten.zero.default(t),
    "exponential": lambda t: torch.ops.aten.exponential.default(t.float()),
    "uniform": lambda t: torch.ops.aten.uniform.default(t.float()),
    "log_sigmoid_forward": lambda t: torch.ops.aten.log_sigmoid_forward.default(t.float()),
    "normal of a tensor mean": lambda t: torch.normal(t.float(), 1.0),
    "isinf of floats": lambda t: torch.isinf(t.float()),
    "isinf of integers": torch.isinf,
    "isinf of bools": lambda t: torch.isinf(t > 2),
    "rot90": lambda t: torch.rot90(t, 1, [0, -1]),
    "rot90, half a turn": lambda t: torch.rot90(t, 2, [-1, 0]),
    "rot90, three quarters": lambda t: torch.rot90(t, -1, [-1, 0]),
}


@pytest.mark.parametrize("make", list(ALLOCATED_LIKE_SELF_OR_CONTIGUOUS.values()), ids=list(ALLOCATED_LIKE_SELF_OR_CONTIGUOUS))
@pytest.mark.parametrize("layout", [((1, 1, 1, 1), (2, 2, 2, 2)), ((4, 1, 3), (1, 8, 4)), ((2, 1, 3), (3, 7, 1)),
                                    ((3, 1), (2, 5)), ((2, 3), (1, 2))], ids=str)
def test_kernels_that_allocate_like_self_or_contiguous_lay_out_as_the_cpu_does(make, layout):
    """Campaign finding: ``sort`` of a dense (1, 1, 1, 1) int64 tensor of strides 2 gives values of
    strides 2 on the CPU (its kernel allocates ``self``'s strides where ``self`` is dense), so a
    following ``view(torch.float32)`` is refused; the meta kernel's ``empty_like`` recomputes the
    strides of size-1 dims. Kernels that allocate ``empty_like(self)`` keep them (flip, the
    ``*_like`` factories, ``nan_to_num``, ``frexp``, the ops that call another with a number into
    such a result, the functional random fills); ``masked_fill``, ``renorm``, ``log_sigmoid_forward``
    and ``normal`` allocate contiguous; ``polar``, ``complex`` and ``hardswish`` are TensorIterator ops;
    ``isinf`` of floats compares ``abs(self)`` with a number, of integers it is ``zeros_like(self)``;
    ``rot90`` transposes a ``flip``."""
    shape, stride = layout
    x = torch.empty_strided(shape, stride, dtype=torch.int64).random_(0, 5)

    class Model(torch.nn.Module):
        def forward(self, t):
            return make(t)
    gm = torch.fx.symbolic_trace(Model())
    real = make(x)
    got = fxprop.propagate(gm, x)
    real, got = (real, got) if isinstance(real, tuple) else ((real,), (got,))
    assert [t.stride() for t in got] == [t.stride() for t in real]
