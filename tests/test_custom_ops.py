"""A torch.library op with no fake kernel falls back to real tensors; a registered rule removes the fallback."""
import pytest
import torch

import fxprop
from fxprop.testing import assert_matches_real

lib = torch.library.Library("fxprop_test", "DEF")
lib.define("pairwise_gap(Tensor x, int width) -> Tensor")
lib.define("window_sum(Tensor x, int width) -> Tensor")


def _pairwise_gap(x, width):
    return x[..., width:] - x[..., :-width]


lib.impl("pairwise_gap", _pairwise_gap, "CPU")
lib.impl("window_sum", _pairwise_gap, "CPU")


class UsesCustomOps(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fxprop_test.pairwise_gap(x, 2), torch.ops.fxprop_test.window_sum(x, 3)


def node_named(gm, prefix):
    return next(n for n in gm.graph.nodes if n.name.startswith(prefix))


def test_custom_op_without_fake_kernel_falls_back_and_matches_real():
    gm = torch.fx.symbolic_trace(UsesCustomOps())
    x = torch.randn(4, 10)
    rng = torch.get_rng_state()
    fxprop.propagate(gm, x)
    assert torch.equal(rng, torch.get_rng_state())
    assert_matches_real(gm, x)
    provenance = node_named(gm, "pairwise_gap").meta["fxprop"]
    assert provenance.kind == "fallback" and provenance.fallback_bytes > 0
    assert fxprop.lookup(torch.ops.fxprop_test.pairwise_gap.default).kind == "fallback"


def test_registered_rule_replaces_the_fallback():
    @fxprop.rule(torch.ops.fxprop_test.window_sum.default)
    def window_sum(x, width):
        return x.new_empty((*x.shape[:-1], x.shape[-1] - width))

    try:
        gm = torch.fx.symbolic_trace(UsesCustomOps())
        assert_matches_real(gm, torch.randn(4, 10))
        provenance = node_named(gm, "window_sum").meta["fxprop"]
        assert provenance.kind == "python" and provenance.fallback_bytes == 0
        assert fxprop.lookup(torch.ops.fxprop_test.window_sum.default).kind == "python"
    finally:
        fxprop.rules.unregister(torch.ops.fxprop_test.window_sum.default)


def test_registering_twice_names_the_target():
    @fxprop.rule(torch.ops.fxprop_test.window_sum.default)
    def first(x, width):
        return x

    try:
        import pytest
        with pytest.raises(fxprop.RuleRegistrationError, match="fxprop_test.window_sum.default"):
            fxprop.rule(torch.ops.fxprop_test.window_sum.default)(first)
    finally:
        fxprop.rules.unregister(torch.ops.fxprop_test.window_sum.default)


def test_fallback_cap_is_a_clear_error():
    gm = torch.fx.symbolic_trace(UsesCustomOps())
    import pytest
    with pytest.raises(fxprop.FallbackLimitError, match="fallback limit"):
        fxprop.propagate(gm, fxprop.TensorSpec((1000, 1000)), fallback_limit_bytes=1024)
    assert all("val" not in n.meta for n in gm.graph.nodes)


lib.define("spread_sum(Tensor x) -> Tensor")
lib.impl("spread_sum", lambda x: x.expand(256, *x.shape).clone().sum(0), "CPU")


@pytest.mark.parametrize("cache", [False, True])
def test_the_fallback_cap_counts_the_kernels_temporaries(cache):
    """A kernel that holds 256 copies of its input at once: 4 KiB in, 4 KiB out, 1 MiB between."""
    def spread_sum(x):
        return torch.ops.fxprop_test.spread_sum(x)

    gm = torch.fx.symbolic_trace(spread_sum)
    x = fxprop.TensorSpec((1024,))
    fxprop.propagate(gm, x, fallback_limit_bytes=2 << 20, cache=cache)
    used = node_named(gm, "spread_sum").meta["fxprop"].fallback_bytes
    assert 256 * 4096 <= used <= 2 << 20
    fresh = torch.fx.symbolic_trace(spread_sum)
    with pytest.raises(fxprop.FallbackLimitError, match="temporaries"):
        fxprop.propagate(fresh, x, fallback_limit_bytes=64 << 10, cache=cache)
    assert all("val" not in n.meta for n in fresh.graph.nodes)


def test_the_fallback_runs_under_the_users_own_profiler():
    """Where a profiler already runs, the kernel's temporaries cannot be read: inputs and outputs
    are still counted, and the user's profile keeps the call."""
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_test.spread_sum(x))
    with torch.autograd.profiler.profile() as profile:
        fxprop.propagate(gm, fxprop.TensorSpec((1024,)), cache=False)
    assert node_named(gm, "spread_sum").meta["fxprop"].fallback_bytes >= 2 * 4096
    assert any("spread_sum" in event.name for event in profile.function_events)


def test_a_result_measured_under_the_users_profiler_is_not_replayed_outside_it():
    """Adversary finding: a first run under a profiler cached only the outputs' bytes, so a later
    hit let the 1 MiB temporaries pass a cap an uncached run refuses."""
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_test.spread_sum(x))
    x = fxprop.TensorSpec((1024,))
    cache = fxprop.RuleCache(16)
    with torch.autograd.profiler.profile():
        fxprop.propagate(gm, x, cache=cache)
    for uses in (cache, False):
        with pytest.raises(fxprop.FallbackLimitError):
            fxprop.propagate(gm, x, fallback_limit_bytes=64 << 10, cache=uses)
    with torch.autograd.profiler.profile():  # and the measured figure is not replayed inside one
        for uses in (cache, False):
            fxprop.propagate(gm, x, fallback_limit_bytes=64 << 10, cache=uses)


lib.define("flat_view(Tensor(a) x) -> Tensor(a)")
lib.impl("flat_view", lambda x: x.view(-1), "CPU")


def test_a_view_the_fallback_returns_allocates_nothing():
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_test.flat_view(x))
    fxprop.propagate(gm, fxprop.TensorSpec((10, 100)), fallback_limit_bytes=6000, cache=False)
    assert node_named(gm, "flat_view").meta["fxprop"].fallback_bytes == 4000


lib.define("profiled_double(Tensor x) -> Tensor")


def _profiled_double(x):
    with torch.autograd.profiler.profile():
        return x * 2


lib.impl("profiled_double", _profiled_double, "CPU")


def test_a_kernel_that_runs_a_profiler_of_its_own_is_not_refused():
    """Adversary finding: the kernel's profiler could not start under the one that measures it,
    and its RuntimeError was reported as the model's."""
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_test.profiled_double(x))
    assert gm(torch.randn(4)).shape == (4,)
    assert fxprop.propagate(gm, fxprop.TensorSpec((4,)), cache=False).shape == (4,)


def test_lookup_order():
    aten = torch.ops.aten
    assert fxprop.lookup(aten.bmm.default).kind == "meta"
    assert fxprop.lookup(aten.convolution.default).kind == "python"
    assert fxprop.lookup("to").device_rule == "Tensor.to"


def test_a_library_op_with_only_a_cpu_kernel_is_refused_on_cuda_as_real_execution_refuses():
    lib = torch.library.Library("fxprop_cpu_only", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_cpu_only.twice(x))
    fxprop.propagate(gm, fxprop.TensorSpec((3,)))
    assert gm.graph.output_node().meta["val"].shape == (3,)
    with pytest.raises(fxprop.PropagationError, match="no kernel for cuda") as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((3,), device="cuda:0"))
    assert caught.value.error_type is NotImplementedError
    assert not isinstance(caught.value, fxprop.InternalError)


def test_a_fake_kernel_answers_only_where_a_real_kernel_exists():
    """A fake says what an op would return, not that it can run: real execution refuses on a
    device the op has no kernel for (here, a CPU kernel and a fake, on cuda:0)."""
    @torch.library.custom_op("fxprop_fake_and_cpu::double", mutates_args=(), device_types="cpu")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.register_fake
    def _(x):
        return torch.empty_like(x)

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_fake_and_cpu.double(x))
    assert_matches_real(gm, torch.randn(3))
    with pytest.raises(fxprop.PropagationError, match="no kernel for cuda") as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((3,), device="cuda:0"))
    assert caught.value.error_type is NotImplementedError
