"""Symbolic shapes: every symbolic result is checked by substituting concrete sizes and running for real."""
from __future__ import annotations

import operator

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

import fxprop
from fxprop import PropagationError, TensorSpec, examples, shape_of, symbolic

B, T, H, W, C, N = (sympy.Symbol(name, integer=True, positive=True) for name in "BTHWCN")


# --- the substitution check -----------------------------------------------------------

def real_values(gm: torch.fx.GraphModule, inputs: tuple) -> dict:
    """Every node's real value, by running the graph for real."""
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            values[node] = result = super().run_node(node)
            return result

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


def check_substitution(gm: torch.fx.GraphModule, sizes: dict, inputs: tuple) -> None:
    """Every node's symbolic shape, with ``sizes`` substituted, is the real shape; the assumptions hold.

    Data-dependent symbols are checked against their bounds and then bound to the real size,
    so every shape downstream of them is compared exactly too.
    """
    bindings = dict(sizes)
    infos = gm.meta["fxprop"]["symbols"]
    for assumption in gm.meta["fxprop"]["assumptions"]:
        if not assumption.free_symbols - set(bindings):
            assert bool(assumption.subs(bindings)), f"{assumption} fails at {bindings}: pick sizes that satisfy it"
    for node, value in real_values(gm, inputs).items():
        compare(shape_of(node), _real_shape(value), bindings, infos, node)


def _real_shape(value):
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return tuple(_real_shape(item) for item in value)
    if isinstance(value, torch.Size):
        return tuple(value)
    return value


def compare(symbolic_value, real, bindings, infos, node):
    if isinstance(symbolic_value, tuple):
        assert isinstance(real, tuple) and len(real) == len(symbolic_value), (node, symbolic_value, real)
        for item, real_item in zip(symbolic_value, real):
            compare(item, real_item, bindings, infos, node)
        return
    if isinstance(symbolic_value, sympy.Basic) and not isinstance(symbolic_value, sympy.logic.boolalg.Boolean):
        unknown = symbolic_value.free_symbols - set(bindings)
        if unknown == {symbolic_value}:  # a data-dependent size, first seen: check its bounds, then bind it
            info = infos[symbolic_value]
            assert info.node is not None
            lower, upper = (sympy.sympify(bound).subs(bindings) for bound in (info.lower, info.upper))
            assert lower <= real <= upper, (node, symbolic_value, real, lower, upper)
            bindings[symbolic_value] = real
            return
        assert not unknown, (node, symbolic_value, unknown)
        assert symbolic_value.subs(bindings) == real, (node, symbolic_value, bindings, real)
        return
    if isinstance(symbolic_value, (int, float, bool)) and isinstance(real, (int, float, bool)):
        if isinstance(symbolic_value, int):
            assert symbolic_value == real, (node, symbolic_value, real)


def output_shape(gm):
    return shape_of(next(node for node in gm.graph.nodes if node.op == "output"))


def traced(fn, *names):
    """A GraphModule calling ``fn`` on placeholders named ``names``, traced like symbolic_trace."""
    tracer = torch.fx.Tracer()
    tracer.graph = graph = torch.fx.Graph()
    tracer.root = root = torch.nn.Module()
    proxies = [torch.fx.Proxy(graph.placeholder(name), tracer) for name in names]
    graph.output(tracer.create_arg(fn(*proxies)))
    return torch.fx.GraphModule(root, graph)


# --- item 1: dims ---------------------------------------------------------------------

def test_dims_are_ints_strings_or_sympy_and_the_same_name_is_the_same_size():
    gm = traced(lambda x, y: torch.cat([x, y]), "x", "y")
    fxprop.propagate(gm, TensorSpec(("B", 16)), TensorSpec((sympy.Symbol("B"), 16)))
    assert output_shape(gm) == (2 * B, 16)
    gm = traced(lambda x, y: torch.cat([x, y]), "x", "y")
    fxprop.propagate(gm, TensorSpec(("2*B", "T")), TensorSpec((B + 1, T)))
    assert output_shape(gm) == (3 * B + 1, T)
    symbols = gm.meta["fxprop"]["symbols"]
    assert symbols[B].lower == 1 and symbols[B].upper == sympy.oo and symbols[B].node is None
    check_substitution(gm, {B: 3, T: 2}, (torch.randn(6, 2), torch.randn(4, 2)))


def test_symbols_declared_nonnegative_may_be_zero():
    M = sympy.Symbol("M", integer=True, nonnegative=True)
    gm = traced(lambda x: x.sum(0), "x")
    fxprop.propagate(gm, TensorSpec((M, 4)))
    assert gm.meta["fxprop"]["symbols"][M].lower == 0
    check_substitution(gm, {M: 0}, (torch.randn(0, 4),))


@pytest.mark.parametrize("dim", [-1, 2.5, "B +", sympy.Symbol("x", negative=True), sympy.Rational(1, 2),
                                 sympy.Symbol("F", real=True), sympy.Symbol("F", positive=True),
                                 2 * sympy.Symbol("F", real=True, positive=True)])
def test_bad_dims_are_refused(dim):
    with pytest.raises(fxprop.InputError):
        TensorSpec((dim, 4))


# --- item 2: expressions out ----------------------------------------------------------

def test_linear_cat_view_conv_reshape():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(16, 32))
    fxprop.propagate(gm, TensorSpec(("B", 16)))
    assert output_shape(gm) == (B, 32)
    for b in (1, 5):
        check_substitution(gm, {B: b}, (torch.randn(b, 16),))

    gm = traced(lambda x: torch.cat([x, x]).view(-1), "x")
    fxprop.propagate(gm, TensorSpec(("B", 16)))
    cat, view = [node for node in gm.graph.nodes if node.op.startswith("call")]
    assert shape_of(cat) == (2 * B, 16) and shape_of(view) == (32 * B,)

    gm = torch.fx.symbolic_trace(torch.nn.Conv2d(3, 8, 3, stride=2))
    fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))
    assert output_shape(gm) == (1, 8, sympy.floor((H - 3) / 2) + 1, sympy.floor((W - 3) / 2) + 1)
    assert sympy.And(H >= 3, W >= 3) in gm.meta["fxprop"]["assumptions"]
    for h, w in ((3, 3), (8, 11), (32, 17)):
        check_substitution(gm, {H: h, W: w}, (torch.randn(1, 3, h, w),))

    gm = traced(lambda x: x.reshape(-1, 4), "x")
    fxprop.propagate(gm, TensorSpec(("N",)))
    assert output_shape(gm) == (sympy.floor(N / 4), 4)
    for n in (4, 12):
        check_substitution(gm, {N: n}, (torch.randn(n),))


def test_mlp():
    gm = torch.fx.symbolic_trace(examples.MLP())
    fxprop.propagate(gm, TensorSpec(("B", 16)))
    assert output_shape(gm) == (B, 10)
    for b in (1, 7):
        check_substitution(gm, {B: b}, (torch.randn(b, 16),))


def test_cnn_with_symbolic_height_and_width():
    model = examples.ResNet().eval()
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", 3, "H", "W")))
    assert output_shape(gm) == (B, 10)
    stem = next(node for node in gm.graph.nodes if node.target == "stem.3")
    assert shape_of(stem) == (B, 16, sympy.floor((H - 1) / 2) + 1, sympy.floor((W - 1) / 2) + 1)
    for b, h, w in ((2, 32, 32), (1, 17, 23), (3, 5, 9)):
        check_substitution(gm, {B: b, H: h, W: w}, (torch.randn(b, 3, h, w),))


def test_gpt_with_symbolic_batch_and_sequence_length():
    model, _ = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    out = fxprop.propagate(gm, TensorSpec(("B", "T"), dtype=torch.int64))
    assert output_shape(gm) == (B, T, model.config.vocab_size)
    assert isinstance(out, FakeTensor) and out.fake_mode.shape_env is not None
    for b, t in ((1, 1), (2, 16), (3, 7)):
        check_substitution(gm, {B: b, T: t}, (torch.randint(0, model.config.vocab_size, (b, t)),))


def test_lstm_with_symbolic_batch():
    model, _ = examples.lstm_example()
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", 12), dtype=torch.int64))
    assert output_shape(gm) == ((B, 12, 7), (2, B, 48), (2, B, 48))
    for b in (1, 4):
        check_substitution(gm, {B: b}, (torch.randint(0, 100, (b, 12)),))


def test_lstm_with_symbolic_batch_and_sequence_length():
    model, _ = examples.lstm_example()
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", "T"), dtype=torch.int64))
    assert output_shape(gm) == ((B, T, 7), (2, B, 48), (2, B, 48))
    lstm = next(node for node in gm.graph.nodes if node.op == "call_module" and node.target == "lstm")
    assert lstm.meta["fxprop"].rule == "fxprop.rules.recurrent.recurrent_module"
    for b, t in ((1, 1), (2, 5), (3, 12)):
        check_substitution(gm, {B: b, T: t}, (torch.randint(0, 100, (b, t)),))


@pytest.mark.parametrize("module_type", [torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("batch_first", [False, True])
def test_recurrent_modules_over_a_symbolic_number_of_steps(module_type, batch_first):
    extra = {"proj_size": 3} if module_type is torch.nn.LSTM else {}
    model = torch.nn.Sequential(module_type(5, 4, num_layers=2, bidirectional=True, batch_first=batch_first, **extra))
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", "T", 5) if batch_first else ("T", "B", 5)))
    for b, t in ((1, 1), (2, 6)):
        check_substitution(gm, {B: b, T: t}, (torch.randn((b, t, 5) if batch_first else (t, b, 5)),))


def test_an_op_that_needs_a_symbolic_size_as_an_int_names_the_op_and_the_input():
    class Steps(torch.nn.Module):
        def forward(self, x):
            return torch.unbind(x)

    gm = torch.fx.symbolic_trace(Steps())
    with pytest.raises(fxprop.DataDependentError, match=r"(?s)aten\.unbind\.int.*symbolic input.*\(T, 4\)") as caught:
        fxprop.propagate(gm, TensorSpec(("T", 4)))
    assert caught.value.node_name == "unbind"


def test_aten_level_graph_meta_and_decomposition_rules():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    gm = make_fx(model)(torch.randn(4, 8))
    fxprop.propagate(gm, TensorSpec(("B", 8)))
    assert output_shape(gm) == (B, 16)
    kinds = {node.meta["fxprop"].kind for node in gm.graph.nodes}
    assert "meta" in kinds or "decomposition" in kinds
    for b in (1, 3):
        check_substitution(gm, {B: b}, (torch.randn(b, 8),))


def test_decomposition_rule_kind_is_symbolic_too():
    gm = traced(lambda x: F.glu(x, dim=-1), "x")
    fxprop.propagate(gm, TensorSpec(("B", "2*T")))
    assert output_shape(gm) == (B, T)
    check_substitution(gm, {B: 2, T: 3}, (torch.randn(2, 6),))


# --- item 3: data-dependent sizes -------------------------------------------------------

U0 = sympy.Symbol("u0", integer=True)


@pytest.mark.parametrize("values", [torch.tensor([1.0, 0.0, 2.0, 0.0]), torch.zeros(4), torch.ones(4)])
def test_nonzero_gets_a_fresh_bounded_symbol_never_a_guess(values):
    gm = traced(lambda x: x.nonzero(), "x")
    fxprop.propagate(gm, values)  # concrete input, real data: the count is still not guessed
    assert output_shape(gm) == (U0, 1)
    info = gm.meta["fxprop"]["symbols"][U0]
    assert (info.lower, info.upper, info.node, info.kind) == (0, 4, "nonzero", "size")
    check_substitution(gm, {}, (values,))


def test_nonzero_on_symbolic_input_is_bounded_by_its_numel():
    gm = traced(lambda x: torch.nonzero(x), "x")
    fxprop.propagate(gm, TensorSpec(("B", 5)))
    assert output_shape(gm) == (U0, 2)
    info = gm.meta["fxprop"]["symbols"][U0]
    assert (info.lower, info.upper, info.node) == (0, 5 * B, "nonzero")
    check_substitution(gm, {B: 3}, (torch.randint(0, 2, (3, 5)).float(),))


def test_unique_masked_select_boolean_mask_and_repeat_interleave():
    gm = traced(lambda x: torch.unique(x, return_counts=True), "x")
    fxprop.propagate(gm, TensorSpec((10,), dtype=torch.int64))
    assert output_shape(gm) == ((U0,), (U0,))
    check_substitution(gm, {}, (torch.tensor([3, 1, 3, 2, 2, 2, 9, 1, 1, 0]),))

    gm = traced(lambda x, m: torch.masked_select(x, m), "x", "m")
    fxprop.propagate(gm, TensorSpec(("B", 4)), TensorSpec(("B", 4), dtype=torch.bool))
    assert output_shape(gm) == (U0,) and gm.meta["fxprop"]["symbols"][U0].upper == 4 * B
    check_substitution(gm, {B: 3}, (torch.randn(3, 4), torch.rand(3, 4) > 0.5))

    gm = traced(lambda x, m: x[m] * 2, "x", "m")
    fxprop.propagate(gm, TensorSpec(("B", 4)), TensorSpec(("B",), dtype=torch.bool))
    getitem = next(node for node in gm.graph.nodes if node.target is operator.getitem)
    assert shape_of(getitem) == (U0, 4)
    assert gm.meta["fxprop"]["symbols"][U0].node == "getitem"
    check_substitution(gm, {B: 5}, (torch.randn(5, 4), torch.tensor([True, False, True, True, False])))

    gm = traced(lambda x, r: torch.repeat_interleave(x, r, dim=0), "x", "r")
    fxprop.propagate(gm, TensorSpec((5, 3)), TensorSpec((5,), dtype=torch.int64))
    assert output_shape(gm) == (U0, 3)
    info = gm.meta["fxprop"]["symbols"][U0]
    assert (info.lower, info.upper) == (0, sympy.oo)
    check_substitution(gm, {}, (torch.randn(5, 3), torch.tensor([0, 2, 1, 3, 0])))


def test_item_gives_an_unbounded_value_symbol_that_sizes_may_use():
    gm = traced(lambda r: r.new_zeros((r.sum().item(), 2)), "r")
    fxprop.propagate(gm, TensorSpec((5,), dtype=torch.int64))
    assert output_shape(gm) == (U0, 2)
    info = gm.meta["fxprop"]["symbols"][U0]
    assert (info.lower, info.upper, info.kind) == (-sympy.oo, sympy.oo, "value")
    assert sympy.Ge(U0, 0) in gm.meta["fxprop"]["assumptions"]  # zeros() needs a non-negative size
    check_substitution(gm, {}, (torch.tensor([1, 2, 0, 0, 4]),))

    # an aten-level item node
    gm = traced(lambda r: r.new_zeros((torch.ops.aten.item.default(r.sum()), 2)), "r")
    fxprop.propagate(gm, TensorSpec((5,), dtype=torch.int64))
    item = next(node for node in gm.graph.nodes if node.target is torch.ops.aten.item.default)
    assert shape_of(item) == U0
    assert output_shape(gm) == (U0, 2)
    check_substitution(gm, {}, (torch.tensor([1, 2, 0, 0, 4]),))


def test_data_dependent_sizes_flow_on_and_are_never_cached():
    gm = traced(lambda x: (x.nonzero() * 2).float().sum(1, keepdim=True).expand(-1, 3).sum(1), "x")
    first = fxprop.propagate(gm, torch.tensor([1, 0, 1]))
    second = fxprop.propagate(gm, torch.tensor([1, 0, 1]))
    assert output_shape(gm) == (U0,)
    assert first.fake_mode.shape_env is not second.fake_mode.shape_env
    check_substitution(gm, {}, (torch.tensor([1, 0, 1]),))
    for key, entry in list(fxprop.rule_cache._entries.items()):
        assert "SymInt" not in repr(entry.recipe) and "SymInt" not in repr(key)


def test_static_truths_are_kept_for_one_propagation_and_asked_again_once_the_shape_env_learns():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from fxprop.symbolic.session import SymbolicSession
    from fxprop.symbolic.sizes import static_truth
    env = ShapeEnv()
    n = env.create_unbacked_symint()
    session = SymbolicSession()
    session.adopt_env(env)
    with symbolic.scope(session):
        assert static_truth(env, sympy.Lt, n.node.expr, 10) is None
        assert static_truth(env, sympy.Eq, n.node.expr, n.node.expr + 1) is False
        torch._check(n < 10)  # the ShapeEnv learns a range: the open answer must not stay open
        assert static_truth(env, sympy.Lt, n.node.expr, 10) is True
        assert len(session.memos["static truths"]) == 2
    other = SymbolicSession()  # another propagation in the same ShapeEnv starts with none kept
    other.adopt_env(env)
    with symbolic.scope(other):
        assert not other.memos
        assert static_truth(env, sympy.Lt, n.node.expr, 10) is True


# --- item 4: assumptions and contradictions ----------------------------------------------

def test_view_and_head_split_record_divisibility():
    gm = traced(lambda x: x.view(-1, 4), "x")
    fxprop.propagate(gm, TensorSpec(("B", "T")))
    assert gm.meta["fxprop"]["assumptions"] == [sympy.Eq(sympy.Mod(B * T, 4), 0)]
    assert output_shape(gm) == (sympy.floor(B * T / 4), 4)
    for b, t in ((1, 4), (2, 6), (3, 4)):
        check_substitution(gm, {B: b, T: t}, (torch.randn(b, t),))


def test_broadcasting_assumes_only_what_broadcasting_needs():
    gm = traced(lambda x, y: x + y, "x", "y")
    fxprop.propagate(gm, TensorSpec(("B", 16)), TensorSpec(("C", 16)))
    assert gm.meta["fxprop"]["assumptions"] == [sympy.Eq(B, 1) | sympy.Eq(C, 1) | sympy.Eq(B, C)]
    assert output_shape(gm) == (sympy.Max(B, C), 16)
    for b, c in ((3, 3), (1, 4), (5, 1)):
        check_substitution(gm, {B: b, C: c}, (torch.randn(b, 16), torch.randn(c, 16)))

    gm = traced(lambda x, y: x * y, "x", "y")
    fxprop.propagate(gm, TensorSpec(("B",)), TensorSpec((3,)))
    assert gm.meta["fxprop"]["assumptions"] == [sympy.Eq(B, 1) | sympy.Eq(B, 3)]
    assert output_shape(gm) == (3,)
    for b in (1, 3):
        check_substitution(gm, {B: b}, (torch.randn(b), torch.randn(3)))

    gm = traced(lambda x, y: x + y, "x", "y")  # a literal 1 broadcasts without assuming anything
    fxprop.propagate(gm, TensorSpec(("B", 16)), TensorSpec((1, 16)))
    assert gm.meta["fxprop"]["assumptions"] == [] and output_shape(gm) == (B, 16)


def test_a_contradiction_names_the_node():
    gm = traced(lambda x, y, z: (x + y) + z, "x", "y", "z")
    with pytest.raises(PropagationError) as caught:
        fxprop.propagate(gm, TensorSpec(("B",)), TensorSpec((3,)), TensorSpec((4,)))
    assert caught.value.node_name == "add_1"

    gm = traced(lambda x, y, z: (x @ y, x @ z), "x", "y", "z")  # B == 3, then B == 4
    with pytest.raises(PropagationError, match="reduction dim") as caught:
        fxprop.propagate(gm, TensorSpec((2, "B")), TensorSpec((3, 4)), TensorSpec((4, 5)))
    assert caught.value.node_name == "matmul_1"


def test_a_contradiction_only_the_integers_show_names_the_node():
    """``view(-1, 2)`` of ``(B,)`` and of ``x[1:]`` need B even, then B odd: real execution refuses
    at every B, and so does fxprop, at the second view (torch's ranges leave the second fact open,
    and elimination alone combined away the rows that carry parity)."""
    def views(x):
        return x.view(-1, 2), x[1:].view(-1, 2)
    for b in range(1, 30):
        with pytest.raises(RuntimeError):
            views(torch.randn(b))
    gm = torch.fx.symbolic_trace(views)
    with pytest.raises(PropagationError, match="invalid for input of size") as caught:
        fxprop.propagate(gm, TensorSpec(("B",)))
    assert caught.value.node_name == "view_1"

    def consistent(x):  # B a multiple of 2 and of 3: of 6, which the views after it agree with
        return x.view(-1, 2), x.view(-1, 3), x.view(-1, 6)
    gm = torch.fx.symbolic_trace(consistent)
    fxprop.propagate(gm, TensorSpec(("B",)))
    for b in (6, 12, 30):
        check_substitution(gm, {B: b}, (torch.randn(b),))


def test_expressions_over_the_cap_raise_and_say_so(monkeypatch):
    monkeypatch.setattr(symbolic.session, "MAX_EXPR_OPS", 1)
    gm = torch.fx.symbolic_trace(torch.nn.Conv2d(3, 8, 3, stride=2))
    with pytest.raises(fxprop.UnsupportedError, match="MAX_EXPR_OPS"):
        fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))


# --- item 5: python size arithmetic -------------------------------------------------------

def test_python_size_arithmetic_flows_into_view_and_reshape():
    heads = 4
    gm = traced(lambda x: x.view(x.size(0) * 2, x.shape[-1] // heads, -1).reshape(x.size(0), -1), "x")
    fxprop.propagate(gm, TensorSpec(("B", "8*T")))
    mul = next(node for node in gm.graph.nodes if node.target is operator.mul)
    floordiv = next(node for node in gm.graph.nodes if node.target is operator.floordiv)
    assert shape_of(mul) == 2 * B and shape_of(floordiv) == 2 * T
    assert output_shape(gm) == (B, 8 * T)
    for b, t in ((1, 1), (3, 2)):
        check_substitution(gm, {B: b, T: t}, (torch.randn(b, 8 * t),))


# --- item 6: access ----------------------------------------------------------------------

def test_node_vals_are_fake_tensors_of_one_shape_env():
    gm = torch.fx.symbolic_trace(examples.MLP())
    fxprop.propagate(gm, TensorSpec(("B", 16)))
    fakes = [node.meta["val"] for node in gm.graph.nodes if isinstance(node.meta.get("val"), FakeTensor)]
    modes = {id(fake.fake_mode) for fake in fakes}
    assert len(modes) == 1 and fakes[0].fake_mode.shape_env is not None
    batch = fakes[0].shape[0]
    assert isinstance(batch, torch.SymInt) and all(fake.shape[0].node.expr == batch.node.expr
                                                   for fake in fakes if fake.dim() == 2)
    assert gm.meta["fxprop"]["assumptions"] == []


def test_concrete_graphs_have_empty_symbolic_summaries():
    gm = torch.fx.symbolic_trace(examples.MLP())
    fxprop.propagate(gm, TensorSpec((2, 16)))
    assert gm.meta["fxprop"]["symbols"] == {} and gm.meta["fxprop"]["assumptions"] == []
    assert all(isinstance(dim, int) for dim in output_shape(gm))


_lib = torch.library.Library("fxprop_symbolic_test", "DEF")
_lib.define("host_only(Tensor x) -> Tensor")
_lib.impl("host_only", lambda x: x.clone(), "CPU")


def test_an_op_with_no_symbolic_rule_names_the_op_and_the_input():
    gm = traced(lambda x: torch.ops.fxprop_symbolic_test.host_only(x), "x")
    with pytest.raises(fxprop.UnsupportedError, match=r"host_only.*no symbolic rule.*arg0 of shape \(B, 3\)"):
        fxprop.propagate(gm, TensorSpec(("B", 3)))
    fxprop.propagate(gm, TensorSpec((2, 3)))  # concrete inputs still fall back
    assert output_shape(gm) == (2, 3)


# --- item 7: relations torch's ranges leave open -------------------------------------------

def check_at_sizes(gm: torch.fx.GraphModule, shape: tuple, sizes: list) -> None:
    """At each size (a dict of dim names to ints): where the assumptions hold, every node's shape is
    the real one (`check_substitution`); where they do not, real execution refuses the input too."""
    for values in sizes:
        bindings = {symbolic.user_symbol(name): value for name, value in values.items()}
        real_input = torch.randn(*(values.get(dim, dim) for dim in shape))
        if all(bool(assumption.subs(bindings)) for assumption in gm.meta["fxprop"]["assumptions"]):
            check_substitution(gm, bindings, (real_input,))
        else:
            with pytest.raises(RuntimeError):
                real_values(gm, (real_input,))


def _convolutions_then(pool: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Conv2d(8, 16, 3), pool)


SIZES_2D = [{"H": h, "W": w} for h, w in ((5, 5), (6, 7), (7, 16), (16, 17), (17, 6), (2, 3), (3, 4))]
CEIL_MODE_POOLS = {
    "MaxPool2d": (torch.nn.MaxPool2d(3, 2, ceil_mode=True), (1, 3, "H", "W")),
    "MaxPool2d, padding, dilation": (torch.nn.MaxPool2d(3, 2, padding=1, dilation=2, ceil_mode=True), (1, 3, "H", "W")),
    "AvgPool2d": (torch.nn.AvgPool2d(3, 2, ceil_mode=True), (1, 3, "H", "W")),
    "AvgPool2d, padding": (torch.nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                           (1, 3, "H", "W")),
    "convolutions, MaxPool2d": (_convolutions_then(torch.nn.MaxPool2d(3, 2)), (1, 3, "H", "W")),
    "convolutions, MaxPool2d ceil_mode": (_convolutions_then(torch.nn.MaxPool2d(3, 2, ceil_mode=True)), (1, 3, "H", "W")),
    "convolutions, AvgPool2d ceil_mode": (_convolutions_then(torch.nn.AvgPool2d(3, 2, ceil_mode=True)), (1, 3, "H", "W")),
    "MaxPool1d with indices": (torch.nn.MaxPool1d(3, 2, ceil_mode=True, return_indices=True), (2, 3, "H")),
    "AvgPool1d": (torch.nn.AvgPool1d(3, 2, ceil_mode=True), (2, 3, "H")),
    "MaxPool3d": (torch.nn.MaxPool3d(3, 2, ceil_mode=True), (1, 2, "H", "W", 5)),
    "AvgPool3d": (torch.nn.AvgPool3d(3, 2, ceil_mode=True), (1, 2, "H", 4, "W")),
}


@pytest.mark.parametrize("name", CEIL_MODE_POOLS)
def test_ceil_mode_pooling_on_named_dims_decides_its_last_window_check(name):
    """ceil_mode's "the last window starts inside the input" check, ``2*floor(H/2) - 2 >= H`` for
    MaxPool2d(3, 2), is false for every integer H, though torch's ranges cannot tell."""
    model, shape = CEIL_MODE_POOLS[name]
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(model) if not isinstance(model, torch.nn.Sequential) else model)
    fxprop.propagate(gm, TensorSpec(shape))
    check_at_sizes(gm, shape, SIZES_2D)


def test_the_issues_max_pool_gives_floor_of_half_and_assumes_a_window_fits():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.MaxPool2d(3, 2, ceil_mode=True)))
    fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))
    assert output_shape(gm) == (1, 3, sympy.floor(H / 2), sympy.floor(W / 2))
    [fits] = gm.meta["fxprop"]["assumptions"]  # a window fits: H, W >= 2
    assert all(bool(fits.subs({H: h, W: w})) == (h >= 2 and w >= 2) for h in range(1, 5) for w in range(1, 5))


def test_a_relation_whose_truth_depends_on_the_size_stays_refused():
    pool = torch.nn.MaxPool2d(4, 3, padding=2, ceil_mode=True)  # the last window fits iff 3 divides H + 2
    relation = 3 * sympy.floor((H + 2) / 3) >= H + 2
    assert {bool(relation.subs(H, h)) for h in (4, 5)} == {True, False}
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(pool))
    with pytest.raises(fxprop.DataDependentError, match=r"decide whether 3\*floor\(H/3 \+ 2/3\) >= H \+ 2"):
        fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))


class _CropToDownsampled(torch.nn.Module):
    """A U-Net style crop: the skip input cut to the size of its downsampled self."""
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        y = self.down(x)
        return x[:, :, :y.shape[2], :y.shape[3]] * y


@torch.fx.wrap
def _assume_taller(x, y):
    torch._check(x.shape[2] >= y.shape[2] + 2)
    return x


class _CropToSmaller(torch.nn.Module):
    def __init__(self, taller: bool):
        super().__init__()
        self.taller = taller

    def forward(self, x, y):
        if self.taller:
            x = _assume_taller(x, y)
        return x[:, :, :y.shape[2]] * y


G = sympy.Symbol("G", integer=True, positive=True)


def test_a_crop_decides_its_bound_from_the_ranges_and_from_what_was_assumed_before():
    """Slicing to another size branches on ``end > size``: ``floor((H - 1)/2) + 1 > H`` is false
    for every H; ``G > H`` is false after the run assumed ``G + 2 <= H``, and open without it."""
    gm = torch.fx.symbolic_trace(_CropToDownsampled())
    fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))
    assert output_shape(gm) == (1, 3, sympy.floor((H - 1) / 2) + 1, sympy.floor((W - 1) / 2) + 1)
    check_at_sizes(gm, (1, 3, "H", "W"), SIZES_2D)

    gm = torch.fx.symbolic_trace(_CropToSmaller(taller=True))
    fxprop.propagate(gm, TensorSpec((1, 3, "H", 4)), TensorSpec((1, 3, "G", 4)))
    assert output_shape(gm) == (1, 3, G, 4) and gm.meta["fxprop"]["assumptions"] == [G + 2 <= H]
    for h, g in ((5, 3), (9, 2), (16, 14)):
        check_substitution(gm, {H: h, G: g}, (torch.randn(1, 3, h, 4), torch.randn(1, 3, g, 4)))

    gm = torch.fx.symbolic_trace(_CropToSmaller(taller=False))
    with pytest.raises(fxprop.DataDependentError, match="decide whether G > H"):
        fxprop.propagate(gm, TensorSpec((1, 3, "H", 4)), TensorSpec((1, 3, "G", 4)))


def test_an_exported_ceil_mode_pooling_chain_still_propagates():
    model = _convolutions_then(torch.nn.MaxPool2d(3, 2, ceil_mode=True))
    auto = torch.export.Dim.AUTO
    program = torch.export.export(model, (torch.randn(1, 3, 32, 32),), dynamic_shapes=({2: auto, 3: auto},))
    fxprop.propagate(program, TensorSpec((1, 3, "H", "W")))
    shape = shape_of(list(program.graph.nodes)[-2])
    for h, w in ((7, 7), (8, 16), (16, 17), (33, 9)):
        real = model(torch.randn(1, 3, h, w)).shape
        assert tuple(int(sympy.sympify(size).subs({H: h, W: w})) for size in shape) == tuple(real)


# --- item 8: layouts with symbolic sizes ----------------------------------------------------

def check_strides(gm: torch.fx.GraphModule, bindings: dict, inputs: tuple) -> None:
    """Every tensor node's symbolic strides, with ``bindings`` substituted, are the real ones where
    they address memory (a size-1 dim's stride addresses nothing)."""
    for node, value in real_values(gm, inputs).items():
        if not isinstance(value, torch.Tensor) or not value.numel():
            continue
        got = node.meta["val"]
        shape, stride = ([int(sympy.sympify(size).subs(bindings)) for size in symbolic.user_shape(sizes)]
                         for sizes in (got.shape, got.stride()))
        assert shape == list(value.shape), (node, shape, value.shape)
        assert [s for s, n in zip(stride, shape) if n != 1] == \
            [s for s, n in zip(value.stride(), value.shape) if n != 1], (node, stride, value.stride())


_NO_OP_LAYOUTS = {
    "expanded": lambda x: x.unsqueeze(1).expand(-1, 3, -1),
    "permuted": lambda x: x.unsqueeze(2).expand(-1, -1, 2).permute(2, 0, 1),
    "size-1 dims": lambda x: x.unsqueeze(0).unsqueeze(2),
    "sliced": lambda x: x[:, ::2],
}


class _NoOps(torch.nn.Module):
    """Ops that return their input, a view of it or a copy laid out like it, on a layout of ``x``."""
    def __init__(self, layout: str):
        super().__init__()
        self.layout = layout

    def forward(self, x):
        y = _NO_OP_LAYOUTS[self.layout](x)
        return (F.dropout(y, 0.1, training=False), F.dropout(y, 0.1, training=False).to(torch.float16),
                F.dropout(y, 0.0), y.clone(), torch.clone(y, memory_format=torch.preserve_format),
                torch.ops.aten.alias.default(y), y.contiguous(), y.to(torch.float32), y.type_as(x), y.detach())


@pytest.mark.parametrize("layout", _NO_OP_LAYOUTS)
def test_no_op_ops_and_views_keep_their_inputs_strides_with_symbolic_sizes(layout):
    """torch's python kernel of dropout (run under the python dispatcher, as with symbolic sizes)
    clones where ATen returns the input itself; an expanded input came out (96, 32, 1), not (32, 0, 1)."""
    model = _NoOps(layout)
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", 32)))
    program = torch.export.export(model, (torch.randn(4, 32),), dynamic_shapes=({0: torch.export.Dim("b")},))
    fxprop.propagate(program, TensorSpec(("B", 32)))
    for b in (2, 3, 5):
        check_strides(gm, {B: b}, (torch.randn(b, 32),))
        check_strides(program.graph_module, {B: b}, (torch.randn(b, 32),))



class _DropoutsInTraining(torch.nn.Module):
    def forward(self, x):
        kept = x[x > 0]  # a data-dependent count, 0 included
        return (F.dropout(x, 0.5, training=True), F.dropout(x.t(), 1.0, training=True),
                F.dropout(kept, 0.5, training=True) + 1, F.dropout(kept.unsqueeze(1).expand(-1, 3), 0.2))


def test_dropout_in_training_on_a_size_that_may_be_0_propagates_as_real_execution_runs():
    """ATen's composite of dropout asks, in training, whether its input is empty (then it returns the
    input, whose strides address nothing); on a named dim that may be 0, or a mask's count, that was
    refused as data-dependent, though every size gives the same shape, dtype and significant strides."""
    model = _DropoutsInTraining()
    N = sympy.Symbol("N", integer=True, nonnegative=True)
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec((N, 8)))
    for n, sign in ((0, 1), (3, 1), (5, -1), (6, 1)):
        x = sign * torch.randn(n, 8).abs()
        check_substitution(gm, {N: n}, (x,))
        bindings = {N: n, **{symbol: int((x > 0).sum()) for symbol, info in gm.meta["fxprop"]["symbols"].items()
                             if info.node is not None}}
        check_strides(gm, bindings, (x,))



def test_dropout_in_training_of_an_empty_input_with_symbolic_sizes_returns_the_input_as_real_execution():
    """ATen's composite returns an empty input itself in training; torch's python kernel, which
    symbolic sizes run, gave a fresh tensor of its own storage."""
    def dropouts(x):
        return F.dropout(x, 0.5, True), F.dropout(x.transpose(0, 2), 0.5, True)
    real_input = torch.randn(5, 0, 8)
    real = dropouts(real_input)
    gm = torch.fx.symbolic_trace(dropouts)
    ours = fxprop.propagate(gm, TensorSpec(("B", 0, 8)))
    ours_input = next(iter(gm.graph.nodes)).meta["val"]
    for value, real_value in zip(ours, real):
        assert real_value.untyped_storage()._cdata == real_input.untyped_storage()._cdata
        assert value.untyped_storage()._cdata == ours_input.untyped_storage()._cdata
    assert real[0] is real_input
    check_strides(gm, {B: 5}, (real_input,))


@pytest.mark.parametrize("pad", [(-2, 2, 2, -2), (-1, -1), (0, -3, 1, 1)], ids=str)
def test_negative_padding_of_named_dims_assumes_what_real_kernels_narrow_by(pad):
    """Real kernels narrow the input by each negative pad before anything else; torch's meta kernel,
    which symbolic sizes run, skipped that when another pad is positive: ``F.pad(x, (-2, 2, 2, -2))``
    of (1, 1, H, W) propagated with no assumption, though real execution refuses wherever W or H is
    below 2. The assumptions hold exactly where real execution runs, and the shape is then its."""
    def padded(x):
        return F.pad(x, pad)
    gm = torch.fx.symbolic_trace(padded)
    fxprop.propagate(gm, TensorSpec((1, 1, "H", "W")))
    assumptions = gm.meta["fxprop"]["assumptions"]
    assert assumptions
    for h in range(1, 6):
        for w in range(1, 6):
            holds = all(bool(assumption.subs({H: h, W: w})) for assumption in assumptions)
            try:
                padded(torch.randn(1, 1, h, w))
            except RuntimeError:
                assert not holds, (h, w, assumptions)
            else:
                assert holds, (h, w, assumptions)
                check_substitution(gm, {H: h, W: w}, (torch.randn(1, 1, h, w),))



_PADDED_LAYOUTS = {
    "transposed": lambda x: x.transpose(1, 2),   # mamba2's gradient of its padding to whole chunks
    "contiguous": lambda x: x.transpose(1, 2).contiguous(),
    "sliced": lambda x: x.transpose(1, 2)[:, :, ::2],
}


@pytest.mark.parametrize("layout", list(_PADDED_LAYOUTS), ids=str)
def test_a_padding_by_a_symbolic_amount_never_positive_is_laid_out_as_atens_kernel_clones_it(layout):
    """``-((4 - T % 4) % 4)`` is never positive and may be 0: ATen's kernel narrows the input by it
    and returns a clone, which keeps a dense input's strides and orders another's dims by its
    strides; torch's decomposition, which symbolic pads run, laid the result out contiguous. The
    strides are the real kernel's at every length tried, a padding by 0 included."""
    def padded(x):
        y = _PADDED_LAYOUTS[layout](x)
        return F.pad(y, (0, 0, 0, -((4 - y.shape[1] % 4) % 4)))
    gm = torch.fx.symbolic_trace(padded)
    fxprop.propagate(gm, TensorSpec((2, 8, "T")))
    for t in range(2, 12):
        x = torch.randn(2, 8, t)
        check_substitution(gm, {T: t}, (x,))
        check_strides(gm, {T: t}, (x,))


def test_decide_is_sound_on_the_padding_to_whole_windows_of_a_symbolic_size():
    """dynamo's swin graph pads ``H = s//4`` patches to whole windows by ``Mod(4 - Mod(H, 4), 4)``
    with ``s`` in [20, 35] and ``Mod(s, 4) == 0``: the pad is 3, 2, 1 or 0, so ``pad <= 0`` stays
    open; it is true only under the guard dynamo took at ``if pad_values[3] > 0 or ...``
    (transformers' modeling_swin), which the compiled program holds, and which leaves ``s = 32``.
    Then every decision of ``decide`` over such pads (moduli, ranges, facts) agrees with brute force."""
    from fxprop.symbolic.deciding import decide

    s = sympy.Symbol("s", integer=True, positive=True)

    def pad_of(step, window):
        return sympy.Mod(window - sympy.Mod(sympy.floor(s / step), window), window)

    def satisfied(facts, value):
        return all(bool(fact.subs(s, value)) for fact in facts)

    pad = pad_of(4, 4)
    divisible = sympy.Eq(sympy.Mod(s, 4), 0)
    in_range = lambda symbol: (20, 35)  # noqa: E731
    assert sorted({int(pad.subs(s, v)) for v in range(20, 36) if satisfied([divisible], v)}) == [0, 1, 2, 3]
    assert decide(pad <= 0, in_range, [divisible]) is None
    guarded = [divisible, pad <= 0]
    assert [v for v in range(20, 36) if satisfied(guarded, v)] == [32]
    assert decide(pad <= 0, in_range, guarded) is True and decide(sympy.Eq(pad, 0), in_range, guarded) is True
    assert decide(pad < 0, in_range, [divisible]) is False  # a Mod is never negative
    decided = 0
    for step, window in ((4, 4), (2, 3), (1, 4), (3, 2)):
        pad = pad_of(step, window)
        for lower, upper in ((1, 9), (20, 35), (8, 8), (16, 19)):
            for facts in ([], [sympy.Eq(sympy.Mod(s, step), 0)], [sympy.Eq(sympy.Mod(s, 4 * step), 0)], [pad <= 1]):
                values = [v for v in range(lower, upper + 1) if satisfied(facts, v)]
                for relation in (pad <= 0, pad < 0, sympy.Eq(pad, 0), pad >= 1, pad <= window - 2):
                    found = decide(relation, lambda symbol: (lower, upper), facts)
                    truths = {bool(relation.subs(s, v)) for v in values}
                    if found is not None:
                        decided += 1
                        assert truths <= {found}, (relation, lower, upper, facts, found, values)
    assert decided > 50


def test_adaptive_average_pooling_of_a_crop_that_may_be_empty_assumes_it_is_not():
    """The real kernels refuse an empty row or column, the meta kernel accepted one: the pool of
    ``x[:, :, 0:-1:3]`` (empty for H = 1) propagated with no assumption."""
    def pooled(x):
        return F.adaptive_avg_pool2d(x[:, :, 0:-1:3], (2, 3))
    gm = torch.fx.symbolic_trace(pooled)
    fxprop.propagate(gm, TensorSpec((1, 2, "H", "W")))
    assumptions = gm.meta["fxprop"]["assumptions"]
    for h in range(1, 6):
        holds = all(bool(assumption.subs({H: h, W: 4})) for assumption in assumptions)
        try:
            pooled(torch.randn(1, 2, h, 4))
        except RuntimeError:
            assert not holds, (h, assumptions)
        else:
            assert holds, (h, assumptions)
            check_substitution(gm, {H: h, W: 4}, (torch.randn(1, 2, h, 4),))


# --- the symbolic module ------------------------------------------------------------------

def test_resolve_definitely_equal_and_broadcast_shapes():
    assert symbolic.resolve(sympy.Ge(B, 1)) is True
    assert symbolic.resolve(sympy.Eq(B, 1)) is None and symbolic.resolve(sympy.Eq(B, 1), default=False) is False
    assert symbolic.definitely_equal(2 * B, B + B) and not symbolic.definitely_equal(B, C)
    assert symbolic.broadcast_shapes((B, 1), (1, 16)) == ((B, 16), [])
    shape, assumptions = symbolic.broadcast_shapes((B,), (3,))
    assert shape == (3,) and assumptions == [sympy.Eq(B, 1) | sympy.Eq(B, 3)]
    assert symbolic.broadcast_shapes((B,), (C,))[0] == (sympy.Max(B, C),)
    with pytest.raises(PropagationError, match="do not broadcast"):
        symbolic.broadcast_shapes((2,), (3,))


def test_repropagate_keeps_the_symbols():
    gm = torch.fx.symbolic_trace(examples.MLP())
    fxprop.propagate(gm, TensorSpec(("B", 16)))
    relu = next(node for node in gm.graph.nodes if node.op == "call_function")
    with gm.graph.inserting_after(relu):
        doubled = gm.graph.call_function(torch.cat, ([relu, relu],))
    relu.replace_all_uses_with(doubled, delete_user_cb=lambda user: user is not doubled)
    fxprop.repropagate(gm)
    assert shape_of(doubled) == (2 * B, 64) and output_shape(gm) == (2 * B, 10)
    gm.recompile()
    check_substitution(gm, {B: 3}, (torch.randn(3, 16),))


def test_concrete_graph_with_a_data_dependent_op_shares_one_fake_mode():
    gm = traced(lambda x, y: (x + 1, y.nonzero()), "x", "y")
    fxprop.propagate(gm, TensorSpec((2, 3)), torch.tensor([0, 1]))
    fakes = [node.meta["val"] for node in gm.graph.nodes if isinstance(node.meta.get("val"), FakeTensor)]
    assert len({id(fake.fake_mode) for fake in fakes}) == 1
    assert fakes[0].fake_mode.shape_env is not None


def test_item_of_a_real_input_is_its_value():
    gm = traced(lambda x, start: torch.narrow(x, 0, start, 2), "x", "start")
    fxprop.propagate(gm, torch.randn(5, 4), torch.tensor(1))
    assert output_shape(gm) == (2, 4) and gm.meta["fxprop"]["symbols"] == {}


def test_gpt_for_cuda_with_symbolic_sizes_on_a_cpu_only_host():
    """Attention's CUDA backend choice and the device table work on symbolic sizes too; the shapes
    are those of the CPU run, which the substitution test above checks against real execution."""
    model, _ = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model.to("meta"))
    out = fxprop.propagate(gm, TensorSpec(("B", "T"), dtype=torch.int64, device="cuda:0"), param_device="cuda:0")
    assert out.device == torch.device("cuda:0")
    assert output_shape(gm) == (B, T, model.config.vocab_size)
    tensors = [node.meta["val"] for node in gm.graph.nodes if isinstance(node.meta.get("val"), torch.Tensor)]
    assert tensors and all(t.device == torch.device("cuda:0") for t in tensors)
    assert any(node.meta["fxprop"].rule.endswith("scaled_dot_product_attention") for node in gm.graph.nodes)
    assert gm.meta["fxprop"]["assumptions"], "the position table's bound on T"


def test_a_view_in_a_symbolic_propagation_is_strided_as_atens_kernel_strides_it():
    """YOLOS's position-embedding resize: torch's python view gives the size-1 batch dim another
    stride than ATen's kernel, which made the bicubic upsample channels-last."""
    def resize(table, image):
        grid = table[:, 1:17].transpose(1, 2).view(1, 32, 4, 4)
        return torch.nn.functional.interpolate(grid, size=(image.shape[2] // 8, image.shape[3] // 8),
                                               mode="bicubic", align_corners=False)
    table = torch.randn(1, 21, 32)
    gm = torch.fx.symbolic_trace(resize)
    out = fxprop.propagate(gm, table, fxprop.TensorSpec(("B", 3, "H", "W")))
    view = next(n for n in gm.graph.nodes if n.target == "view")
    assert view.meta["val"].stride() == table[:, 1:17].transpose(1, 2).view(1, 32, 4, 4).stride()
    assert out.stride()[-1] == 1  # contiguous, as real execution lays it out


def test_pooling_after_a_chain_of_convolutions_with_named_dims():
    """The 4-d max pool's rank check asks for no element count, so the chain's sizes stay symbolic;
    the expression agrees with real execution at every size tried."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Conv2d(8, 16, 3),
                                torch.nn.MaxPool2d(3, 2))
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec((1, 3, "H", "W")))
    shape = shape_of(list(gm.graph.nodes)[-1])
    for h, w in ((12, 12), (13, 17), (20, 31)):
        real = model(torch.randn(1, 3, h, w)).shape
        sizes = {symbolic.user_symbol("H"): h, symbolic.user_symbol("W"): w}
        assert tuple(int(sympy.sympify(d).subs(sizes)) for d in shape) == tuple(real)


def test_decide_proves_and_refutes_over_the_integers_and_leaves_the_rest_open():
    from fxprop.symbolic.deciding import decide

    def positive(symbol):
        return 1, None
    floor, ceiling = sympy.floor, sympy.ceiling
    assert decide(2 * floor(H / 2) - 2 >= H, positive) is False
    assert decide(2 * floor(floor((H - 1) / 2) / 2 - sympy.Rational(3, 2)) >= floor((H - 1) / 2) - 1, positive) is False
    assert decide(2 * ceiling(H / 2) >= H, positive) is True and decide(sympy.Mod(H, 4) < 4, positive) is True
    assert decide(sympy.Max(1, H) >= H, positive) is True and decide(B * T >= 1, positive) is True
    assert decide(sympy.Eq(sympy.Mod(H, 2), 0), positive) is None and decide(B * T >= 2, positive) is None
    assert decide(floor((H - 3) / 2) >= 0, positive) is None
    assert decide(floor((H - 3) / 2) >= 0, positive, [floor((H - 1) / 2) >= 1]) is True  # a fact it follows from
    assert decide(sympy.Gt(G, H), positive, [sympy.And(G + 2 <= H, B > 1)]) is False
    assert decide(sympy.Eq(H, W), lambda symbol: (3, 3)) is True
    assert decide(H >= 2, positive, [H < 1]) is None  # contradictory facts decide nothing
    even = sympy.Eq(sympy.Mod(H, 2), 0)  # equalities are solved and substituted before elimination
    assert decide(sympy.Eq(sympy.Mod(H + 1, 2), 0), positive, [even]) is False
    assert decide(sympy.Eq(sympy.Mod(H, 3), 0), positive, [sympy.Eq(sympy.Mod(H, 6), 0)]) is True
    assert decide(sympy.Eq(sympy.Mod(3 * H, 2), 0), positive, [even]) is True
    assert decide(sympy.Eq(sympy.Mod(H, 4), 0), positive, [even]) is None
    assert decide(sympy.Symbol("x") > 0, positive) is None  # not an integer


@pytest.mark.parametrize("fn, needs", [
    (lambda x: x.nonzero().select(0, 0), sympy.Gt(U0, 0)),       # an index in range of u0 rows
    (lambda x: torch.cummax(x[x > 0], 0)[0], sympy.Ne(U0, 0)),    # the kernel's non-empty path
    (lambda x: x[x > 0].unsqueeze(1) * x[:3], None),  # (u0, 1) by (3,): broadcasting u0 against 1
], ids=["select-first-row", "cummax", "broadcast"])
def test_data_dependent_sizes_are_decided_size_obliviously_and_the_decision_is_assumed(fn, needs):
    """torch's rule for a data-dependent size: neither 0 nor 1, the path a real kernel takes for
    any larger size. The decision is an assumption; wherever it holds, real execution agrees."""
    gm = traced(fn, "x")
    fxprop.propagate(gm, TensorSpec((6,)))
    if needs is not None:
        assert needs in gm.meta["fxprop"]["assumptions"]
    for values in (torch.tensor([0., 1., 2., 0., 3., 0.]), torch.tensor([0., 0., 0., 0., 5., 0.]), torch.ones(6)):
        check_substitution(gm, {}, (values,))


def test_a_data_dependent_size_whose_answer_depends_on_its_value_stays_refused():
    gm = traced(lambda x: torch.tensor_split(x[x > 0], 2)[0], "x")  # (u0 + 1) // 2 rows: Mod(u0, 2) decides
    with pytest.raises(fxprop.DataDependentError):
        fxprop.propagate(gm, TensorSpec((6,)))




_RESHAPES = {
    "contiguous": lambda x: x.reshape(-1, 8),
    "transposed, dims kept": lambda x: torch.reshape(x.transpose(1, 2), (x.shape[0], 8, -1)),
    "strided, dims merged": lambda x: x[:, :, :4].reshape(x.shape[0] * x.shape[1], 4),
    "size-1 dims": lambda x: x[:, :1].reshape(1, x.shape[0], 1, 8),
    "no view: a copy": lambda x: x[:, 1:].reshape(-1, 8),
    "transposed, flattened: a copy": lambda x: x.transpose(0, 1).reshape(-1),
    "twice, the second a copy": lambda x: x.reshape(x.shape[0], x.shape[1], 2, 4).transpose(1, 2).reshape(x.shape[0], 2, -1),
}


@pytest.mark.parametrize("name", _RESHAPES)
@pytest.mark.parametrize("traced_by", ["dynamo", "export"])
def test_reshapes_of_symbolic_sizes_are_torchs_own(name, traced_by, monkeypatch):
    """The reshape rule's view (`fxprop.rules.reshaping`) is torch's reshape."""
    from fxprop.rules import reshaping
    _check_symbolic_rule(_RESHAPES[name], traced_by, monkeypatch, reshaping, "viewable_on_sight",
                         expected="a copy" not in name)


_WEIGHT, _BIAS = torch.randn(6, 8), torch.randn(6)
_LINEARS = {
    "flattened": lambda x: F.linear(x, _WEIGHT, _BIAS),
    "four dims": lambda x: F.linear(x.view(x.shape[0], x.shape[1], 2, 4).transpose(2, 3).contiguous(), _WEIGHT[:, :2], _BIAS),
    "one output": lambda x: F.linear(x, _WEIGHT[:1], _BIAS[:1]),
    "transposed input: not flattened": lambda x: F.linear(x.transpose(0, 1), _WEIGHT, _BIAS),
    "no bias: not flattened": lambda x: F.linear(x, _WEIGHT),
    "strided bias: not flattened": lambda x: F.linear(x, _WEIGHT, torch.randn(12)[::2]),
    "mixed dtypes: not flattened": lambda x: F.linear(x, _WEIGHT.double(), _BIAS.double()),
}


@pytest.mark.parametrize("name", _LINEARS)
@pytest.mark.parametrize("traced_by", ["dynamo", "export"])
def test_linears_of_symbolic_sizes_are_torchs_own(name, traced_by, monkeypatch):
    """The linear rule's flattened product (`fxprop.rules.linalg.linear`) is torch's linear."""
    from fxprop.rules import linalg
    _check_symbolic_rule(_LINEARS[name], traced_by, monkeypatch, linalg, "_flattens_on_sight",
                         expected="not flattened" not in name)


def _check_symbolic_rule(fn, traced_by, monkeypatch, module, decision, expected):
    """``fn`` of a (B, T, 8) input traced by dynamo (``dynamic=True``) or exported with Dims: the
    rule's answer where ``module.decision`` takes its own path (``expected``: whether the last call
    does) equals dynamo's own values (its ShapeEnv proves the expressions equal), real execution
    at the sizes' hints, the input viewed or copied as torch does, and torch's own answer (the
    decision switched off), or torch's refusal."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    decided = []
    decide = getattr(module, decision)
    monkeypatch.setattr(module, decision, lambda *args: decided.append(decide(*args)) or decided[-1])

    def same(a, b):
        return statically_known_true(a == b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b

    def hint(size):
        return size.node.hint if isinstance(size, torch.SymInt) else size

    def outcome(graph):
        output = next(node for node in graph.nodes if node.op == "output").args[0]
        value = (output[0] if isinstance(output, (tuple, list)) else output).meta["val"]
        source = next(node.meta["val"] for node in graph.nodes
                      if node.op == "placeholder" and isinstance(node.meta["val"], torch.Tensor))
        return value, value.untyped_storage()._cdata == source.untyped_storage()._cdata

    example = torch.randn(3, 5, 8)
    try:
        real = fn(example)
    except RuntimeError as refusal:
        real = refusal

    def propagated():
        if traced_by == "dynamo":
            found = []

            def backend(gm, example_inputs):
                try:
                    fxprop.propagate(gm, *example_inputs)
                except PropagationError as error:
                    found.append(error.error_type)
                    return gm.forward
                ours, viewed = outcome(gm.graph)
                theirs = next(node for node in gm.graph.nodes if node.op == "output").args[0][0].meta["example_value"]
                assert ours.dim() == theirs.dim() and all(map(same, ours.shape, theirs.shape)) and all(
                    same(a, b) for a, b, size in zip(ours.stride(), theirs.stride(), theirs.shape) if not same(size, 1))
                found.append((ours, viewed))
                return gm.forward

            torch._dynamo.reset()
            try:
                torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)(example)
            except RuntimeError:
                pass  # the compiled call refuses as the real one does
            return found[0]

        class Calling(torch.nn.Module):
            def forward(self, x):
                return fn(x)
        dims = {0: torch.export.Dim("B", min=2, max=64), 1: torch.export.Dim("T", min=3, max=64)}
        program = torch.export.export(Calling(), (example,), dynamic_shapes=(dims,))
        try:
            fxprop.propagate(program)
        except PropagationError as error:
            return error.error_type
        return outcome(program.graph)

    ours = propagated()
    assert (bool(decided) and decided[-1]) == expected
    if isinstance(real, Exception):
        assert ours is type(real)
    else:
        value, viewed = ours
        assert [hint(size) for size in value.shape] == list(real.shape) and viewed == (real._base is example)
        assert [hint(stride) for stride, size in zip(value.stride(), real.shape) if size > 1] == \
            [stride for stride, size in zip(real.stride(), real.shape) if size > 1]
    monkeypatch.setattr(module, decision, lambda *args: False)
    theirs = propagated()
    if isinstance(ours, tuple):
        (value, viewed), (their_value, their_viewed) = ours, theirs
        assert viewed == their_viewed and all(map(same, value.shape, their_value.shape)) and all(
            same(a, b) for a, b, size in zip(value.stride(), their_value.stride(), value.shape) if not same(size, 1))
    else:
        assert ours is theirs
