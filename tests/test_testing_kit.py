"""fxprop.testing and the fxprop_check pytest fixture: they pass on correct rules and fail with a per-node diff."""
import pytest
import torch

import fxprop
from fxprop import TensorSpec
from fxprop.testing import assert_matches_real, call_graph, check_rule, significant_strides

lib = torch.library.Library("fxprop_kit", "DEF")
lib.define("transposed_copy(Tensor x) -> Tensor")
lib.define("shrink(Tensor x) -> Tensor")
lib.define("matrix_copy(Tensor x) -> Tensor")
lib.impl("transposed_copy", lambda x: x.t().clone(), "CPU")
lib.impl("shrink", lambda x: x[1:].clone(), "CPU")


def _matrix_copy(x):
    torch._check(x.dim() == 2, lambda: f"matrix_copy: expected a 2-d tensor, got {x.dim()}-d")
    return x.clone()


lib.impl("matrix_copy", _matrix_copy, "CPU")
aten, kit = torch.ops.aten, torch.ops.fxprop_kit

pytest_plugins = ["pytester"]


class UsesShrink(torch.nn.Module):
    def forward(self, x):
        return kit.shrink.default(torch.relu(x)) * 2


@pytest.fixture
def wrong_shrink_rule(fxprop_check):
    @fxprop_check.register_rule(kit.shrink.default)
    def shrink(x):
        return x.new_empty(x.shape)  # wrong on purpose: the real op drops the first row
    return shrink


def test_assert_matches_real_passes_on_a_model():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
    assert_matches_real(gm, TensorSpec((3, 4)))


def test_assert_matches_real_reports_each_wrong_node(wrong_shrink_rule):
    gm = torch.fx.symbolic_trace(UsesShrink())
    with pytest.raises(AssertionError) as caught:
        assert_matches_real(gm, torch.randn(5, 3))
    message = str(caught.value)
    assert "fxprop disagrees with real execution on 2 value(s)" in message
    assert "%shrink_default (fxprop_kit.shrink.default): shape expected (4, 3), got (5, 3)" in message
    assert "%mul (operator.mul): shape expected (4, 3), got (5, 3)" in message


def test_check_rule_on_aten_ops_callables_and_methods():
    out = check_rule(aten.cat.default, [TensorSpec((2, 3)), TensorSpec((4, 3))], 0)
    assert isinstance(out, torch._subclasses.FakeTensor) and tuple(out.shape) == (6, 3)
    assert tuple(check_rule(torch.add, torch.randn(2, 3), torch.randn(3), alpha=2).shape) == (2, 3)
    assert tuple(check_rule("view", torch.randn(2, 3), 6).shape) == (6,)
    values, indices = check_rule(torch.topk, torch.randn(4, 5), 2, dim=1)
    assert indices.dtype == torch.int64 and tuple(values.shape) == (4, 2)


def test_check_rule_checks_requires_grad_and_strides():
    out = check_rule(torch.mm, torch.randn(2, 3, requires_grad=True), torch.randn(3, 4))
    assert out.requires_grad
    check_rule(torch.Tensor.t, torch.randn(2, 3))  # a view: strides (1, 3) must match


def test_check_rule_fails_with_the_field_that_differs(wrong_shrink_rule):
    with pytest.raises(AssertionError, match=r"%op \(fxprop_kit.shrink.default\): shape expected \(1, 3\), got \(2, 3\)"):
        check_rule(kit.shrink.default, torch.randn(2, 3))


def test_check_rule_strides_can_be_left_out(fxprop_check):
    @fxprop_check.register_rule(kit.transposed_copy.default)
    def transposed_copy(x):
        return x.new_empty((x.shape[1], x.shape[0]))  # contiguous, where the real op keeps (1, n)

    with pytest.raises(AssertionError, match=r"stride expected \(1, 3\), got \(2, 1\)"):
        check_rule(kit.transposed_copy.default, torch.randn(2, 3))
    check_rule(kit.transposed_copy.default, torch.randn(2, 3), check_strides=False)


def test_check_rule_reraises_when_both_refuse():
    with pytest.raises(fxprop.PropagationError, match="mm"):
        check_rule(torch.mm, torch.randn(2, 3), torch.randn(4, 3))


def test_check_rule_fails_when_only_real_execution_raises(fxprop_check):
    @fxprop_check.register_rule(aten.bmm.default)
    def lenient_bmm(a, b):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    with pytest.raises(AssertionError, match="real execution raised RuntimeError.*but fxprop propagated"):
        check_rule(torch.bmm, torch.randn(2, 2, 3), torch.randn(2, 4, 3))


def test_call_graph_lifts_nested_tensors():
    gm, tensors = call_graph(torch.cat, ([torch.randn(1), torch.randn(2)],), {"dim": 0})
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "placeholder", "call_function", "output"]
    assert len(tensors) == 2


def test_significant_strides_ignore_size_one_and_empty():
    assert significant_strides((2, 1, 3), (3, 99, 1)) == (3, None, 1)
    assert significant_strides((0, 3), (3, 1)) is None


def test_fixture_rules_are_removed_after_the_test(fxprop_check):
    @fxprop_check.register_rule(kit.transposed_copy.default)
    def transposed_copy(x):
        return x.new_empty((x.shape[1], x.shape[0])).t().contiguous().t()

    assert fxprop.lookup(kit.transposed_copy.default).kind == "python"
    fxprop_check.close()
    assert fxprop.lookup(kit.transposed_copy.default).kind == "fallback"


def test_fixture_flags_fallback_nodes(fxprop_check):
    gm = torch.fx.symbolic_trace(UsesShrink())
    fxprop_check.assert_matches_real(gm, torch.randn(5, 3))
    with pytest.raises(AssertionError, match=r"1 node\(s\) needed the real-tensor fallback.*\n  %shrink"):
        fxprop_check.assert_no_fallback(gm)
    linear = torch.fx.symbolic_trace(torch.nn.Linear(3, 2))
    fxprop_check.assert_matches_real(linear, torch.randn(5, 3))
    fxprop_check.assert_no_fallback(linear)


def test_plugin_is_registered_through_its_entry_point(request):
    import fxprop.pytest_plugin
    assert request.config.pluginmanager.get_plugin("fxprop") is fxprop.pytest_plugin


def test_a_backend_suite_gets_the_fixture(pytester):
    pytester.makepyfile(test_backend="""
        import torch
        from fxprop import TensorSpec

        def test_lowered_graph(fxprop_check):
            gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 2))
            fxprop_check.assert_matches_real(gm, TensorSpec((3, 4)))
            fxprop_check.assert_no_fallback(gm)

        def test_one_op(fxprop_check):
            fxprop_check.check_rule(torch.ops.aten.mm.default, torch.randn(2, 3), torch.randn(3, 4))
    """)
    pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_meta_devices_not_asked_for_finds_a_leak_and_respects_what_the_user_asked():
    from fxprop.testing import meta_devices_not_asked_for
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    fxprop.propagate(gm, fxprop.TensorSpec((2,), device="cuda:0"))
    assert meta_devices_not_asked_for(gm) == []
    add = next(n for n in gm.graph.nodes if n.op == "call_function")
    add.meta["val"] = torch.empty(2, device="meta")  # what the x.device.type bug produced
    assert meta_devices_not_asked_for(gm) == ["add"]
    fxprop.propagate(gm, torch.empty(2, device="meta"))  # the user's own meta tensor
    assert meta_devices_not_asked_for(gm) == []


def test_layouts_are_compared():
    from fxprop.testing import compare_values, observe
    sparse = torch.randn(2, 3).to_sparse()
    mismatches = compare_values(torch.empty(2, 3), observe(sparse), node="n", op="op")
    assert [mismatch.field for mismatch in mismatches] == ["layout"]


def test_a_sparse_result_is_refused_not_answered_strided():
    """``to_sparse`` runs on the host (no meta kernel), and its sparse COO result is not one fxprop
    can carry: the node is unsupported, where a strided answer would be wrong."""
    gm = torch.fx.symbolic_trace(lambda x: x.to_sparse().to_dense())
    with pytest.raises(fxprop.UnsupportedError, match="layout torch.sparse_coo"):
        fxprop.propagate(gm, torch.randn(4, 8))
