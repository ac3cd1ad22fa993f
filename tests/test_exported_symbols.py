"""ExportedPrograms re-annotated by fxprop keep symbols torch accepts downstream.

Dynamic dims (``torch.export.Dim``) and named TensorSpec dims are backed symbols of the
program's ShapeEnv with a range in ``range_constraints``; data-dependent symbols carry the
``unbacked_bindings`` export writes. Every program here is propagated, then saved and loaded,
decomposed, and run with ``.module()`` on real inputs against eager.
"""
import io

import pytest
import sympy
import torch
import torch.nn as nn
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

import fxprop
from fxprop.torch_compat import pytree


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x).relu() * 2 + x[:, :4]


class NonZero(nn.Module):
    def forward(self, x):
        return x.nonzero() + 1, (x > 0).sum(0)


class ItemSlice(nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x[:k] * 2


def _dynamic(model, example, **dims):
    return torch.export.export(model, example, dynamic_shapes=dims)


def _placeholder_sizes(program) -> list:
    return [size for node in program.graph_module.graph.nodes if node.op == "placeholder"
            for size in node.meta["val"].shape if isinstance(size, torch.SymInt)]


def _check_symbols(program) -> None:
    """What save/load and run_decompositions read: input symbols backed and ranged, every
    unbacked symbol ranged and bound (once) where export binds it."""
    for size in _placeholder_sizes(program):
        assert isinstance(size.node.expr, sympy.Symbol) and not free_unbacked_symbols(size.node.expr)
        assert size.node.expr in program.range_constraints
    bound = {}
    for node in program.graph_module.graph.nodes:
        for symbol, path in node.meta.get("unbacked_bindings", {}).items():
            assert symbol not in bound, f"{symbol} bound at {bound.get(symbol)} and {node.name}"
            bound[symbol] = node.name
            found = pytree.key_get(node.meta["val"], path)
            assert found.node.expr == symbol if not isinstance(found, torch.SymBool) else True
            assert symbol in program.range_constraints
    used = set()
    for node in program.graph_module.graph.nodes:
        for leaf in pytree.tree_leaves(node.meta.get("val")):
            sizes = (*leaf.shape, *leaf.stride()) if isinstance(leaf, torch.Tensor) else (leaf,)
            for size in sizes:
                if isinstance(size, (torch.SymInt, torch.SymBool, torch.SymFloat)):
                    used |= size.node.expr.free_symbols
    assert {symbol for symbol in used if free_unbacked_symbols(symbol)} <= set(bound)
    assert used <= set(program.range_constraints)


def _outputs_equal(got, expected) -> None:
    got, expected = pytree.tree_leaves(got), pytree.tree_leaves(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def _round_trips(program, eager, *inputs) -> None:
    """save/load, run_decompositions and .module() all run ``inputs`` as eager does."""
    _check_symbols(program)
    with torch.no_grad():
        expected = eager(*inputs)
    _outputs_equal(program.module()(*inputs), expected)
    saved = io.BytesIO()
    torch.export.save(program, saved)
    saved.seek(0)
    loaded = torch.export.load(saved)
    _outputs_equal(loaded.module()(*inputs), expected)
    _outputs_equal(program.run_decompositions().module()(*inputs), expected)


def test_a_dynamic_dim_keeps_the_programs_symbol():
    model = Tiny()
    program = _dynamic(model, (torch.randn(3, 8),), x={0: torch.export.Dim("batch")})
    (symbol,) = program.range_constraints
    out = fxprop.propagate(program)
    assert out.shape[0].node.expr == symbol and out.shape[1] == 4
    assert set(program.range_constraints) == {symbol}
    _round_trips(program, model, torch.randn(5, 8))
    _round_trips(program, model, torch.randn(1, 8))


def test_a_named_dim_is_the_dynamic_dims_backed_symbol_in_the_users_name():
    model = Tiny()
    program = _dynamic(model, (torch.randn(3, 8),), x={0: torch.export.Dim("batch")})
    (symbol,) = program.range_constraints
    out = fxprop.propagate(program, fxprop.TensorSpec(("B", 8)))
    B = fxprop.symbolic.user_symbol("B")
    assert fxprop.symbolic.user_shape(out) == (B, 4)
    assert out.shape[0].node.expr == symbol  # the program's own s-symbol, not a fresh unbacked u0
    assert set(program.graph_module.meta["fxprop"]["symbols"]) == {B}
    _round_trips(program, model, torch.randn(6, 8))


def test_a_named_dim_of_a_static_program_is_a_new_backed_symbol_with_a_range():
    model = Tiny()
    program = torch.export.export(model, (torch.randn(3, 8),))
    assert not program.range_constraints
    out = fxprop.propagate(program, fxprop.TensorSpec(("B", 8)))
    assert fxprop.symbolic.user_shape(out) == (fxprop.symbolic.user_symbol("B"), 4)
    (symbol,) = program.range_constraints
    assert out.shape[0].node.expr == symbol and symbol.name.startswith("s")
    assert program.range_constraints[symbol].lower == 1  # B is a positive size, as declared
    _round_trips(program, model, torch.randn(7, 8))
    _round_trips(program, model, torch.randn(1, 8))


def test_the_exported_graph_alone_takes_named_dims_in_the_programs_symbols():
    model = Tiny()
    program = _dynamic(model, (torch.randn(3, 8),), x={0: torch.export.Dim("batch")})
    (symbol,) = program.range_constraints
    gm = program.graph_module
    state = [program.state_dict[spec.target] for spec in program.graph_signature.input_specs
             if spec.kind.name == "PARAMETER"]
    (out,) = fxprop.propagate(gm, *state, fxprop.TensorSpec(("B", 8)))
    assert out.shape[0].node.expr == symbol
    assert fxprop.shape_of(next(n for n in gm.graph.nodes if n.op == "output")) == \
        ((fxprop.symbolic.user_symbol("B"), 4),)


def test_a_concrete_input_specializes_the_program_consistently():
    model = Tiny()
    program = _dynamic(model, (torch.randn(3, 8),), x={0: torch.export.Dim("batch")})
    assert tuple(fxprop.propagate(program, torch.randn(6, 8)).shape) == (6, 4)
    assert not program.range_constraints  # no value uses the dynamic dim any more
    _round_trips(program, model, torch.randn(6, 8))


@pytest.mark.parametrize("spec", [False, True], ids=["own-inputs", "tensor-spec"])
def test_nonzero_binds_its_unbacked_size_like_export(spec):
    model = NonZero()
    x = torch.tensor([[1., 0.], [0., 2.], [3., 0.]])
    program = _dynamic(model, (x,), x={0: torch.export.Dim("batch")})
    fxprop.propagate(program, *([fxprop.TensorSpec(("B", 2))] if spec else []))
    nonzero = next(n for n in program.graph_module.graph.nodes if n.target == torch.ops.aten.nonzero.default)
    (symbol, path), = nonzero.meta["unbacked_bindings"].items()
    assert pytree.key_get(nonzero.meta["val"], path).node.expr == symbol and free_unbacked_symbols(symbol)
    fresh = program.graph_module.meta["fxprop"]["symbols"]
    assert [info.node for info in fresh.values() if info.kind == "size"] == ["nonzero"]
    _round_trips(program, model, torch.tensor([[0., 1.], [2., 0.], [0., 0.], [4., 5.]]))
    _round_trips(program, model, torch.zeros(2, 2))


@pytest.mark.parametrize("spec", [False, True], ids=["own-inputs", "tensor-spec"])
def test_an_item_slice_binds_its_value_like_export(spec):
    model = ItemSlice()
    program = _dynamic(model, (torch.randn(6, 3), torch.tensor(4)), x={0: torch.export.Dim("batch")}, n=None)
    inputs = (fxprop.TensorSpec(("B", 3)), fxprop.TensorSpec((), dtype=torch.int64)) if spec else ()
    out = fxprop.propagate(program, *inputs)
    item = next(n for n in program.graph_module.graph.nodes if n.target == torch.ops.aten.item.default)
    (symbol, path), = item.meta["unbacked_bindings"].items()
    assert path == () and item.meta["val"].node.expr == symbol
    assert fxprop.symbolic.user_shape(out)[1] == 3
    if spec:
        assert sympy.Le(sympy.Symbol("u0", integer=True), fxprop.symbolic.user_symbol("B")) in \
            program.graph_module.meta["fxprop"]["assumptions"]
    _round_trips(program, model, torch.randn(7, 3), torch.tensor(5))
    _round_trips(program, model, torch.randn(2, 3), torch.tensor(0))


def test_real_inputs_to_a_data_dependent_program_keep_it_decomposable():
    model = ItemSlice()
    program = _dynamic(model, (torch.randn(6, 3), torch.tensor(4)), x={0: torch.export.Dim("batch")}, n=None)
    assert tuple(fxprop.propagate(program, torch.randn(5, 3), torch.tensor(2)).shape) == (2, 3)
    assert all("unbacked_bindings" not in node.meta for node in program.graph_module.graph.nodes)
    _round_trips(program, model, torch.randn(5, 3), torch.tensor(3))


# --- a tiny Hugging Face Llama -----------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.LlamaForCausalLM(config).eval()

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).logits

    return Logits().eval()


def test_a_static_llama_round_trips(llama):
    ids = torch.randint(0, 64, (2, 8))
    program = torch.export.export(llama, (ids,))
    assert tuple(fxprop.propagate(program, ids).shape) == (2, 8, 64)
    _round_trips(program, llama, torch.randint(0, 64, (2, 8)))


@pytest.mark.parametrize("spec", [False, True], ids=["own-inputs", "tensor-spec"])
def test_a_llama_with_a_dynamic_sequence_round_trips(llama, spec):
    ids = torch.randint(0, 64, (2, 8))
    program = torch.export.export(llama, (ids,), dynamic_shapes={"ids": {1: torch.export.Dim("seq", min=2, max=64)}})
    (symbol,) = program.range_constraints
    out = fxprop.propagate(program, *([fxprop.TensorSpec((2, "T"), dtype=torch.int64)] if spec else []))
    assert out.shape[1].node.expr == symbol
    assert fxprop.symbolic.user_shape(out) == (2, fxprop.symbolic.user_symbol("T") if spec else symbol, 64)
    assert program.range_constraints[symbol].lower == 2 and program.range_constraints[symbol].upper == 64
    _round_trips(program, llama, torch.randint(0, 64, (2, 11)))
