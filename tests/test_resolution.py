"""One resolution: what `propagate` records is what `fxprop.lookup` says for the same call,
and fxprop's own failures are never reported as the model's."""
import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop import examples
from fxprop.testing import check_rule

aten = torch.ops.aten


def _values(argument):
    return torch.fx.node.map_arg(argument, lambda node: node.meta["val"])


def lookup_for(gm: torch.fx.GraphModule, node: torch.fx.Node) -> fxprop.Rule:
    args, kwargs = _values(node.args), _values(node.kwargs)
    if node.op == "call_module":
        return fxprop.lookup(gm.get_submodule(node.target), *args, **kwargs)
    return fxprop.lookup(node.target, *args, **kwargs)


def assert_provenance_agrees_with_lookup(gm: torch.fx.GraphModule) -> int:
    checked = 0
    for node in gm.graph.nodes:
        if not node.op.startswith("call") or isinstance(gm.get_submodule(node.target) if node.op == "call_module"
                                                        else None, torch.fx.GraphModule):
            continue
        provenance = node.meta["fxprop"]
        rule = lookup_for(gm, node)
        assert (rule.kind, rule.name, rule.device_rule) == (provenance.kind, provenance.rule, provenance.device_rule), (
            f"%{node.name}: propagate recorded {provenance}, lookup says {rule}")
        checked += 1
    return checked


def _graphs():
    for name, make in [("mlp", examples.mlp_example), ("cnn", examples.cnn_example),
                       ("gpt", examples.gpt_example), ("lstm", examples.lstm_example)]:
        yield f"{name}-fx", make, "fx"
        yield f"{name}-export", make, "export"
    yield "gpt-make_fx", examples.gpt_example, "make_fx"


@pytest.mark.parametrize("label,make,trace", list(_graphs()), ids=[g[0] for g in _graphs()])
def test_provenance_is_what_lookup_says_on_every_node(label, make, trace):
    model, inputs = make()
    model.eval()
    if trace == "fx":
        gm = torch.fx.symbolic_trace(model)
    elif trace == "export":
        gm = torch.export.export(model, tuple(inputs)).module()
    else:
        from torch.fx.experimental.proxy_tensor import make_fx
        gm = make_fx(model)(*inputs)
    with torch.no_grad():  # the values written are leaves; an in-place module on a leaf that requires grad refuses
        fxprop.propagate(gm, *inputs, cache=False)
        assert assert_provenance_agrees_with_lookup(gm) > 0


def test_lookup_and_propagate_agree_on_calls_whose_rule_depends_on_the_values():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    mask = graph.placeholder("mask")
    moved = graph.call_method("to", (x, "cuda:0"))
    graph.output((graph.call_function(aten.nonzero.default, (mask,)),
                  graph.call_function(aten.index.Tensor, (x, [mask])),
                  graph.call_method("get_device", (moved,)),
                  graph.call_function(torch.add, (moved, 1))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fxprop.propagate(gm, fxprop.TensorSpec((4, 3)), fxprop.TensorSpec((4,), dtype=torch.bool))
    assert assert_provenance_agrees_with_lookup(gm) == 5
    kinds = {node.name: node.meta["fxprop"].kind for node in gm.graph.nodes}
    assert kinds["get_device"] == "device" and kinds["x"] == "plain" and kinds["add"] == "meta"


def test_a_python_rule_runs_once_per_aten_node():
    calls = []
    rule = fxprop.lookup(aten.mm.default)
    original = rule.fn

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    fxprop.unregister(aten.mm.default)
    try:
        fxprop.rule(aten.mm.default, name=rule.name)(counting)
        gm = torch.fx.symbolic_trace(lambda a, b: aten.mm.default(a, b))
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), fxprop.TensorSpec((3, 4)), cache=False)
    finally:
        fxprop.unregister(aten.mm.default)
        fxprop.rule(aten.mm.default, name=rule.name)(original)
    assert len(calls) == 1


@pytest.fixture
def broken_mm():
    """aten.mm's rule replaced by one with a bug of its own."""
    rule = fxprop.lookup(aten.mm.default)
    fxprop.unregister(aten.mm.default)

    def mm_with_a_bug(a, b):
        return a.no_such_attribute

    fxprop.rule(aten.mm.default)(mm_with_a_bug)
    yield
    fxprop.unregister(aten.mm.default)
    fxprop.rule(aten.mm.default, name=rule.name)(rule.fn)


def test_a_broken_rule_is_fxprops_failure_not_the_models(broken_mm):
    gm = torch.fx.symbolic_trace(lambda a, b: torch.mm(a, b))
    with pytest.raises(fxprop.InternalError) as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), fxprop.TensorSpec((3, 4)))
    assert not isinstance(caught.value, fxprop.PropagationError)
    text = str(caught.value)
    assert "%mm" in text and "mm_with_a_bug" in text and "fxprop's failure, not the model's" in text
    assert isinstance(caught.value.__cause__, AttributeError)
    assert all("fxprop" not in node.meta for node in gm.graph.nodes)


def test_check_rule_fails_on_a_broken_rule_even_where_real_execution_refuses(broken_mm):
    with pytest.raises(AssertionError, match="fxprop failed on its own|fxprop raised"):
        check_rule(aten.mm.default, fxprop.TensorSpec((2, 3)), fxprop.TensorSpec((3, 4)))
    with pytest.raises(AssertionError, match="fxprop failed on its own"):
        check_rule(aten.mm.default, fxprop.TensorSpec((2, 3)), fxprop.TensorSpec((5, 4)))  # real raises too


def test_a_refusal_of_another_type_is_not_a_correct_refusal():
    rule = fxprop.lookup(aten.index_select.default)
    fxprop.unregister(aten.index_select.default)
    fxprop.rule(aten.index_select.default)(lambda x, dim, index: torch._check(False, lambda: "wrong"))
    try:
        with pytest.raises(AssertionError, match="refused with"):
            check_rule(aten.index_select.default, torch.randn(3, 4), 0, torch.tensor([7]))
    finally:
        fxprop.unregister(aten.index_select.default)
        fxprop.rule(aten.index_select.default, name=rule.name)(rule.fn)


def test_the_opinfo_judge_counts_only_the_same_refusal():
    from fxprop.conformance import MATCH, _judge
    real = IndexError("index 7 is out of bounds")
    same = fxprop.PropagationError("index out of range", error_type=IndexError)
    other = fxprop.PropagationError("index out of range", error_type=RuntimeError)
    assert _judge(("error", same), None, real, True) == MATCH
    assert _judge(("error", other), None, real, True).category == "wrong-error"
    assert _judge(("error", fxprop.InternalError("a bug")), None, real, True).category == "wrong-error"
    assert _judge(("error", fxprop.UnsupportedError("no rule")), None, real, True).category == "wrong-error"
    assert _judge(("error", RuntimeError("x")), None, real, False).category == "wrong-error"
    assert _judge(("error", IndexError("x")), None, real, False) == MATCH


def test_a_model_error_keeps_torchs_exception_type():
    gm = torch.fx.symbolic_trace(lambda x, i: torch.index_select(x, 0, i))
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.index_select, torch.randn(3, 4), 0, torch.tensor([7]))
    assert caught.value.error_type is IndexError
    del gm


def test_a_model_error_from_a_composite_keeps_its_type():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(F.linear, torch.randn(2, 3), torch.randn(4, 5))
    assert caught.value.error_type is RuntimeError


@pytest.mark.parametrize("name", ["llama", "mixtral", "t5", "swin"])
def test_provenance_is_what_lookup_says_on_corpus_models(name):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from corpus import harness, models
    model, inputs = models.build(name)
    gm = harness.export(model, inputs).module()
    with torch.no_grad():
        fxprop.propagate(gm, *inputs.values(), cache=False)
        assert assert_provenance_agrees_with_lookup(gm) > 50


def test_provenance_is_what_lookup_says_on_the_fuzz_slice():
    from hypothesis import HealthCheck, given, settings
    from test_fuzz import graphs
    checked = []

    @settings(max_examples=60, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(graphs())
    def agree(case):
        gm, recipes = case
        try:
            with torch.no_grad():
                fxprop.propagate(gm, *[recipe.for_fxprop() for recipe in recipes], cache=False)
        except fxprop.FxpropError:
            return  # refused graphs record nothing
        checked.append(assert_provenance_agrees_with_lookup(gm))

    agree()
    assert sum(checked) > 100
