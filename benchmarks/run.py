"""fxprop against torch's FakeTensorProp on the same graphs, in one run, side by side.

    .venv/bin/python benchmarks/run.py                  # everything (~25 min on 2 cores), writes benchmarks/results.md
    .venv/bin/python benchmarks/run.py --quick          # one iteration (~3 min): fewer runs, no cold, no Llama-160/800
    .venv/bin/python benchmarks/run.py --profile-only   # only the three cProfile summaries, printed (~15 s)
    .venv/bin/python benchmarks/run.py --cases gpt2 llama80 --runs 3 --no-cold --no-symbolic --no-aot

Graphs (benchmarks/models.py; no downloads, HF models from configs built in code)
             GPT-2-style stacks (symbolic_trace, torch.export), a GPT block (make_fx), HF GPT-2 and
             BERT (torch.export), a ResNet-18-style CNN, a channels-last CNN, a module of views and
             in-place ops, a ResNet block with BatchNorm in training, Llama-8/32/80/160/800 on meta.
first sight  warm process (both methods have propagated an unrelated graph first); before every
             timed call both caches are emptied (`fxprop.rule_cache.clear()`,
             `FakeTensorMode.cache_clear()`); every call gets a fresh copy of the graph; the
             methods alternate (and swap who goes first every round); median of --runs (at most
             3 runs above 5,000 nodes, one above 20,000).
hot          the same, with both caches warm: each method has propagated this very graph twice
             before the timed calls (fxprop keeps a graph's walk from its second sighting and
             replays it whole from its third; FakeTensorMode's cache fills on the first).
cold         a fresh process per method and graph (benchmarks/cold.py): the graph is built,
             then the clock covers the method's import and its first call; median of --cold-runs.
             fxprop's modules are byte-compiled first, as a pip install leaves torch's (an
             editable install under PYTHONDONTWRITEBYTECODE would compile its sources in every
             process).

Symbolic section (benchmarks/dynamic.py; --symbolic, --no-symbolic)
             ``torch.export.export(..., dynamic_shapes=...)`` with ``Dim`` batch and seq on HF GPT-2,
             Llama and BERT (4 layers, tests/corpus configs), and Dim seq on the Llama of
             fxprop/examples/__init__.py with meta parameters (Llama-3-70B sizes; 8, 32, 80 and 800 layers,
             the last 53,629 nodes, ~2 min to export). ``fxprop.propagate(ep)`` (no inputs: the
             traced values) against ``FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*vals)``
             with the placeholders' ``meta["val"]`` in the program's own FakeTensorMode and ShapeEnv;
             fresh copies of the graph/program per call, caches cleared as above. Each method first
             annotates the program once untimed (the ShapeEnv's own memos warm, as after export;
             not above 20,000 nodes); at most 3 timed calls per regime above 1,000 nodes, one
             above 5,000, first sight only above 20,000. "differ" counts nodes whose fxprop value
             the ShapeEnv cannot prove equal to export's (checked up to 5,000 nodes).
AOT section  (benchmarks/dynamic.py; --aot-models, --no-aot) tests/corpus models (default llama,
             bert, t5) in training mode, ``torch.compile(dynamic=False / True)`` with a backend
             that times both methods on dynamo's graph and then hands it to
             ``aot_autograd(fw_compiler, bw_compiler)`` whose compilers time
             ``fxprop.propagate(gm, *example_inputs)`` against inductor's
             ``fake_tensor_prop(gm, example_inputs, force_allow_non_fake_inputs=True)`` on the forward
             and backward graphs (median of at most 3 runs). Also fxprop's first sight inside the
             dynamic=True backend against its own first sight inside the static one, same model.
Profiles     cProfile of one first-sight ``fxprop.propagate`` (after one unprofiled first-sight
             call) of a small graph (GPT block, make_fx), a large one (Llama-80) and a symbolic one
             (HF GPT-2 with Dims): top 12 by own and by cumulative time, with shares of the total.

--quick: --runs 2, no cold, no Llama-160/800, symbolic programs at first sight only (HF three and
Llama 4/8/16), AOT on llama only; no import profile, no all-graphs profile, no tracemalloc heap
peak; at most 30 s waiting for a quiet machine. Garbage is collected before every timed
call, outside the clock. Targets are checked and printed (MET / MISSED with the measured figure);
nothing here fails on a missed target.
"""
from __future__ import annotations

import argparse
import compileall
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
import dynamic  # noqa: E402
from methods import METHODS, clear_caches  # noqa: E402
from models import CASES, LARGE_NODES, Case, fresh_copy, restore_buffers, warmup  # noqa: E402

MEDIUM_NODES = 5_000  # graphs above this get at most 3 timed calls per method and regime
QUICK_SKIPS = ("llama160", "llama800")
DEFAULT_SYMBOLIC = ("hf_gpt2_dim", "hf_llama_dim", "hf_bert_dim", "llama8_dim", "llama32_dim", "llama80_dim",
                    "llama800_dim")
QUICK_SYMBOLIC = ("hf_gpt2_dim", "hf_llama_dim", "hf_bert_dim", "llama4_dim", "llama8_dim", "llama16_dim")
DEFAULT_AOT = ("llama", "bert", "t5")
AOT_MAX_RUNS = 3  # timed calls per method, regime and graph in the AOT section
QUICK_AOT = ("llama",)
FIRST_SIGHT_TARGET, HOT_MEAN_TARGET, HOT_EACH_TARGET = 0.10, 0.03, 0.05
SYMBOLIC_TARGET, DYNAMIC_OVER_STATIC_TARGET = 0.25, 2.0

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
    restore = restore_buffers(case.gm)
    if first_sight:
        clear_caches()
    gc.collect()  # outside the clock: no call pays for the garbage of the one before
    start = time.perf_counter()
    METHODS[method](gm, case)
    elapsed = time.perf_counter() - start
    restore()
    return elapsed


def regime(case: Case, runs: int, *, first_sight: bool) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in ORDER}
    if not first_sight:
        for _ in range(2):  # warm both caches on this graph (fxprop keeps a graph at its second sighting)
            for name in ORDER:
                timed(case, name, first_sight=False)
    for round_ in range(runs):
        for name in ORDER if round_ % 2 == 0 else reversed(ORDER):
            times[name].append(timed(case, name, first_sight=first_sight))
    return times


def profiled(case: Case, profiles: dict[str, pstats.Stats | None], key: str, *, first_sight: bool) -> None:
    if first_sight:
        clear_caches()
    else:
        for _ in range(2):  # as the hot regime warms: kept at the second sighting, replayed from the third
            fxprop.propagate(fresh_copy(case.gm), *case.meta_inputs)
    gm = fresh_copy(case.gm)
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


def byte_compile_fxprop() -> None:
    """fxprop's modules byte-compiled where their bytecode is missing or stale, so that a fresh
    process reads bytecode as it does for torch's."""
    compileall.compile_dir(str(Path(fxprop.__file__).parent), quiet=1)


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


def case_runs(nodes: int, runs: int) -> int:
    return 1 if nodes > LARGE_NODES else min(runs, 3) if nodes > MEDIUM_NODES else runs


def measure_cases(args, profiles: dict, notes: dict, loads: list) -> list[dict]:
    rows = []
    for case_name in args.cases:
        print(f"[{case_name}] building", file=sys.stderr, flush=True)
        case = CASES[case_name]()
        nodes = len(case.gm.graph.nodes)
        large = nodes > LARGE_NODES
        runs = case_runs(nodes, args.runs)
        first = regime(case, runs, first_sight=True)
        hot = regime(case, runs, first_sight=False)
        probe = fresh_copy(case.gm)
        fxprop.propagate(probe, *case.meta_inputs)
        if not large and not args.quick:  # the profiles' shares stay those of ordinary graphs
            profiled(case, profiles, "first sight", first_sight=True)
            profiled(case, profiles, "hot", first_sight=False)
        row = {"key": case_name, "graph": case.name, "nodes": nodes,
               "transformer": case.transformer, "layers": case.layers,
               "fallback_bytes": probe.meta["fxprop"]["fallback_bytes"],
               "heap_mb": math.nan if args.quick else python_heap_peak_mb(case)}
        for label, times in (("first", first), ("hot", hot)):
            for name in ORDER:
                row[f"{label}_{name}"] = statistics.median(times[name])
        row["runs"] = runs
        if case_name == "llama80":
            notes["incremental"] = incremental(case, 1 if args.quick else 3)
        del case, probe
        gc.collect()
        row["cold"] = {} if args.no_cold or large else cold(case_name, args.cold_runs)
        loads.append(load())
        print(f"  first sight {row['first_fxprop']:.4f}s vs {row['first_FakeTensorProp']:.4f}s   "
              f"hot {row['hot_fxprop']:.4f}s vs {row['hot_FakeTensorProp']:.4f}s   cold {row['cold']}   "
              f"load {loads[-1]:.2f}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def measure_programs(args, loads: list) -> list[dict]:
    """The symbolic section: exported programs with Dims (benchmarks/dynamic.py)."""
    rows = []
    for key in args.symbolic:
        print(f"[{key}] exporting", file=sys.stderr, flush=True)
        program = dynamic.PROGRAMS[key]()
        nodes = program.nodes
        # symbolic calls cost ~1.5 ms per node: fewer timed calls on the larger programs
        runs = 1 if nodes > MEDIUM_NODES else min(args.runs, 3) if nodes > 1_000 else args.runs
        row = {"key": key, "graph": program.name, "nodes": nodes, "layers": program.layers,
               "export_s": program.export_s, "runs": runs}
        if nodes <= LARGE_NODES:  # the program's ShapeEnv memos warm for both methods, as after export
            for name in ORDER:
                dynamic.timed_program(program, name, first_sight=True)
        for label, first_sight in (("first", True), ("hot", False)):
            if label == "hot" and (nodes > LARGE_NODES or args.quick):
                continue  # first sight only on the largest programs, and with --quick
            times = dynamic.program_regime(program, runs, first_sight=first_sight)
            for name in ORDER:
                row[f"{label}_{name}"] = statistics.median(times[name])
        row["differ"] = dynamic.program_differences(program) if nodes <= MEDIUM_NODES else None
        del program
        gc.collect()
        loads.append(load())
        print(f"  export {row['export_s']:.1f}s; first sight {row['first_fxprop']:.4f}s vs "
              f"{row['first_FakeTensorProp']:.4f}s   differ {row['differ']}   load {loads[-1]:.2f}",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def measure_compiled(args, loads: list) -> list[dict]:
    """The AOT section: dynamo's graph, AOTAutograd's forward and backward, static and dynamic=True."""
    rows = []
    for name in args.aot_models:
        for is_dynamic in (False, True):
            print(f"[{name} dynamic={is_dynamic}] compiling", file=sys.stderr, flush=True)
            try:
                result = dynamic.compile_measure(name, is_dynamic, min(args.runs, AOT_MAX_RUNS))
            except Exception as error:  # noqa: BLE001 (reported in the table)
                result = {stage: [] for stage in dynamic.STAGES}
                result["errors"] = [f"compile: {type(error).__name__}: {str(error).strip().splitlines()[0][:120]}"]
            rows.append({"model": name, "dynamic": is_dynamic, **result})
            loads.append(load())
            print(f"  {', '.join(f'{stage} {len(result[stage])} graph(s)' for stage in dynamic.STAGES)}; "
                  f"errors {result['errors']}", file=sys.stderr, flush=True)
    return rows


PROFILE_GRAPHS = (("small", "gpt_block_make_fx"), ("large", "llama80"), ("symbolic", "hf_gpt2_dim"))


def graph_profiles() -> list[tuple[str, str, int, pstats.Stats]]:
    """cProfile of one first-sight propagate of each PROFILE_GRAPHS graph, after one unprofiled
    first-sight call (as the timed first-sight calls are: a warm process, empty caches)."""
    out = []
    for label, key in PROFILE_GRAPHS:
        if key in CASES:
            case = CASES[key]()
            title, nodes = case.name, len(case.gm.graph.nodes)

            def prepare(case=case):
                gm = fresh_copy(case.gm)
                return lambda: fxprop.propagate(gm, *case.meta_inputs)
        else:
            program = dynamic.PROGRAMS[key]()
            title, nodes = program.name, program.nodes

            def prepare(program=program):
                return dynamic.program_call(program.program, "fxprop")
        for profile in (False, True):
            call = prepare()
            clear_caches()
            gc.collect()
            if not profile:
                call()
                continue
            profiler = cProfile.Profile()
            profiler.enable()
            call()
            profiler.disable()
            out.append((label, title, nodes, pstats.Stats(profiler, stream=io.StringIO())))
    return out


def render_graph_profiles(profiles, top: int = 12) -> list[str]:
    lines = ["", "## Profiles: one first-sight propagate of a small, a large and a symbolic graph", "",
             f"`{COMMAND} --profile-only` prints this section alone. cProfile of one first-sight "
             "`fxprop.propagate` (warm process, caches emptied, after one unprofiled first-sight call of the "
             "same graph); cProfile inflates small Python calls, so read the shares, not the seconds."]
    for label, title, nodes, stats in profiles:
        lines += ["", f"### {label}: {title} ({nodes:,} nodes, {stats.total_tt:.3f} s profiled)", "",
                  f"Top {top} by own time:", ""] + profile_table(stats, "tottime", top)
        lines += ["", f"Top {top} by cumulative time (entries spanning ≥ 90 % of the total left out):", ""]
        lines += profile_table(stats, "cumtime", top)
    return lines


def warm_process() -> None:
    """Both methods propagate an unrelated graph (cold and hot) before any timing."""
    warm_case = warmup()
    for _ in range(2):
        regime(warm_case, 1, first_sight=True)
        regime(warm_case, 1, first_sight=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=None, choices=list(CASES))
    parser.add_argument("--symbolic", nargs="*", default=None, choices=list(dynamic.PROGRAMS),
                        help="exported programs with Dims (default: the HF three and Llama 8/32/80/800)")
    parser.add_argument("--aot-models", nargs="*", default=None,
                        help=f"tests/corpus models for the AOT section (default: {' '.join(DEFAULT_AOT)})")
    parser.add_argument("--runs", type=int, default=None, help="timed calls per method, regime and graph (5)")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes per method and graph")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process measurements")
    parser.add_argument("--no-symbolic", action="store_true", help="skip the torch.export Dim section")
    parser.add_argument("--no-aot", action="store_true", help="skip the torch.compile / AOTAutograd section")
    parser.add_argument("--quick", action="store_true",
                        help="one iteration in ~3 min: --runs 2, no cold, no Llama-160/800, symbolic at first "
                             "sight only with a small Llama sweep, AOT on llama only, no import profile")
    parser.add_argument("--profile-only", action="store_true",
                        help="print only the three cProfile summaries (small, large, symbolic graph)")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="wait for a 1-minute load below this")
    parser.add_argument("--patience", type=float, default=None, help="seconds to wait for that load at most (600)")
    parser.add_argument("--out", default=str(HERE / "results.md"))
    args = parser.parse_args()
    args.runs = args.runs or (2 if args.quick else 5)
    args.patience = args.patience if args.patience is not None else 30 if args.quick else 600
    args.no_cold = args.no_cold or args.quick
    if args.cases is None:
        args.cases = [c for c in CASES if not (args.quick and c in QUICK_SKIPS)]
    if args.symbolic is None:
        args.symbolic = [] if args.no_symbolic else list(QUICK_SYMBOLIC if args.quick else DEFAULT_SYMBOLIC)
    if args.aot_models is None:
        args.aot_models = [] if args.no_aot else list(QUICK_AOT if args.quick else DEFAULT_AOT)

    started = time.perf_counter()
    if args.profile_only:
        warm_process()
        print("\n".join(render_graph_profiles(graph_profiles())[1:]))
        print(f"\n({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        return 0

    if not args.no_cold:
        byte_compile_fxprop()
    load_start = wait_for_quiet(args.quiet_load, args.patience)
    print(f"load at start {load_start:.2f}", file=sys.stderr, flush=True)
    warm_process()

    profiles, notes, loads, sections = {}, {}, [load_start], {}
    clock = time.perf_counter()
    rows = measure_cases(args, profiles, notes, loads)
    sections["graphs"], clock = time.perf_counter() - clock, time.perf_counter()
    programs = measure_programs(args, loads)
    sections["symbolic"], clock = time.perf_counter() - clock, time.perf_counter()
    compiled = measure_compiled(args, loads)
    sections["AOT"], clock = time.perf_counter() - clock, time.perf_counter()
    print("[profiles]", file=sys.stderr, flush=True)
    notes["graph_profiles"] = graph_profiles()
    if not args.quick:
        notes["import"] = import_profile()
    if not args.no_cold and args.cases:
        notes["cold_profile"] = cold_profile(args.cases[0])
    sections["profiles"] = time.perf_counter() - clock
    notes["loads"] = loads
    notes["sections"] = sections
    notes["elapsed"] = time.perf_counter() - started
    report = render(rows, programs, compiled, profiles, notes, args)
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
    lines = ["| function | calls | tottime (ms) | % | cumtime (ms) | % |", "|---|---:|---:|---:|---:|---:|"]
    for func, (_, ncalls, tottime, cumtime, _) in entries[:top]:
        lines.append(f"| `{short(func)}` | {ncalls:,} | {tottime * 1e3:,.1f} | {100 * tottime / total:.1f} | "
                     f"{cumtime * 1e3:,.1f} | {100 * cumtime / total:.1f} |")
    return lines


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def linearity(points: list[tuple[int, int, float]]) -> tuple[str, bool]:
    """points: (layers, nodes, seconds). Linear: R² ≥ 0.98 of seconds against layers, and the
    per-layer time of the largest graph at most 1.2× that of the smallest."""
    points = sorted(points)
    (l0, _, t0), (l1, n1, t1) = points[0], points[-1]
    growth = (t1 / l1) / (t0 / l0)
    slope, _, r2 = fit_line([p[0] for p in points], [p[2] for p in points])
    return (f"{slope * 1e3:.2f} ms/layer, R² {r2:.3f}, per-layer time at {l1} / at {l0} = {growth:.2f}",
            growth <= 1.2 and r2 >= 0.98)


def ratios(rows, label: str) -> dict[str, float]:
    return {r["key"]: r[f"{label}_fxprop"] / r[f"{label}_FakeTensorProp"] for r in rows if f"{label}_fxprop" in r}


def every(title: str, values: dict[str, float], names: dict[str, str], limit: float) -> tuple[str, str, bool]:
    worst = max(values, key=values.get)
    above = [k for k, v in values.items() if v > limit]
    return (title, f"worst {values[worst]:.3f}× ({names[worst]}); {len(above)} of {len(values)} above {limit:g}×",
            not above)


def compiled_ratio(row: dict, stage: str, regime: str = "first sight") -> float:
    ours = dynamic.stage_seconds(row[stage], regime, "fxprop")
    theirs = dynamic.stage_seconds(row[stage], regime, "FakeTensorProp")
    return ours / theirs


def dynamic_over_static(compiled, stage: str) -> dict[str, float]:
    """fxprop's first sight with dynamic=True over its first sight with dynamic=False, per model."""
    out = {}
    for row in compiled:
        if not row["dynamic"]:
            continue
        static = next((r for r in compiled if r["model"] == row["model"] and not r["dynamic"]), None)
        if static is not None:
            out[row["model"]] = (dynamic.stage_seconds(row[stage], "first sight", "fxprop")
                                 / dynamic.stage_seconds(static[stage], "first sight", "fxprop"))
    return out


def targets(rows, programs, compiled) -> list[tuple[str, str, bool]]:
    out = []
    names = {r["key"]: r["graph"] for r in rows + programs}
    first, hot = ratios(rows, "first"), ratios(rows, "hot")
    if first:
        title, figure, ok = every(f"first sight ≤ {FIRST_SIGHT_TARGET:g}× FakeTensorProp on every graph", first, names,
                                  FIRST_SIGHT_TARGET)
        out.append((title, f"geometric mean {geomean(list(first.values())):.3f}×; {figure}", ok))
        g = geomean(list(hot.values()))
        out.append((f"hot ≤ {HOT_MEAN_TARGET:g}× (geometric mean)", f"{g:.3f}×", g <= HOT_MEAN_TARGET))
        out.append(every(f"hot ≤ {HOT_EACH_TARGET:g}× on every graph", hot, names, HOT_EACH_TARGET))
    symbolic = ratios(programs, "first")
    if symbolic:
        out.append(every(f"symbolic: propagate(ep) of the Dim exports ≤ {SYMBOLIC_TARGET:g}× (first sight, each)",
                         symbolic, names, SYMBOLIC_TARGET))
    dynamic_rows = [r for r in compiled if r["dynamic"]]
    for stage in ("forward", "backward"):
        values = {r["model"]: compiled_ratio(r, stage) for r in dynamic_rows}
        values = {k: v for k, v in values.items() if not math.isnan(v)}
        if values:
            missing = len(dynamic_rows) - len(values)
            title, figure, ok = every(f"AOT dynamic=True {stage} ≤ {SYMBOLIC_TARGET:g}× (first sight, every model)",
                                      values, {k: k for k in values}, SYMBOLIC_TARGET)
            out.append((title, figure + (f"; {missing} model(s) without a ratio" if missing else ""), ok and not missing))
    values = {k: v for k, v in dynamic_over_static(compiled, "dynamo").items() if not math.isnan(v)}
    if values:
        worst = max(values, key=values.get)
        out.append((f"torch.compile(dynamic=True) backend: fxprop ≤ {DYNAMIC_OVER_STATIC_TARGET:g}× its static "
                    "first sight (every model)",
                    f"worst {values[worst]:.1f}× ({worst}); " + ", ".join(f"{k} {v:.1f}×" for k, v in values.items()),
                    values[worst] <= DYNAMIC_OVER_STATIC_TARGET))
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
    for title, group in (("Llama on meta, symbolic_trace", rows), ("Llama on meta, export with Dim seq", programs)):
        llama = [(r["layers"], r["nodes"], r) for r in group if r["layers"]]
        if len(llama) < 3:
            continue
        largest = max(n for _, n, _ in llama)
        figures, ok = [], largest >= 50_000
        for label in ("first", "hot"):
            points = [(l, n, r[f"{label}_fxprop"]) for l, n, r in llama if f"{label}_fxprop" in r]
            if len(points) >= 3 and max(n for _, n, _ in points) == largest:  # regimes measured up to the largest
                figure, linear = linearity(points)
                figures.append(f"{label}: {figure}")
                ok = ok and linear
        out.append((f"time linear in nodes up to ≥ 50,000 nodes ({title}: layers "
                    f"{', '.join(str(l) for l, _, _ in sorted(llama))}; R² ≥ 0.98, per-layer time at the largest "
                    f"≤ 1.2× that at the smallest)", f"largest graph {largest:,} nodes; " + "; ".join(figures), ok))
    if rows:
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


def fmt(value: float, spec: str) -> str:
    return "—" if math.isnan(value) else format(value, spec)


def ms(value: float) -> str:
    return "failed" if math.isnan(value) else f"{value * 1e3:,.1f}"


def ratio_cell(ours: float, theirs: float) -> str:
    return "—" if math.isnan(ours) or math.isnan(theirs) else f"{ours / theirs:.3f}"


def render_graphs(rows, notes) -> list[str]:
    lines = ["", "## Graphs", "", "µs per node; ratio = fxprop / FakeTensorProp (lower is better).", "",
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
              "fxprop Python-heap peak, first sight (MB, tracemalloc) | timed calls |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['first_fxprop']:.4f} | {r['first_FakeTensorProp']:.4f} | "
                     f"{r['hot_fxprop']:.4f} | {r['hot_FakeTensorProp']:.4f} | {fmt(r['heap_mb'], '.1f')} | {r['runs']} |")

    llama = sorted((r["layers"], r) for r in rows if r["layers"])
    if len(llama) >= 2:
        lines += ["", "Time against layer count (Llama on meta):", "",
                  "| layers | nodes | first sight fxprop ms/layer | FakeTensorProp ms/layer | hot fxprop ms/layer | "
                  "FakeTensorProp ms/layer | fxprop Python-heap peak, KB per node | timed calls |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for layers, r in llama:
            lines.append(f"| {layers} | {r['nodes']} | {r['first_fxprop'] / layers * 1e3:.2f} | "
                         f"{r['first_FakeTensorProp'] / layers * 1e3:.2f} | {r['hot_fxprop'] / layers * 1e3:.2f} | "
                         f"{r['hot_FakeTensorProp'] / layers * 1e3:.2f} | {fmt(r['heap_mb'] * 1024 / r['nodes'], '.2f')} | "
                         f"{r['runs']} |")
        lines.append("")
        lines += fit_lines(llama)
    if "incremental" in notes:
        data = notes["incremental"]
        lines += ["", f"Incremental re-propagation on Llama-80 ({data['nodes']} nodes, hot): one node replaced, "
                      f"{data['touched']} nodes re-annotated in {data['incremental'] * 1000:.1f} ms "
                      f"(full propagate of the edited graph: {data['full'] * 1000:.1f} ms)."]
    return lines


def fit_lines(llama) -> list[str]:
    xs = [l for l, _ in llama]
    lines = []
    for label, title in (("first", "first sight"), ("hot", "hot")):
        for name in ORDER:
            points = [(l, r[f"{label}_{name}"]) for l, r in llama if f"{label}_{name}" in r]
            if len(points) < 2:
                continue
            slope, intercept, r2 = fit_line([l for l, _ in points], [t for _, t in points])
            lines.append(f"- {title}, {name}: {slope * 1e3:.2f} ms per layer + {intercept * 1e3:.1f} ms "
                         f"(least squares over {len(points)} of {len(xs)} sizes, R² {r2:.3f})")
    return lines


def render_programs(programs) -> list[str]:
    lines = ["", "## Symbolic: torch.export with Dims", "",
             "`fxprop.propagate(ep)` (no inputs: the traced FakeTensors, in the program's ShapeEnv) against "
             "`FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*placeholder vals)` in the program's own "
             "FakeTensorMode; ms per call (medians); ratio = fxprop / FakeTensorProp; differ = nodes whose fxprop "
             "value the ShapeEnv cannot prove equal to the one export traced (— : not checked, large graph). "
             "The ShapeEnv keeps its own memos across calls, which neither method's cache clearing empties: each "
             "method annotates the program once, untimed, before the timed calls (up to 20,000 nodes).", "",
             "| program | nodes | export (s) | first sight fxprop | FakeTensorProp | ratio | hot fxprop | "
             "FakeTensorProp | ratio | µs/node first sight fxprop | differ | timed calls |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in programs:
        hot = (f"{ms(r['hot_fxprop'])} | {ms(r['hot_FakeTensorProp'])} | "
               f"{r['hot_fxprop'] / r['hot_FakeTensorProp']:.3f}" if "hot_fxprop" in r else "— | — | —")
        lines.append(f"| {r['graph']} | {r['nodes']:,} | {r['export_s']:.1f} | {ms(r['first_fxprop'])} | "
                     f"{ms(r['first_FakeTensorProp'])} | {r['first_fxprop'] / r['first_FakeTensorProp']:.3f} | {hot} | "
                     f"{us_per_node(r['first_fxprop'], r['nodes'])} | "
                     f"{'—' if r['differ'] is None else r['differ']} | {r['runs']} |")
    first = [r["first_fxprop"] / r["first_FakeTensorProp"] for r in programs]
    lines.append(f"| **geometric mean** | | | | | **{geomean(first):.3f}** | | | | | | |")
    llama = sorted((r["layers"], r) for r in programs if r["layers"])
    if len(llama) >= 2:
        lines += ["", "Against layer count (Llama on meta, Dim seq):", ""] + fit_lines(llama)
    return lines


def render_compiled(compiled) -> list[str]:
    lines = ["", "## torch.compile: dynamo's graph, AOTAutograd's forward and backward", "",
             "tests/corpus models (tiny configs) in training mode, compiled by a backend that times both methods on "
             "dynamo's graph, then hands it to `aot_autograd(fw_compiler, bw_compiler)` whose compilers time both "
             "on the forward and backward graphs with the example inputs they get: `fxprop.propagate(gm, "
             "*example_inputs)` against inductor's `fake_tensor_prop(gm, example_inputs, "
             "force_allow_non_fake_inputs=True)` (dynamo's FakeTensorMode and ShapeEnv). ms per stage, summed over "
             "its graphs (graphs that AOTAutograd sent back for a restart of dynamo's analysis left out); "
             "dynamo's graph is timed at first sight only; ratio = fxprop / FakeTensorProp.", "",
             "| model | dynamic | stage | graphs | nodes | first sight fxprop | FakeTensorProp | ratio | hot fxprop | "
             "FakeTensorProp | ratio |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    failures = []
    for row in compiled:
        failures += [f"- {row['model']}, dynamic={row['dynamic']}: {error}" for error in row["errors"]]
        for stage in dynamic.STAGES:
            graphs = dynamic.kept(row[stage])
            for graph in row[stage]:
                dropped = f" (graph dropped: {graph['discarded']})" if "discarded" in graph else ""
                for method, error in graph["errors"].items():
                    failures.append(f"- {row['model']}, dynamic={row['dynamic']}, {stage} graph of {graph['nodes']} "
                                    f"nodes{dropped}: {method} failed: `{error}`")
            cells = [row["model"], str(row["dynamic"]), stage, str(len(graphs)), str(sum(g["nodes"] for g in graphs))]
            for regime in ("first sight", "hot"):
                if stage == "dynamo" and regime == "hot":
                    cells += ["—", "—", "—"]
                    continue
                ours = dynamic.stage_seconds(row[stage], regime, "fxprop")
                theirs = dynamic.stage_seconds(row[stage], regime, "FakeTensorProp")
                cells += [ms(ours), ms(theirs), ratio_cell(ours, theirs)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "fxprop's first sight with dynamic=True over its own first sight with dynamic=False, same model "
                  "(the graphs differ: dynamo's dynamic graph carries SymInt inputs and size arithmetic):", "",
              "| model | dynamo's graph (the backend) | AOT forward | AOT backward |", "|---|---:|---:|---:|"]
    per_stage = {stage: dynamic_over_static(compiled, stage) for stage in dynamic.STAGES}
    for model in per_stage["dynamo"]:
        lines.append(f"| {model} | " + " | ".join(
            "—" if math.isnan(per_stage[stage].get(model, math.nan)) else f"{per_stage[stage][model]:.1f}×"
            for stage in dynamic.STAGES) + " |")
    if failures:
        lines += ["", "Failures (that method gets no time on that stage):", ""] + failures
    return lines


def render(rows, programs, compiled, profiles, notes, args) -> str:
    loads = notes["loads"]
    sections = ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in notes["sections"].items())
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} with `{COMMAND}{' --quick' if args.quick else ''}` at "
             f"{source_state()}, on {os.cpu_count()} CPU cores, torch {torch.__version__}; 1-minute load average "
             f"{loads[0]:.2f} at the start, {min(loads):.2f}-{max(loads):.2f} during the run (other processes share "
             f"the machine). Medians of {args.runs} calls per method and regime (fewer on large graphs: see "
             f"'timed calls'); cold: "
             + ("none" if args.no_cold else f"{args.cold_runs} fresh process(es) per method and graph, "
                                              "fxprop's modules byte-compiled as a pip install leaves torch's")
             + f". Whole run: {notes['elapsed'] / 60:.1f} min (minutes per section: {sections}).",
             "", "## Targets", "", "| target | measured | |", "|---|---|---|"]
    for title, figure, ok in targets(rows, programs, compiled):
        lines.append(f"| {title} | {figure} | {verdict(ok)} |")
    if rows:
        lines += render_graphs(rows, notes)
    if programs:
        lines += render_programs(programs)
    if compiled:
        lines += render_compiled(compiled)
    if notes.get("graph_profiles"):
        lines += render_graph_profiles(notes["graph_profiles"])

    for key in ("first sight", "hot"):
        stats = profiles.get(key)
        if stats is None:
            continue
        lines += ["", f"## Where fxprop's {key} time goes, all graphs together", "",
                  f"cProfile over one {key} propagate of every graph of the first table up to {LARGE_NODES:,} nodes "
                  f"({stats.total_tt:.2f} s profiled in all; cProfile inflates small Python calls, so read the "
                  f"shares, not the seconds).", "", "Top 10 by own time:", ""] + profile_table(stats, "tottime")
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

    if notes.get("import"):
        lines += ["", "## fxprop's import (cold regime)", "",
                  "`python -X importtime -c 'import torch; import fxprop'`, the modules imported after torch, "
                  "by own time:", "", "| module | own (s) | cumulative (s) |", "|---|---:|---:|"]
        for name, own, cumulative in notes["import"]:
            lines.append(f"| {name} | {own:.3f} | {cumulative:.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
