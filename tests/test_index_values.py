"""Index values known from arange: checked like real execution with concrete sizes, assumed with
symbolic sizes (fxprop/aten/index_values.py)."""
from __future__ import annotations

import operator

import pytest
import sympy
import torch
import torch.nn.functional as F

import fxprop
from fxprop import TensorSpec, examples


class Indexing(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.table = torch.nn.Embedding(8, 3)

    def forward(self, x):
        return self.fn(self, x)


CASES = {
    "embedding module of arange(n)": lambda m, x: m.table(torch.arange(x.size(0))),
    "embedding of arange(start, end)": lambda m, x: m.table(torch.arange(2, x.size(0) + 2)),
    "embedding of a stepped arange": lambda m, x: m.table(torch.arange(0, x.size(0), 3)),
    "embedding of a descending arange": lambda m, x: m.table(torch.arange(x.size(0) - 1, -1, -1)),
    "embedding of arange shifted by a number": lambda m, x: m.table(torch.arange(x.size(0)) + 1),
    "embedding of number + arange": lambda m, x: m.table(1 + torch.arange(x.size(0))),
    "embedding of arange minus a number": lambda m, x: m.table(torch.arange(x.size(0)) - 1),
    "F.embedding of an unsqueezed arange": lambda m, x: F.embedding(torch.arange(x.size(0)).unsqueeze(0),
                                                                   m.table.weight),
    "index_select of arange": lambda m, x: torch.index_select(m.table.weight, 0, torch.arange(x.size(0))),
    "index_select along dim 1": lambda m, x: m.table.weight.index_select(1, torch.arange(x.size(0))),
    "indexing with arange (negative indices allowed)": lambda m, x: m.table.weight[torch.arange(-x.size(0), 0)],
    "indexing with a viewed arange": lambda m, x: m.table.weight[torch.arange(x.size(0)).view(-1, 1)],
    "indexing the last dim after an Ellipsis": lambda m, x: m.table.weight[..., torch.arange(x.size(0))],
    "indexing dim 1 after a slice": lambda m, x: m.table.weight[:, torch.arange(x.size(0))],
    "indexing after None": lambda m, x: m.table.weight[None, torch.arange(x.size(0))],
    "embedding of an empty arange, shifted below 0 (campaign seed 1796225519)": lambda m, x: m.table(torch.arange(x.size(0) // 20) - 1),
    "indexing with an empty slice of arange": lambda m, x: m.table.weight[torch.arange(x.size(0))[x.size(0):]],
    "indexing two dims": lambda m, x: m.table.weight[torch.arange(x.size(0)), torch.arange(x.size(0)) - 6],
}


@pytest.mark.parametrize("length", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_index_values_raise_where_real_execution_raises(case, length):
    gm = torch.fx.symbolic_trace(Indexing(CASES[case]))
    x = torch.zeros(length)
    try:
        gm(x)
    except (IndexError, RuntimeError):
        with pytest.raises(fxprop.PropagationError, match="index out of range") as caught:
            fxprop.propagate(gm, x)
        assert "fxprop" not in next(iter(gm.graph.nodes)).meta
        return
    fxprop.propagate(gm, x)


@pytest.mark.parametrize("shape, raises", [((3, 0), False), ((0, 3), True), ((2, 3), True), ((5, 3), False)])
def test_indexing_an_empty_tensor_checks_only_an_empty_indexed_dim(shape, raises):
    """Finding (campaign seed 1796226183): ``x[arange(4)]`` of a (3, 0) tensor gathers nothing and
    checks nothing on the CPU."""
    graph = torch.fx.Graph()
    source = graph.placeholder("x")
    graph.output(graph.call_function(operator.getitem, (source, graph.call_function(torch.arange, (4,)))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x = torch.zeros(shape)
    if raises:
        with pytest.raises(IndexError):
            gm(x)
        with pytest.raises(fxprop.PropagationError, match="index out of range"):
            fxprop.propagate(gm, x)
    else:
        gm(x)
        fxprop.propagate(gm, x)


UNTRACKED = {
    "a narrowing cast wraps values around": lambda m, x: m.table(
        torch.arange(x.size(0) + 256).to(torch.uint8)[256:].long()),
    "a view as another dtype reinterprets the values": lambda m, x: m.table(
        torch.arange(x.size(0) + 4).view(torch.int32)[1::2].long()),
    "written in place after it was made": lambda m, x: m.table(torch.arange(x.size(0) + 4).clamp_(max=7)),
    "a view of it written in place": lambda m, x: m.table(_clamped_through_a_view(torch.arange(x.size(0) + 4))),
}


def _clamped_through_a_view(positions):
    positions.view(-1)[1:].clamp_(max=7)
    return positions


@pytest.mark.parametrize("length", [3, 6, 8])
@pytest.mark.parametrize("case", list(UNTRACKED), ids=list(UNTRACKED))
def test_values_changed_beyond_arange_bounds_are_not_held_to_them(case, length):
    """Real execution succeeds here (every index is below 8), though arange's own values are not."""
    gm = torch.fx.symbolic_trace(Indexing(UNTRACKED[case]))
    x = torch.zeros(length)
    gm(x)
    fxprop.propagate(gm, x)


def test_a_gpt_with_symbolic_length_assumes_its_positions_fit_the_position_table():
    model, _ = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, TensorSpec(("B", "T"), dtype=torch.int64))
    T = sympy.Symbol("T", integer=True, positive=True)
    block = model.config.block_size
    [assumption] = [a for a in gm.meta["fxprop"]["assumptions"] if a.free_symbols == {T}]
    assert assumption.subs(T, block) and not assumption.subs(T, block + 1)
    with pytest.raises(IndexError):
        model(torch.zeros(1, block + 1, dtype=torch.int64))


def test_a_gpt_longer_than_its_position_table_fails_at_the_position_embedding():
    model, _ = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    with pytest.raises(fxprop.PropagationError, match="index out of range") as caught:
        fxprop.propagate(gm, TensorSpec((1, model.config.block_size + 1), dtype=torch.int64))
    assert caught.value.node_name == "wpe"


def test_a_symbolic_length_that_contradicts_the_table_is_refused():
    gm = torch.fx.symbolic_trace(Indexing(CASES["embedding module of arange(n)"]))
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(gm, TensorSpec(("N + 8",)))



def test_an_embedding_of_an_empty_table_refuses_as_index_select_does():
    """Campaign finding: real execution refuses with index_select's RuntimeError (an empty dim),
    before any index is checked against it."""
    graph = torch.fx.Graph()
    weight = graph.placeholder("weight")
    graph.output(graph.call_function(F.embedding, (graph.call_function(torch.arange, (1,)), weight)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(RuntimeError, match="should be positive"):
        gm(torch.randn(0, 1))
    with pytest.raises(fxprop.PropagationError, match="should be positive") as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((0, 1)))
    assert caught.value.error_type is RuntimeError
