"""Benchmark fxprop against FakeTensorProp and ShapeProp on the same graphs, in one run.

    .venv/bin/python benchmarks/run.py                  # every graph, writes benchmarks/results.md
    .venv/bin/python benchmarks/run.py --cases gpt2 llama80 --runs 7

Warm times are medians over --runs rounds; each round gives every method a fresh copy of the
graph, and the methods alternate. Cold times and peak-RSS deltas come from a fresh process
per method and graph: the graph is built first, then the clock starts before the method's
import and stops after its first call.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fxprop  # noqa: E402
from models import CASES, Case, fresh_copy  # noqa: E402
from methods import METHODS  # noqa: E402

TARGETS = """\
- warm propagate <= 1/10 of FakeTensorProp's time on GPT-2-small and on Llama-80
- cold first call (import plus propagate) no slower than FakeTensorProp's cold call
- peak RSS delta on GPT-2-small <= 50 MB
- Llama-80 warm <= 1 s
- zero real-tensor bytes materialized on all these models"""


def warm_times(case: Case, methods: list[str], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(runs):
        for name in methods:
            gm = fresh_copy(case.gm)
            gc.collect()  # outside the clock: no run pays for the garbage of the one before
            start = time.perf_counter()
            METHODS[name](gm, case)
            times[name].append(time.perf_counter() - start)
            del gm
    return times


def cold(case_name: str, method: str) -> dict:
    """Run one method once in a fresh process; returns its seconds and peak RSS delta in MB."""
    script = Path(__file__).resolve().parent / "cold.py"
    done = subprocess.run([sys.executable, str(script), case_name, method], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, mean_y - slope * mean_x


def incremental(case: Case, runs: int) -> dict:
    """Edit one node in the middle of the graph and re-annotate only what depends on it."""
    full, partial, touched = [], [], 0
    for _ in range(runs):
        gm = fresh_copy(case.gm)
        fxprop.propagate(gm, *case.meta_inputs)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.nn.functional.silu]
        target = nodes[len(nodes) // 2]
        with gm.graph.inserting_after(target):
            replacement = gm.graph.call_function(torch.nn.functional.gelu, (target,))
        target.replace_all_uses_with(replacement, delete_user_cb=lambda user: user is not replacement)
        start = time.perf_counter()
        touched = len(fxprop.repropagate(gm, [replacement]))
        partial.append(time.perf_counter() - start)
        edited = fresh_copy(gm)
        for node in edited.graph.nodes:
            node.meta.clear()
        start = time.perf_counter()
        fxprop.propagate(edited, *case.meta_inputs)
        full.append(time.perf_counter() - start)
    return {"nodes": len(case.gm.graph.nodes), "touched": touched, "incremental": statistics.median(partial),
            "full": statistics.median(full)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapeprop-runs", type=int, default=5)
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process measurements")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results.md"))
    args = parser.parse_args()

    rows, llama_points, fallback_total, notes = [], [], 0, []
    for case_name in args.cases:
        print(f"[{case_name}] building", file=sys.stderr, flush=True)
        case = CASES[case_name]()
        nodes = len(case.gm.graph.nodes)
        methods = ["fxprop", "FakeTensorProp"]
        times = warm_times(case, methods, args.runs)
        if case.real_inputs is not None and args.shapeprop_runs:
            times.update(warm_times(case, ["ShapeProp"], args.shapeprop_runs))
        probe = fresh_copy(case.gm)
        fxprop.propagate(probe, *case.meta_inputs)
        fallback_bytes = probe.meta["fxprop"]["fallback_bytes"]
        fallback_total += fallback_bytes
        anchor = statistics.median(times["FakeTensorProp"])
        for method, samples in times.items():
            warm = statistics.median(samples)
            measured = {} if args.no_cold else cold(case_name, method)
            rows.append({"graph": case.name, "nodes": nodes, "method": method, "warm_s": warm,
                         "nodes_per_s": nodes / warm, "vs_FakeTensorProp": anchor / warm,
                         "cold_s": measured.get("seconds"), "peak_rss_mb": measured.get("peak_rss_mb"),
                         "fallback_bytes": fallback_bytes if method == "fxprop" else None,
                         "error": measured.get("error")})
            print(f"  {method:15s} warm {warm:.4f}s  cold {measured.get('seconds')}  rss {measured.get('peak_rss_mb')}",
                  file=sys.stderr, flush=True)
        if case.layers is not None:
            llama_points.append((case.layers, statistics.median(times["fxprop"]), anchor))
        if case_name == "llama80":
            notes.append(("incremental", incremental(case, max(3, args.runs // 2))))
        del case, probe

    report = render(rows, llama_points, fallback_total, notes, args)
    Path(args.out).write_text(report)
    print(report)
    return 0


def render(rows, llama_points, fallback_total, notes, args) -> str:
    fmt = lambda v, spec: "—" if v is None else format(v, spec)
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPU cores, torch {torch.__version__}, "
             f"median of {args.runs} warm runs (ShapeProp: {args.shapeprop_runs}).", "",
             "| graph | nodes | method | warm (s) | nodes/s | × faster than FakeTensorProp | cold (s) | peak RSS Δ (MB) | fallback bytes |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        cold_s = row["cold_s"] if row["error"] is None else f"error: {row['error']}"
        lines.append(f"| {row['graph']} | {row['nodes']} | {row['method']} | {row['warm_s']:.4f} | "
                     f"{row['nodes_per_s']:,.0f} | {row['vs_FakeTensorProp']:.1f} | "
                     f"{cold_s if isinstance(cold_s, str) else fmt(cold_s, '.2f')} | {fmt(row['peak_rss_mb'], '.1f')} | "
                     f"{fmt(row['fallback_bytes'], 'd')} |")
    if len(llama_points) >= 2:
        layers = [p[0] for p in llama_points]
        ours, anchor = fit_line(layers, [p[1] for p in llama_points]), fit_line(layers, [p[2] for p in llama_points])
        lines += ["", "Time against layer count (least squares over the Llama graphs):", "",
                  f"- fxprop: {ours[0] * 1000:.2f} ms per layer + {ours[1] * 1000:.1f} ms",
                  f"- FakeTensorProp: {anchor[0] * 1000:.2f} ms per layer + {anchor[1] * 1000:.1f} ms"]
    for title, data in notes:
        if title == "incremental":
            lines += ["", f"Incremental re-propagation on Llama-80 ({data['nodes']} nodes): one node replaced, "
                          f"{data['touched']} nodes re-annotated in {data['incremental'] * 1000:.1f} ms "
                          f"(full propagate of the edited graph: {data['full'] * 1000:.1f} ms)."]
    lines += ["", f"Real-tensor bytes materialized by fxprop over all graphs: {fallback_total}.", "",
              "Cache after the run: " + json.dumps(fxprop.rule_cache.stats()), "", "Targets:", "", TARGETS, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
