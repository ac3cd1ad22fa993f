"""fxprop against FakeTensorProp inside a torch.compile backend, on graphs dynamo hands over.

    .venv/bin/python benchmarks/in_backend.py            # writes benchmarks/in_backend.md
    .venv/bin/python benchmarks/in_backend.py --models llama t5 --runs 3

Each model of the transformers corpus (tests/corpus, tiny configs built in code; none of them
is among benchmarks/run.py's graphs) is compiled with ``dynamic=False`` and ``dynamic=True`` by
a backend that, for every graph dynamo passes it, times two ways of re-annotating that graph
on dynamo's own example inputs (its FakeTensors, SymInt placeholders, real tensors):

fxprop          ``fxprop.propagate(gm, *example_inputs)``, as `fxprop.backend` does;
FakeTensorProp  inductor's own ``fake_tensor_prop(gm, example_inputs, force_allow_non_fake_inputs=True)``:
                ``FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*example_inputs)`` with
                ``mode`` dynamo's own FakeTensorMode (its ShapeEnv), real constants allowed.

first sight  before every timed call both caches are emptied (`fxprop.rule_cache.clear()`,
             `FakeTensorMode.cache_clear()`): the graph is new to both.
hot          both caches warm (each method has annotated this very graph once).

Before every call the graph's node metadata is restored to what dynamo wrote, outside the
clock; the methods alternate and swap who goes first every round; medians of --runs. After
each fxprop call its values are compared with dynamo's ``example_value`` on every node that has
a tensor or a SymInt (shape and stride as expressions, dtype, device, requires_grad): the
"differ" column counts nodes that disagree. (Floats read with ``.item()`` are not compared:
where the tensor's value is known, fxprop gives the value and dynamo a symbol.) Nothing here fails on a slow figure.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from corpus import models as corpus  # noqa: E402
from run import geomean, load, source_state  # noqa: E402
from dynamic import CompiledGraph  # noqa: E402

DEFAULT_MODELS = ("llama", "mixtral", "qwen2_moe", "phi3", "gemma2", "t5", "bart", "deberta_v2", "vit", "swin",
                  "whisper", "clip", "mamba")
COMMAND = ".venv/bin/python benchmarks/in_backend.py"


def differences(gm: torch.fx.GraphModule) -> int:
    """Nodes whose fxprop value differs from dynamo's ``example_value``: sizes and strides are
    compared as dynamo's ShapeEnv proves them equal (``x[-k:]`` is ``s70`` to one and ``s55 + s70``
    to the other where the guards make ``s55`` 0)."""
    def same_size(a, b) -> bool:
        return statically_known_true(a == b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b

    def same(theirs, ours) -> bool:
        if isinstance(theirs, torch.SymInt):
            return same_size(theirs, ours)
        if not isinstance(ours, torch.Tensor):
            return False
        return (theirs.dim() == ours.dim() and all(map(same_size, theirs.shape, ours.shape))
                and all(map(same_size, theirs.stride(), ours.stride()))
                and (theirs.dtype, theirs.device, theirs.requires_grad) == (ours.dtype, ours.device, ours.requires_grad))

    return sum(1 for node in gm.graph.nodes
               if isinstance(node.meta.get("example_value"), (torch.Tensor, torch.SymInt))
               and not same(node.meta["example_value"], node.meta.get("val")))


class Graph(CompiledGraph):
    """One graph dynamo handed the backend: timed as `CompiledGraph` times it, then compared with
    dynamo's ``example_value`` after fxprop annotates it."""

    def measure(self, runs: int) -> dict:
        out = super().measure(runs, ("first sight", "hot"))
        if "fxprop" not in out["errors"]:
            self.annotate("fxprop")
            out["differ"] = differences(self.gm)
            self.restore()
        return out


def measure_model(name: str, dynamic: bool, runs: int) -> dict:
    model, inputs = corpus.build(name)
    measured: list[dict] = []
    errors: list[str] = []

    def backend(gm, example_inputs):
        try:
            measured.append(Graph(gm, example_inputs).measure(runs))
        except Exception as error:  # reported in the table, not raised: the other graphs still count
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        compiled(**inputs)
    torch._dynamo.reset()
    return {"graphs": measured, "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS), choices=sorted(corpus.CASES))
    parser.add_argument("--runs", type=int, default=5, help="timed calls per method, regime and graph")
    parser.add_argument("--out", default=str(HERE / "in_backend.md"))
    args = parser.parse_args()

    started, load_at_start = time.monotonic(), load()
    rows = []
    for name in args.models:
        for dynamic in (False, True):
            result = measure_model(name, dynamic, args.runs)
            rows.append((name, dynamic, result))
            graphs = result["graphs"]
            print(f"{name} dynamic={dynamic}: {len(graphs)} graphs, {sum(g['nodes'] for g in graphs)} nodes, "
                  f"{len(result['errors'])} errors", file=sys.stderr, flush=True)
    text = render(rows, args, load_at_start, (time.monotonic() - started) / 60)
    Path(args.out).write_text(text)
    print(text)
    return 0


def render(rows, args, load_at_start: float, minutes: float) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC with `{COMMAND}` at {source_state()}, "
             f"on {torch.get_num_threads()} CPU threads, torch {torch.__version__}; 1-minute load average "
             f"{load_at_start:.2f} at the start. Medians of {args.runs} calls per method and regime, summed over "
             f"the graphs dynamo passed the backend. Whole run: {minutes:.1f} min.", "",
             "ms per model; ratio = fxprop / FakeTensorProp with dynamo's mode (lower is better); differ = nodes "
             "whose fxprop value differs from dynamo's example_value; a method that failed on a graph is named "
             "under the table, and that model gets no ratio.", "",
             "| model | dynamic | graphs | nodes | first sight fxprop | FakeTensorProp | ratio | hot fxprop | "
             "FakeTensorProp | ratio | differ |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios: dict[tuple[str, bool], list[float]] = {}
    failures = []
    for name, dynamic, result in rows:
        graphs = result["graphs"]
        for error in result["errors"]:
            failures.append(f"- {name}, dynamic={dynamic}: the backend could not measure a graph: {error}")
        for graph in graphs:
            for method, error in graph["errors"].items():
                failures.append(f"- {name}, dynamic={dynamic}, a graph of {graph['nodes']} nodes: {method} failed: "
                                f"`{error}`")
        if not graphs:
            continue
        both = all(not graph["errors"] for graph in graphs)
        cells = [name, str(dynamic), str(len(graphs)), str(sum(g["nodes"] for g in graphs))]
        for regime in ("first sight", "hot"):
            ours = seconds(graphs, regime, "fxprop")
            theirs = seconds(graphs, regime, "FakeTensorProp")
            if both:
                ratios.setdefault((regime, dynamic), []).append(ours / theirs)
            cells += [fmt_ms(ours), fmt_ms(theirs), f"{ours / theirs:.3f}" if both else "—"]
        cells.append(str(sum(g.get("differ", 0) for g in graphs)) if all("differ" in g for g in graphs) else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Geometric means of the ratios, over the models both methods annotated:", "",
              "| regime | dynamic=False | dynamic=True |", "|---|---:|---:|"]
    for regime in ("first sight", "hot"):
        cells = [f"{geomean(ratios[(regime, d)]):.3f} ({len(ratios[(regime, d)])} models)" if ratios.get((regime, d))
                 else "—" for d in (False, True)]
        lines.append(f"| {regime} | " + " | ".join(cells) + " |")
    if failures:
        lines += ["", "Failures:", ""] + failures
    return "\n".join(lines) + "\n"


def seconds(graphs: list[dict], regime: str, method: str) -> float:
    """Summed over the graphs, or NaN when the method failed on one of them."""
    return sum(graph[regime].get(method, math.nan) for graph in graphs)


def fmt_ms(value: float) -> str:
    return "failed" if math.isnan(value) else f"{value * 1e3:.1f}"


if __name__ == "__main__":
    sys.exit(main())
