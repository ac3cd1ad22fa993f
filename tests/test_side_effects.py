"""propagate has no side effects: the module, the inputs, the RNG and the graph stay as they were.

`fxprop.testing.assert_no_side_effects` is the check; `assert_matches_real` applies it to
every model test, tests/test_models.py to every direct propagate call, and tests/test_fuzz.py
to every fuzzed graph. Here it is first shown to catch each kind of side effect, then applied
to the graphs most likely to cause one: in-place ops on inputs and parameters, training-mode
BatchNorm and dropout, random factories, grad-mode and requires_grad toggles.
"""
import collections
import copy
import dataclasses
import types

import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop import examples
from fxprop.testing import assert_no_side_effects


def model_with_state():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    gm = torch.fx.symbolic_trace(model)
    gm.extra = torch.arange(3.0)
    return gm


SIDE_EFFECTS = {
    "a parameter written in place": lambda gm, x: gm.get_parameter("0.weight").data.add_(1),
    "a parameter replaced": lambda gm, x: setattr(gm.get_submodule("0"), "bias", torch.nn.Parameter(torch.zeros(3))),
    "a buffer's version counter": lambda gm, x: gm.get_buffer("1.running_mean").mul_(1),
    "a tensor constant": lambda gm, x: gm.extra.fill_(7),
    "an input written in place": lambda gm, x: x.data.mul_(2),
    "an input's requires_grad": lambda gm, x: x.requires_grad_(False),
    "a parameter's requires_grad": lambda gm, x: gm.get_parameter("0.weight").requires_grad_(False),
    "a gradient attached to an input": lambda gm, x: setattr(x, "grad", torch.ones_like(x)),
    "the CPU RNG": lambda gm, x: torch.rand(1),
    "grad mode": lambda gm, x: torch.set_grad_enabled(False),
    "the graph's code": lambda gm, x: (gm.graph.call_function(torch.relu, (next(iter(gm.graph.nodes)),)),
                                       gm.recompile()),
}


@pytest.mark.parametrize("name", SIDE_EFFECTS)
def test_each_side_effect_is_caught(name):
    gm = model_with_state()
    x = torch.randn(4, 3, requires_grad=True)
    grad_mode = torch.is_grad_enabled()
    try:
        with pytest.raises(AssertionError, match="side effects"):
            with assert_no_side_effects(gm, x):
                SIDE_EFFECTS[name](gm, x)
    finally:
        torch.set_grad_enabled(grad_mode)


def test_nan_payloads_and_negative_zero_count_as_changes():
    """Bit for bit: torch.equal would call -0.0 equal to 0.0 and refuse NaN == NaN."""
    x = torch.tensor([0.0, float("nan")])
    with pytest.raises(AssertionError, match="input tensor 0: bits changed"):
        with assert_no_side_effects(torch.nn.Module(), x):
            x[0] = -0.0
    y = torch.tensor([float("nan")])
    with assert_no_side_effects(torch.nn.Module(), y):
        pass


class Mutating(torch.nn.Module):
    """Every way a graph can write to what the caller owns."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x, y):
        x.add_(1)                                  # an input, in place
        y.requires_grad_()                         # an input's flag
        self.linear.weight.data.mul_(2)            # a parameter, behind autograd's back
        self.steps.add_(1)                         # a buffer
        h = self.bn(self.linear(x))                # running statistics
        h = F.dropout(h, 0.5, training=True)       # the RNG
        noise = torch.randn(h.shape) + torch.rand_like(h)
        return h + noise + y


def with_global_state_calls(gm):
    """Add what tracing cannot record: reseeding the RNG and switching grad mode off for good."""
    graph = gm.graph
    last = list(graph.nodes)[-2]
    with graph.inserting_after(last):
        graph.call_function(torch._C._set_grad_enabled, (False,))
    with graph.inserting_after(last):
        graph.call_function(torch.manual_seed, (123,))
    gm.recompile()
    return gm


def test_a_graph_that_mutates_everything_changes_nothing():
    gm = with_global_state_calls(torch.fx.symbolic_trace(Mutating().train()))
    assert "manual_seed" in gm.code and "_set_grad_enabled" in gm.code
    x = torch.randn(3, 4)
    y = torch.randn(3, 4)
    with assert_no_side_effects(gm, x, y):
        out = fxprop.propagate(gm, x, y)
    assert tuple(out.shape) == (3, 4) and torch.is_grad_enabled()


def test_inputs_requiring_grad_get_no_history_and_no_grad():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))
    x = torch.randn(2, 4, requires_grad=True)
    with assert_no_side_effects(gm, x):
        out = fxprop.propagate(gm, x)
    assert out.requires_grad and x.grad_fn is None and x.grad is None and x.is_leaf
    assert all(p.grad is None for p in gm.parameters())


def test_propagating_twice_and_after_a_failure_changes_nothing():
    gm = model_with_state().train()
    with assert_no_side_effects(gm):
        fxprop.propagate(gm, fxprop.TensorSpec((4, 3)))
        fxprop.propagate(gm, fxprop.TensorSpec((4, 3)))
        with pytest.raises(fxprop.PropagationError):
            fxprop.propagate(gm, fxprop.TensorSpec((4, 5)))


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "lstm"])
@pytest.mark.parametrize("training", [False, True])
def test_example_models_in_both_modes(name, training):
    model, inputs = getattr(examples, f"{name}_example")()
    model.train(training)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    gm = torch.fx.symbolic_trace(model)
    with assert_no_side_effects(gm, *inputs):
        fxprop.propagate(gm, *inputs)
    with assert_no_side_effects(gm, *inputs):
        fxprop.propagate(copy.deepcopy(gm), *inputs, cache=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_untouched():
    torch.cuda.init()
    gm = torch.fx.symbolic_trace(Mutating().train())
    x = torch.randn(3, 4, device="cuda")
    y = torch.randn(3, 4, device="cuda")
    gm.cuda()
    before = torch.cuda.get_rng_state_all()
    with assert_no_side_effects(gm, x, y):
        fxprop.propagate(gm, x, y)
    assert all(torch.equal(a, b) for a, b in zip(before, torch.cuda.get_rng_state_all()))


@pytest.mark.parametrize("tensor", [
    torch.zeros(1, 3).expand(4, 3),                                   # stride 0
    torch.randn(4, 6)[:, ::2],                                        # gaps
    torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
    torch.randn(1, 1, 1, 1).as_strided((1, 1, 1, 1), (2, 2, 2, 2)),   # "contiguous" with odd strides
    torch.tensor(1.5, dtype=torch.bfloat16),                          # 0-dim
    torch.zeros(0, dtype=torch.complex64).as_strided((0,), (0,)),     # empty, stride 0
    torch.randn(3, dtype=torch.complex64).conj(),                     # conjugate view
], ids=["expanded", "padded", "channels_last", "odd_strides", "zero_dim", "empty", "conj"])
def test_snapshots_read_any_layout(tensor):
    """Finding (in the helper itself): bit snapshots of non-dense tensors failed to view as bytes."""
    with assert_no_side_effects(torch.nn.Module(), tensor):
        pass


# --- a leaf module's own containers, of every kind a shadow copies ---
@dataclasses.dataclass
class Stats:
    calls: int = 0
    seen: list = dataclasses.field(default_factory=list)
class Leaf(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.history = collections.deque(maxlen=3); s.counts = collections.Counter(); s.ns = types.SimpleNamespace(n=0, t=torch.zeros(2))
        s.stats = Stats(); s.pair = collections.namedtuple("P", "a b")([1], [2])
    def forward(s, x):
        s.history.append(1); s.counts["x"] += 1; s.ns.n += 1; s.ns.t += 1; s.stats.calls += 1; s.stats.seen.append(1); s.pair.a.append(3)
        return x + 1
class T(torch.fx.Tracer):
    def is_leaf_module(self, m, q): return isinstance(m, Leaf) or super().is_leaf_module(m, q)


class _HoldsLeaf(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.leaf = Leaf()

    def forward(s, x):
        return s.leaf(x)


def test_a_leaf_module_mutating_its_deques_counters_namespaces_and_dataclasses_leaves_them_alone():
    model = _HoldsLeaf()
    gm = torch.fx.GraphModule(model, T().trace(model))
    fxprop.propagate(gm, torch.randn(2))
    leaf = model.leaf
    assert list(leaf.history) == [] and leaf.counts == collections.Counter() and leaf.ns.n == 0
    assert torch.equal(leaf.ns.t, torch.zeros(2)) and leaf.stats == Stats() and leaf.pair.a == [1]
    model(torch.randn(2))  # the real module still mutates its own state
    assert list(leaf.history) == [1] and leaf.stats.calls == 1
