"""What the user hands fxprop is never run as code, never shared, never altered; what comes back
is what real execution gives."""
import threading

import pytest
import torch

import fxprop
from fxprop.testing import check_rule


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch {marker}')",
    "B.__class__",
    "exec('open(\"{marker}\", \"w\")')",
    "(lambda: 1)()",
    "B if True else 2",
    "[B][0]",
    "B**1000000000",
    "1.5",
    "B" * 300,
])
def test_a_dim_string_is_parsed_never_evaluated(text, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(fxprop.InputError, match="not a size expression"):
        fxprop.TensorSpec((text.format(marker=marker), 3))
    assert not marker.exists()


@pytest.mark.parametrize("text,at_4", [("B", 4), ("2*B+1", 9), ("B//3", 1), ("B % 3", 1), ("(B-1)**2", 9)])
def test_a_dim_string_is_a_size_expression(text, at_4):
    import sympy
    gm = torch.fx.symbolic_trace(lambda x: x.reshape(-1))
    fxprop.propagate(gm, fxprop.TensorSpec((text, 2)))
    (size,) = fxprop.shape_of(next(n for n in gm.graph.nodes if n.op == "call_method"))
    assert sympy.sympify(size).subs(sympy.Symbol("B", integer=True, positive=True), 4) == 2 * at_4


def test_a_non_leaf_input_that_requires_grad_stays_a_non_leaf():
    gm = torch.fx.symbolic_trace(torch.nn.ReLU(inplace=True))
    non_leaf = torch.randn(3, 4, requires_grad=True) * 2
    out = fxprop.propagate(gm, non_leaf)
    assert out.requires_grad and tuple(out.shape) == (3, 4)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, torch.randn(3, 4, requires_grad=True))  # a leaf: real execution refuses
    assert caught.value.error_type is RuntimeError
    strided = (torch.randn(4, 6, requires_grad=True) + 0)[:, 1::2]
    assert fxprop.propagate(gm, strided).stride() == strided.stride()


def test_propagating_leaves_another_threads_random_numbers_alone():
    """A seeded thread draws what it would draw alone while another thread propagates."""
    gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.dropout(x + torch.randn(x.shape), 0.5))
    expected = []
    torch.manual_seed(7)
    expected = [torch.rand(()).item() for _ in range(200)]
    drawn, stop = [], threading.Event()

    def propagate_forever():
        while not stop.is_set():
            fxprop.propagate(gm, fxprop.TensorSpec((8, 8)), cache=False)

    worker = threading.Thread(target=propagate_forever)
    worker.start()
    try:
        torch.manual_seed(7)
        drawn = [torch.rand(()).item() for _ in range(200)]
    finally:
        stop.set()
        worker.join()
    assert drawn == expected


def test_a_rule_is_found_for_a_function_torch_rewraps_at_run_time():
    """Importing torch._dynamo replaces torch.manual_seed with a wrapper; its rule still applies."""
    import importlib
    importlib.import_module("torch._dynamo")
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    gm.graph.inserting_before(next(iter(gm.graph.nodes)).next)
    with gm.graph.inserting_after(next(iter(gm.graph.nodes))):
        gm.graph.call_function(torch.manual_seed, (123,))
    gm.recompile()
    state = torch.get_rng_state()
    fxprop.propagate(gm, fxprop.TensorSpec((2,)))
    assert torch.equal(state, torch.get_rng_state())
    assert next(n for n in gm.graph.nodes if n.target is torch.manual_seed).meta["fxprop"].kind == "python"


def test_an_index_whose_values_are_known_is_checked_like_real_execution():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.index_select, torch.randn(3, 4), 0, torch.tensor([0, 3]))
    assert caught.value.error_type is IndexError
    check_rule(torch.index_select, torch.randn(3, 4), 0, torch.tensor([0, 2]))
