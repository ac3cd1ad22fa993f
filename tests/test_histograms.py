"""torch.histogram: sizes from the bins, refusals as the CPU kernels refuse, checked against
real execution over dtypes, bin counts and edges, ranges and weights."""
import itertools

import pytest
import torch

import fxprop
from fxprop.testing import check_rule

INPUTS = {
    "float": torch.randn(10), "double 2-d": torch.randn(2, 3).double(), "long": torch.arange(10),
    "half": torch.randn(4).half(), "bfloat16": torch.randn(4).bfloat16(), "bool": torch.zeros(3, dtype=torch.bool),
    "complex": torch.zeros(3, dtype=torch.complex64), "0-dim": torch.tensor(1.0), "empty": torch.randn(0),
}
OPTIONS = {
    "4 bins": dict(bins=4), "no bins": dict(bins=0), "density": dict(bins=4, density=True),
    "reversed range": dict(bins=4, range=(1.0, 0.0)), "range": dict(bins=4, range=(0.0, 1.0)),
    "no bins, reversed range": dict(bins=0, range=(1.0, 0.0)),
    "short weight": dict(bins=4, weight=torch.ones(3)), "weight of 10": dict(bins=4, weight=torch.ones(10)),
    "double weight of 6": dict(bins=4, weight=torch.ones(6).double()),
    "range, short weight": dict(bins=4, range=(0.0, 1.0), weight=torch.ones(3)),
    "range, half weight": dict(bins=4, range=(0.0, 1.0), weight=torch.ones(4).half()),
    "range, long weight": dict(bins=4, range=(0.0, 1.0), weight=torch.ones(3).long()),
    "edges": dict(bins=torch.tensor([0.0, 1.0, 3.0])), "double edges": dict(bins=torch.tensor([0.0, 1.0, 3.0]).double()),
    "2-d edges": dict(bins=torch.tensor([[0.0, 1.0]])), "one edge": dict(bins=torch.tensor([0.0])),
    "decreasing edges": dict(bins=torch.tensor([2.0, 1.0])),
    "edges, short weight": dict(bins=torch.tensor([0.0, 1.0]), weight=torch.ones(3)),
}


@pytest.mark.parametrize("input_name, option_name", list(itertools.product(INPUTS, OPTIONS)))
def test_histogram_matches_real_execution(input_name, option_name):
    options = dict(OPTIONS[option_name])
    bins = options.pop("bins")
    x = INPUTS[input_name]
    if isinstance(bins, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        bins = bins.to(x.dtype)
    try:
        check_rule(torch.histogram, x, bins, **options)
    except fxprop.PropagationError as refusal:  # re-raised only where real execution refused alike
        assert not isinstance(refusal, fxprop.InternalError), refusal


def test_a_histogram_of_many_bins_is_propagated_without_running_it():
    """268 MB of outputs on the host before: now a rule, under a 1 MiB fallback cap."""
    gm = torch.fx.symbolic_trace(lambda x: torch.histogram(x, bins=2 ** 25))
    hist, edges = fxprop.propagate(gm, torch.randn(100), fallback_limit_bytes=1 << 20)
    assert hist.shape == (2 ** 25,) and edges.shape == (2 ** 25 + 1,)
    provenance = next(n for n in gm.graph.nodes if n.op == "call_function").meta["fxprop"]
    assert provenance.kind == "python" and provenance.fallback_bytes == 0
