"""Edge cases found by attacking the malformed-graph checks, the cache key, the one-node graphs,
dim strings, the command line's outputs and the coverage report: one test per case.

Every test compares fxprop with real execution (or torch's own behaviour) on a minimal graph.
"""
import collections
import os
import subprocess
import sys

import pytest
import torch

import fxprop
from fxprop.testing import assert_matches_real, check_rule

X = torch.randn(3, 4)


def _root_calling(child: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A graph whose one call is a call_module of ``child`` (a nested GraphModule)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_module("child", (x,)))
    root = torch.nn.Module()
    root.child = child
    return torch.fx.GraphModule(root, graph)


def test_nested_graph_module_with_two_outputs_returns_the_first_like_real_execution():
    """torch.fx returns at a graph's first output. The root graph is checked (InputError), but a
    nested GraphModule (call_module, and a higher-order op's body, which go through the same
    walk_subgraph / staged_output) is not, and staged_output takes the *last* output node:
    fxprop answers (6, 4) where real execution returns (3, 4)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.relu, (x,)))
    graph.output(graph.call_function(torch.cat, ([x, x],)))
    gm = _root_calling(torch.fx.GraphModule(torch.nn.Module(), graph))
    real = gm(X)
    try:
        out = fxprop.propagate(gm, X)
    except (fxprop.InputError, fxprop.UnsupportedError):
        return  # refusing the malformed subgraph, as for the root graph, is also right
    assert tuple(out.shape) == tuple(real.shape)


def test_nested_graph_module_node_after_output_is_not_blamed_on_the_model():
    """A node after a nested graph's output never runs (real execution succeeds), but fxprop
    propagates it and raises PropagationError, claiming the model fails there."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.relu, (x,)))
    graph.call_function(torch.mm, (x, x))  # (3, 4) @ (3, 4): would fail, but never runs
    gm = _root_calling(torch.fx.GraphModule(torch.nn.Module(), graph))
    real = gm(X)
    try:
        out = fxprop.propagate(gm, X)
    except (fxprop.InputError, fxprop.UnsupportedError):
        return  # refused as a malformed graph, like the root's "node after the output"
    assert tuple(out.shape) == tuple(real.shape)


def _relu_neg():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    neg = graph.call_function(torch.neg, (relu,))
    graph.output(neg)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_repropagate_refuses_a_node_used_before_it_is_defined():
    """After a first propagate, an edit moves a node before the one it reads and changes that
    one's target. Real execution raises UnboundLocalError (a NameError); repropagate accepts the
    graph and annotates %neg from %relu's *stale* annotation: neg (3, 4) while relu is (6, 4)."""
    gm = _relu_neg()
    fxprop.propagate(gm, X)
    nodes = {node.name: node for node in gm.graph.nodes}
    nodes["relu"].target = torch.cat
    nodes["relu"].args = ([nodes["x"], nodes["x"]],)
    nodes["x"].append(nodes["neg"])  # neg now comes before relu
    gm.recompile()
    with pytest.raises(NameError):
        gm(X)
    with pytest.raises(fxprop.PropagationError, match="used before it is defined") as caught:
        fxprop.repropagate(gm, [nodes["relu"]])
    assert caught.value.error_type is NameError


def test_a_placeholder_used_before_its_position_is_not_refused_as_the_models_error():
    """Placeholders become the generated forward's parameters, so a node that reads a placeholder
    standing later in the graph runs fine for real. fxprop raises PropagationError (NameError),
    claiming real execution fails there. (Refusing the graph as malformed, an InputError, would
    also be honest: Graph.lint rejects it.)"""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    y = graph.placeholder("y")
    graph.output(graph.call_function(torch.add, (relu, y)))
    relu.args = (y,)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    a, b = torch.randn(3, 1), torch.randn(1, 4)
    real = gm(a, b)
    try:
        out = fxprop.propagate(gm, a, b)
    except fxprop.InputError:
        return
    assert tuple(out.shape) == tuple(real.shape)


def test_a_global_module_forward_hook_is_not_answered_from_the_cache():
    """The rule cache keys a call_module by the module's state, not by torch's global module hooks:
    after ``register_module_forward_hook``, the process-wide cache returns the hook-less result."""
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 6)))
    x = torch.randn(2, 4)
    fxprop.propagate(gm, x)  # fills the process-wide cache
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: torch.cat([output, output]) if isinstance(module, torch.nn.Linear) else None)
    try:
        real = gm(x)
        out = fxprop.propagate(gm, x)
    finally:
        handle.remove()
    assert tuple(out.shape) == tuple(real.shape) == (4, 6)


Pair = collections.namedtuple("Pair", "a b")


class AddPair(torch.nn.Module):
    def forward(self, pair):
        return pair.a + pair.b


def test_check_rule_and_lookup_keep_a_namedtuple_argument():
    """call_graphs.call_graph turns a namedtuple argument into a plain tuple, so the module's
    ``pair.a`` fails and check_rule / lookup blame the module (PropagationError) although calling
    it with these arguments works."""
    spec = fxprop.TensorSpec((2,))
    real = AddPair()(Pair(torch.ones(2), torch.ones(2)))
    out = check_rule(AddPair(), Pair(spec, spec))
    assert tuple(out.shape) == tuple(real.shape)
    assert fxprop.lookup(AddPair(), Pair(spec, spec)).kind is not None


@pytest.mark.parametrize("dim", ["B%0", "B//0", "4//0"])
def test_a_dim_dividing_by_zero_is_an_input_error(dim):
    """The errors page: a bad dim string is an InputError. 'B%0' raises sympy's ZeroDivisionError
    from TensorSpec; 'B//0' and '4//0' construct, then propagate raises a bare TypeError
    ("Cannot convert complex to int"), neither an fxprop error nor blamed correctly."""
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    with pytest.raises(fxprop.InputError):
        fxprop.propagate(gm, fxprop.TensorSpec((dim, 2)))


def test_live_bytes_plot_to_an_unwritable_format_is_a_clear_error(tmp_path):
    """`fxprop run ... --live-bytes-plot live.xyz` runs the whole propagation and estimate, then dies
    with matplotlib's traceback (ValueError: Format 'xyz' is not supported); a missing directory
    dies with FileNotFoundError's. The CLI's errors are one 'fxprop: error: ...' line."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "fxprop", "run", "tests.cli_models:tiny", "--format", "json",
                             "--live-bytes-plot", str(tmp_path / "live.xyz")],
                            capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert result.returncode in (1, 2)
    assert "Traceback" not in result.stderr, result.stderr[-800:]
    assert "fxprop" in result.stderr and "xyz" in result.stderr


NO_RULE_MODEL = '''
import torch

@torch.library.custom_op("adversary_findings::cuda_only", mutates_args=(), device_types="cuda")
def cuda_only(x: torch.Tensor) -> torch.Tensor:
    return x * 3


class Net(torch.nn.Module):
    def forward(self, x):
        return cuda_only(x).relu()


def make():
    return Net(), (torch.ones(2, 3),)
'''


def test_coverage_report_gate_exits_3_for_a_node_with_no_rule(tmp_path, monkeypatch):
    """docs/guides/coverage-report.md: "--fail-on-fallback exits with status 3 when any overload or
    node needs the fallback or has no rule". In --model mode a node with no rule (a custom op with
    neither a fake kernel nor a CPU kernel) makes propagate raise UnsupportedError, and the report
    exits 1 (an error, which a CI gate cannot tell from a crash) with no table."""
    import importlib.util
    import io
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[1] / "tools" / "coverage_report.py"
    spec = importlib.util.spec_from_file_location("coverage_report_adversary", script)
    coverage_report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "coverage_report_adversary", coverage_report)  # dataclasses look it up
    spec.loader.exec_module(coverage_report)
    (tmp_path / "adversary_no_rule_model.py").write_text(NO_RULE_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    code = coverage_report.main(["--model", "adversary_no_rule_model:make", "--trace", "symbolic", "--format", "json",
                                 "--fail-on-fallback"], out=out, err=err)
    assert code == coverage_report.EXIT_FALLBACK, err.getvalue()


def test_the_dynamo_fallback_leaves_the_models_buffers_alone():
    """The coverage report's dynamo capture runs the model for real: it runs a copy, so a BatchNorm
    in training keeps its running statistics and its counter."""
    from fxprop.cli.tracing import trace_model

    class Branching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            y = self.norm(x)
            return y.relu() if y.sum() > 0 else y.neg()

    model = Branching().train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    traced = trace_model(model, (torch.randn(4, 3),))
    assert traced.tracer == "dynamo"
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_a_model_its_inputs_cannot_call_is_refused_before_tracing():
    """``forward(self, *, x)`` called with a positional input raises TypeError for real;
    symbolic_trace would bind the input by position and report a graph the model never runs."""
    from fxprop.cli.tracing import TraceError, trace_model

    class KeywordOnly(torch.nn.Module):
        def forward(self, *, x):
            return x.relu()

    with pytest.raises(TypeError):
        KeywordOnly()(torch.ones(2))
    with pytest.raises(TraceError, match="cannot be called with these inputs"):
        trace_model(KeywordOnly(), (torch.ones(2),))
