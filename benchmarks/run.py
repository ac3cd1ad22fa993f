"""fxprop against torch's FakeTensorProp on the same graphs, in one run, in three regimes.

    .venv/bin/python benchmarks/run.py                  # every graph, writes benchmarks/results.md
    .venv/bin/python benchmarks/run.py --cases gpt2 llama80 --runs 3 --no-cold

first sight  warm process (both methods have propagated an unrelated graph first); before every
             timed call both caches are emptied (`fxprop.rule_cache.clear()`,
             `FakeTensorMode.cache_clear()`); every call gets a fresh copy of the graph; the
             methods alternate (and swap who goes first every round); median of --runs.
hot          the same, with both caches warm (each method has seen this very graph once).
cold         a fresh process per method and graph (benchmarks/cold.py): the graph is built,
             then the clock covers the method's import and its first call; median of --cold-runs.

Garbage is collected before every timed call, outside the clock. Targets are checked and
printed (MET / MISSED with the measured figure); nothing here fails on a missed target.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import pstats
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import fxprop  # noqa: E402
from methods import METHODS, clear_caches  # noqa: E402
from models import CASES, LARGE_NODES, Case, fresh_copy, warmup  # noqa: E402

ORDER = ("fxprop", "FakeTensorProp")
COMMAND = ".venv/bin/python benchmarks/run.py"


def load() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def wait_for_quiet(threshold: float, patience_s: float) -> float:
    """Wait (up to patience_s) for the 1-minute load average to drop below threshold."""
    deadline = time.monotonic() + patience_s
    while load() >= threshold and time.monotonic() < deadline:
        print(f"load {load():.2f} >= {threshold}, waiting", file=sys.stderr, flush=True)
        time.sleep(20)
    return load()


def timed(case: Case, method: str, *, first_sight: bool) -> float:
    gm = fresh_copy(case.gm)
    if first_sight:
        clear_caches()
    gc.collect()  # outside the clock: no call pays for the garbage of the one before
    start = time.perf_counter()
    METHODS[method](gm, case)
    return time.perf_counter() - start


def regime(case: Case, runs: int, *, first_sight: bool) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in ORDER}
    if not first_sight:
        for name in ORDER:  # warm both caches on this graph
            timed(case, name, first_sight=False)
    for round_ in range(runs):
        for name in ORDER if round_ % 2 == 0 else reversed(ORDER):
            times[name].append(timed(case, name, first_sight=first_sight))
    return times


def profiled(case: Case, profiles: dict[str, pstats.Stats | None], key: str, *, first_sight: bool) -> None:
    gm = fresh_copy(case.gm)
    if first_sight:
        clear_caches()
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    fxprop.propagate(gm, *case.meta_inputs)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    if profiles.get(key) is None:
        profiles[key] = stats
    else:
        profiles[key].add(stats)


def python_heap_peak_mb(case: Case) -> float:
    """Peak of Python-level allocations during one first-sight propagate (tracemalloc)."""
    gm = fresh_copy(case.gm)
    clear_caches()
    gc.collect()
    tracemalloc.start()
    fxprop.propagate(gm, *case.meta_inputs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def cold(case_name: str, runs: int) -> dict[str, dict]:
    """Each method's import plus first call in fresh processes; medians over runs."""
    script = HERE / "cold.py"
    samples: dict[str, list[dict]] = {name: [] for name in ORDER}
    errors: dict[str, str] = {}
    for round_ in range(runs):
        for name in ORDER if round_ % 2 == 0 else reversed(ORDER):
            done = subprocess.run([sys.executable, str(script), case_name, name], capture_output=True, text=True,
                                  timeout=900)
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                errors[name] = lines[-1] if lines else "failed"
                continue
            samples[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = {}
    for name in ORDER:
        if not samples[name]:
            out[name] = {"error": errors.get(name, "failed")}
            continue
        out[name] = {key: statistics.median(s[key] for s in samples[name])
                     for key in ("seconds", "import_s", "call_s", "peak_rss_mb", "call_peak_rss_mb")}
    return out


def cold_profile(case_name: str) -> tuple[str, pstats.Stats] | None:
    """cProfile of fxprop's import plus first call in a fresh process (separate from the timed ones)."""
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "cold.prof"
        done = subprocess.run([sys.executable, str(HERE / "cold.py"), case_name, "fxprop", str(path)],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not path.exists():
            return None
        return case_name, pstats.Stats(str(path), stream=io.StringIO())


def incremental(case: Case, runs: int) -> dict:
    """Edit one node in the middle of the graph and re-annotate only what depends on it (hot caches)."""
    full, partial, touched = [], [], 0
    for _ in range(runs):
        gm = fresh_copy(case.gm)
        fxprop.propagate(gm, *case.meta_inputs)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.nn.functional.silu]
        target = nodes[len(nodes) // 2]
        with gm.graph.inserting_after(target):
            replacement = gm.graph.call_function(torch.nn.functional.gelu, (target,))
        target.replace_all_uses_with(replacement, delete_user_cb=lambda user: user is not replacement)
        gc.collect()
        start = time.perf_counter()
        touched = len(fxprop.repropagate(gm, [replacement]))
        partial.append(time.perf_counter() - start)
        edited = fresh_copy(gm)
        for node in edited.graph.nodes:
            node.meta.clear()
        gc.collect()
        start = time.perf_counter()
        fxprop.propagate(edited, *case.meta_inputs)
        full.append(time.perf_counter() - start)
    return {"nodes": len(case.gm.graph.nodes), "touched": touched, "incremental": statistics.median(partial),
            "full": statistics.median(full)}


def import_profile(top: int = 10) -> list[tuple[str, float, float]]:
    """`python -X importtime -c 'import torch; import fxprop'`: fxprop's import, by module (self, cumulative us)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch, sys; import fxprop"],
                          capture_output=True, text=True, cwd=HERE.parent, timeout=300)
    rows, seen_torch_done = [], False
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if not match:
            continue
        self_us, cumulative_us, name = int(match[1]), int(match[2]), match[4]
        if not seen_torch_done:
            seen_torch_done = name == "torch"  # everything before torch's own line is torch's import
            continue
        rows.append((name, self_us / 1e6, cumulative_us / 1e6))
    total = next((r[2] for r in rows if r[0] == "fxprop"), sum(r[1] for r in rows))
    rows.sort(key=lambda r: -r[1])
    return [("(total `import fxprop` after torch)", total, total)] + rows[:top]


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    return slope, intercept, 1 - residual / total if total else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--runs", type=int, default=5, help="timed calls per method, regime and graph")
    parser.add_argument("--cold-runs", type=int, default=1, help="fresh processes per method and graph")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process measurements")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="wait for a 1-minute load below this")
    parser.add_argument("--patience", type=float, default=600, help="seconds to wait for that load at most")
    parser.add_argument("--out", default=str(HERE / "results.md"))
    args = parser.parse_args()

    started = time.perf_counter()
    load_start = wait_for_quiet(args.quiet_load, args.patience)
    print(f"load at start {load_start:.2f}", file=sys.stderr, flush=True)

    # A warm process: both methods have propagated an unrelated graph (cold and hot) before any timing.
    warm_case = warmup()
    for _ in range(2):
        regime(warm_case, 1, first_sight=True)
        regime(warm_case, 1, first_sight=False)

    rows, profiles, notes, loads = [], {}, {}, [load_start]
    for case_name in args.cases:
        print(f"[{case_name}] building", file=sys.stderr, flush=True)
        case = CASES[case_name]()
        large = len(case.gm.graph.nodes) > LARGE_NODES
        runs = 1 if large else args.runs
        first = regime(case, runs, first_sight=True)
        hot = regime(case, runs, first_sight=False)
        probe = fresh_copy(case.gm)
        fxprop.propagate(probe, *case.meta_inputs)
        if not large:  # the profiles' shares stay those of ordinary graphs
            profiled(case, profiles, "first sight", first_sight=True)
            profiled(case, profiles, "hot", first_sight=False)
        row = {"key": case_name, "graph": case.name, "nodes": len(case.gm.graph.nodes),
               "transformer": case.transformer, "layers": case.layers,
               "fallback_bytes": probe.meta["fxprop"]["fallback_bytes"],
               "heap_mb": python_heap_peak_mb(case)}
        for label, times in (("first", first), ("hot", hot)):
            for name in ORDER:
                row[f"{label}_{name}"] = statistics.median(times[name])
        row["runs"] = runs
        if case_name == "llama80":
            notes["incremental"] = incremental(case, 3)
        del case, probe
        gc.collect()
        row["cold"] = {} if args.no_cold or large else cold(case_name, args.cold_runs)
        loads.append(load())
        print(f"  first sight {row['first_fxprop']:.4f}s vs {row['first_FakeTensorProp']:.4f}s   "
              f"hot {row['hot_fxprop']:.4f}s vs {row['hot_FakeTensorProp']:.4f}s   cold {row['cold']}   "
              f"load {loads[-1]:.2f}", file=sys.stderr, flush=True)
        rows.append(row)

    notes["import"] = import_profile()
    if not args.no_cold and args.cases:
        notes["cold_profile"] = cold_profile(args.cases[0])
    notes["loads"] = loads
    notes["elapsed"] = time.perf_counter() - started
    report = render(rows, profiles, notes, args)
    Path(args.out).write_text(report)
    print(report)
    return 0


# --- report ----------------------------------------------------------------------------------

def us_per_node(seconds: float, nodes: int) -> str:
    return f"{seconds / nodes * 1e6:,.1f}"


def short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    for marker in ("site-packages/", str(HERE.parent) + "/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    else:
        filename = Path(filename).name
    return f"{filename}:{line} {name}"


def profile_table(stats: pstats.Stats, sort: str, top: int = 10) -> list[str]:
    """The top entries by own or cumulative time; by cumulative time, the driver chain that
    spans (nearly) the whole call (propagate, run, walk, run_node, ...) is left out."""
    total = stats.total_tt
    entries = sorted(stats.stats.items(), key=lambda item: -(item[1][2] if sort == "tottime" else item[1][3]))
    if sort == "cumtime":
        entries = [entry for entry in entries if entry[1][3] < 0.9 * total]
    lines = ["| function | calls | tottime (s) | % | cumtime (s) | % |", "|---|---:|---:|---:|---:|---:|"]
    for func, (_, ncalls, tottime, cumtime, _) in entries[:top]:
        lines.append(f"| `{short(func)}` | {ncalls:,} | {tottime:.3f} | {100 * tottime / total:.1f} | "
                     f"{cumtime:.3f} | {100 * cumtime / total:.1f} |")
    return lines


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def targets(rows) -> list[tuple[str, str, bool]]:
    out = []
    first = {r["key"]: r["first_fxprop"] / r["first_FakeTensorProp"] for r in rows}
    hot = {r["key"]: r["hot_fxprop"] / r["hot_FakeTensorProp"] for r in rows}
    names = {r["key"]: r["graph"] for r in rows}
    g = geomean(list(first.values()))
    out.append(("first sight ≤ 0.1× FakeTensorProp (geometric mean)", f"{g:.3f}×", g <= 0.1))
    transformer = {k: v for k, v in first.items() if next(r for r in rows if r["key"] == k)["transformer"]}
    if transformer:
        worst = max(transformer, key=transformer.get)
        above = [k for k, v in transformer.items() if v > 0.1]
        out.append(("first sight ≤ 0.1× on every transformer graph",
                    f"worst {transformer[worst]:.3f}× ({names[worst]}); {len(above)} of {len(transformer)} above 0.1×",
                    not above))
    g = geomean(list(hot.values()))
    worst = max(hot, key=hot.get)
    out.append(("hot ≤ 0.03× (geometric mean)", f"{g:.3f}× (worst {hot[worst]:.3f}×, {names[worst]})", g <= 0.03))
    if "llama80" in hot:
        out.append(("Llama-80 hot ≤ 0.03×", f"{hot['llama80']:.3f}×", hot["llama80"] <= 0.03))
    colds = {r["key"]: r["cold"]["fxprop"]["seconds"] / r["cold"]["FakeTensorProp"]["seconds"]
             for r in rows if "seconds" in r["cold"].get("fxprop", {}) and "seconds" in r["cold"].get("FakeTensorProp", {})}
    if colds:
        g = geomean(list(colds.values()))
        worst = max(colds, key=colds.get)
        out.append(("cold ≤ 0.5× (geometric mean)", f"{g:.3f}× (worst {colds[worst]:.3f}×, {names[worst]})", g <= 0.5))
        call_rss = {r["key"]: r["cold"]["fxprop"]["call_peak_rss_mb"] for r in rows if r["key"] in colds}
        with_import = {r["key"]: r["cold"]["fxprop"]["peak_rss_mb"] for r in rows if r["key"] in colds}
        worst = max(call_rss, key=call_rss.get)
        worst_import = max(with_import, key=with_import.get)
        out.append(("peak RSS Δ of a propagate ≤ 50 MB (fresh process, every graph)",
                    f"max {call_rss[worst]:.1f} MB ({names[worst]}); with fxprop's import "
                    f"max {with_import[worst_import]:.1f} MB", call_rss[worst] <= 50))
    llama = sorted((r["layers"], r) for r in rows if r["layers"])
    if len(llama) >= 3:
        (l0, r0), (l1, r1) = llama[0], llama[-1]
        figures, ok = [], True
        for label in ("first", "hot"):
            growth = (r1[f"{label}_fxprop"] / l1) / (r0[f"{label}_fxprop"] / l0)
            slope, intercept, r2 = fit_line([l for l, _ in llama], [r[f"{label}_fxprop"] for _, r in llama])
            figures.append(f"{label}: {slope * 1e3:.2f} ms/layer, R² {r2:.3f}, per-layer time at {l1} / at {l0} "
                           f"= {growth:.2f}")
            ok = ok and growth <= 1.2 and r2 >= 0.98
        out.append((f"time linear in layer count (Llama {', '.join(str(l) for l, _ in llama)}; "
                    f"R² ≥ 0.98 and per-layer time at {l1} ≤ 1.2× that at {l0})", "; ".join(figures), ok))
    out.append(("zero real-tensor bytes materialized", f"{sum(r['fallback_bytes'] for r in rows)} bytes",
                sum(r["fallback_bytes"] for r in rows) == 0))
    return out


def source_state() -> str:
    """The commit measured, and whether fxprop/ had uncommitted edits (read-only git calls)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE.parent, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "fxprop"], capture_output=True, text=True,
                               cwd=HERE.parent, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "an unknown commit"
    return f"commit {head}" + (" with uncommitted edits under fxprop/" if dirty else "") if head else "an unknown commit"


def render(rows, profiles, notes, args) -> str:
    loads = notes["loads"]
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} with `{COMMAND}` at {source_state()}, on {os.cpu_count()} "
             f"CPU cores, torch {torch.__version__}; 1-minute load average {loads[0]:.2f} at the start, "
             f"{min(loads):.2f}-{max(loads):.2f} during the run (other processes share the machine). "
             f"Medians of {args.runs} calls per method and regime; cold: {args.cold_runs} fresh process(es) "
             f"per method and graph. Whole run: {notes['elapsed'] / 60:.1f} min.", "",
             "µs per node; ratio = fxprop / FakeTensorProp (lower is better).", "",
             "| graph | nodes | first sight fxprop | FakeTensorProp | ratio | hot fxprop | FakeTensorProp | ratio "
             "| cold fxprop (s) | FakeTensorProp (s) | ratio | fxprop peak RSS Δ, fresh process (MB) | fallback bytes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        n = r["nodes"]
        c = r["cold"]
        if "seconds" in c.get("fxprop", {}) and "seconds" in c.get("FakeTensorProp", {}):
            ours, theirs = c["fxprop"], c["FakeTensorProp"]
            cold_cells = (f"{ours['seconds']:.2f} ({ours['import_s']:.2f} import) | {theirs['seconds']:.2f} | "
                          f"{ours['seconds'] / theirs['seconds']:.2f} | {ours['call_peak_rss_mb']:.1f} "
                          f"({ours['peak_rss_mb']:.1f} with import)")
        elif c:
            cold_cells = f"error: {c} | — | — | —"
        else:
            cold_cells = "— | — | — | —"
        lines.append(
            f"| {r['graph']} | {n} | {us_per_node(r['first_fxprop'], n)} | {us_per_node(r['first_FakeTensorProp'], n)} | "
            f"{r['first_fxprop'] / r['first_FakeTensorProp']:.3f} | {us_per_node(r['hot_fxprop'], n)} | "
            f"{us_per_node(r['hot_FakeTensorProp'], n)} | {r['hot_fxprop'] / r['hot_FakeTensorProp']:.3f} | "
            f"{cold_cells} | {r['fallback_bytes']} |")
    first = [r["first_fxprop"] / r["first_FakeTensorProp"] for r in rows]
    hot = [r["hot_fxprop"] / r["hot_FakeTensorProp"] for r in rows]
    colds = [r["cold"]["fxprop"]["seconds"] / r["cold"]["FakeTensorProp"]["seconds"] for r in rows
             if "seconds" in r["cold"].get("fxprop", {}) and "seconds" in r["cold"].get("FakeTensorProp", {})]
    lines.append(f"| **geometric mean** | | | | **{geomean(first):.3f}** | | | **{geomean(hot):.3f}** | | | "
                 f"**{geomean(colds):.3f}** | | |" if colds else
                 f"| **geometric mean** | | | | **{geomean(first):.3f}** | | | **{geomean(hot):.3f}** | | | — | | |")
    lines += ["", "Seconds per call (medians):", "",
              "| graph | first sight fxprop | FakeTensorProp | hot fxprop | FakeTensorProp | "
              "fxprop Python-heap peak, first sight (MB, tracemalloc) |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['first_fxprop']:.4f} | {r['first_FakeTensorProp']:.4f} | "
                     f"{r['hot_fxprop']:.4f} | {r['hot_FakeTensorProp']:.4f} | {r['heap_mb']:.1f} |")

    llama = sorted((r["layers"], r) for r in rows if r["layers"])
    if len(llama) >= 2:
        lines += ["", "Time against layer count (Llama on meta):", "",
                  "| layers | nodes | first sight fxprop ms/layer | FakeTensorProp ms/layer | hot fxprop ms/layer | "
                  "FakeTensorProp ms/layer | fxprop Python-heap peak, KB per node | timed calls |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for layers, r in llama:
            lines.append(f"| {layers} | {r['nodes']} | {r['first_fxprop'] / layers * 1e3:.2f} | "
                         f"{r['first_FakeTensorProp'] / layers * 1e3:.2f} | {r['hot_fxprop'] / layers * 1e3:.2f} | "
                         f"{r['hot_FakeTensorProp'] / layers * 1e3:.2f} | {r['heap_mb'] * 1024 / r['nodes']:.2f} | "
                         f"{r['runs']} |")
        xs = [l for l, _ in llama]
        lines.append("")
        for label, title in (("first", "first sight"), ("hot", "hot")):
            for name in ORDER:
                slope, intercept, r2 = fit_line(xs, [r[f"{label}_{name}"] for _, r in llama])
                lines.append(f"- {title}, {name}: {slope * 1e3:.2f} ms per layer + {intercept * 1e3:.1f} ms "
                             f"(least squares, R² {r2:.3f})")
    if "incremental" in notes:
        data = notes["incremental"]
        lines += ["", f"Incremental re-propagation on Llama-80 ({data['nodes']} nodes, hot): one node replaced, "
                      f"{data['touched']} nodes re-annotated in {data['incremental'] * 1000:.1f} ms "
                      f"(full propagate of the edited graph: {data['full'] * 1000:.1f} ms)."]

    lines += ["", "## Targets", "", "| target | measured | |", "|---|---|---|"]
    for title, figure, ok in targets(rows):
        lines.append(f"| {title} | {figure} | {verdict(ok)} |")

    for key in ("first sight", "hot"):
        stats = profiles.get(key)
        if stats is None:
            continue
        lines += ["", f"## Where fxprop's {key} time goes", "",
                  f"cProfile over one {key} propagate of every graph above ({stats.total_tt:.2f} s profiled in all; "
                  f"cProfile inflates small Python calls, so read the shares, not the seconds).", "",
                  "Top 10 by own time:", ""] + profile_table(stats, "tottime")
        lines += ["", "Top 10 by cumulative time (entries spanning ≥ 90 % of the total left out):", ""]
        lines += profile_table(stats, "cumtime")
    if notes.get("cold_profile"):
        case_name, stats = notes["cold_profile"]
        case_name = next((r["graph"] for r in rows if r["key"] == case_name), case_name)
        lines += ["", "## Where fxprop's cold time goes", "",
                  f"cProfile over a fresh process's `import fxprop` plus first propagate of {case_name} "
                  f"({stats.total_tt:.2f} s profiled).", "", "Top 10 by own time:", ""]
        lines += profile_table(stats, "tottime")
        lines += ["", "Top 10 by cumulative time (entries spanning ≥ 90 % of the total left out):", ""]
        lines += profile_table(stats, "cumtime")

    lines += ["", "## fxprop's import (cold regime)", "",
              "`python -X importtime -c 'import torch; import fxprop'`, the modules imported after torch, "
              "by own time:", "", "| module | own (s) | cumulative (s) |", "|---|---:|---:|"]
    for name, own, cumulative in notes["import"]:
        lines.append(f"| {name} | {own:.3f} | {cumulative:.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
