#!/usr/bin/env python
"""Run fxprop over the whole corpus of real transformers models and compare with real execution.

    python tools/corpus_sweep.py                          # every model, traces export,module,dynamo,fx
    python tools/corpus_sweep.py --traces export          # the primary trace only (fastest)
    python tools/corpus_sweep.py --traces all             # also module_spec (ep.module() from TensorSpecs)
    python tools/corpus_sweep.py --models llama,t5 -v     # some models, all mismatches printed
    python tools/corpus_sweep.py --ci                     # tests/test_corpus.py's slice
    python tools/corpus_sweep.py --jobs 4 --json out.json
    python tools/corpus_sweep.py --training               # training graphs: traces aot,aot_dynamic,joint
    python tools/corpus_sweep.py --training --models llama -v

Prints a markdown table (architecture, family, trace, nodes, result, seconds, known failure) with
one row per model x trace: OK / MISMATCH (first mismatching node) / FXPROP-ERROR (type and
first line) / SIDE-EFFECT / LEAK / EXPORT-FAILED (torch could not trace it: not fxprop's fault)
/ REAL-FAILED (torch's graph does not run: not fxprop's) / BUILD-FAILED, then a count per status,
then fxprop's failures grouped by root-cause signature (status, op, error type or field), with
the models each one affects. Exits 1 when any fxprop fault was found. Models are built from tiny
configs in code (tests/corpus/models.py); nothing is downloaded.

``--training`` checks training graphs instead (tests/corpus/training.py): with the model in train
mode, AOT's forward and backward graphs under ``torch.compile`` (``aot`` static, ``aot_dynamic``
with ``dynamic=True`` over two calls of different sizes) and a ``make_fx`` joint graph of the loss
and its gradients (``joint``), every node against a real run of that graph; a guard propagation
adds to dynamo's ShapeEnv is a failure (GUARD). A model ``torch.compile`` cannot compile with the
``aot_eager`` backend either is COMPILE-FAILED (torch's, not fxprop's), with torch's error.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.harness import (DEFAULT_TRACES, FXPROP_FAULTS, OK, TRACES, TRAINING_TRACES, Outcome,  # noqa: E402
                                  check_case)
from tests.corpus.known_failures import KNOWN_FAILURES, key  # noqa: E402
from tests.corpus.models import CASES, CI_SLICE  # noqa: E402


def _run_model(name: str, traces: list[str]) -> list[Outcome]:
    import torch
    torch.set_num_threads(1)
    return [check_case(name, how) for how in traces]


def _cell(outcome: Outcome, width: int) -> str:
    text = outcome.short()
    return text if len(text) <= width else text[:width - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    parser.add_argument("--ci", action="store_true", help="only tests/test_corpus.py's CI slice")
    parser.add_argument("--family", help="only this family (decoder, encoder, encoder-decoder, vision, audio, multimodal)")
    parser.add_argument("--traces", default=",".join(DEFAULT_TRACES),
                        help=f"comma-separated, of {','.join(TRACES + TRAINING_TRACES)} (or 'all')")
    parser.add_argument("--training", action="store_true",
                        help=f"training graphs: the traces {','.join(TRAINING_TRACES)}")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (each uses one thread)")
    parser.add_argument("--width", type=int, default=110, help="cell width in the table")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every mismatch of every failure")
    parser.add_argument("--json", help="write every outcome to this file")
    options = parser.parse_args(argv)

    names = list(CASES)
    if options.ci:
        names = list(CI_SLICE)
    if options.models:
        names = [n.strip() for n in options.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in CASES]
        if unknown:
            parser.error(f"unknown models {unknown}; known: {', '.join(CASES)}")
    if options.family:
        names = [n for n in names if CASES[n].family == options.family]
    traces = list(TRACES) if options.traces == "all" else [t.strip() for t in options.traces.split(",") if t.strip()]
    if options.training:
        traces = list(TRAINING_TRACES)
    if any(t not in TRACES + TRAINING_TRACES for t in traces):
        parser.error(f"traces are {TRACES + TRAINING_TRACES}")

    start = time.perf_counter()
    results: dict[str, list[Outcome]] = {}
    if options.jobs > 1 and len(names) > 1:
        import multiprocessing
        with ProcessPoolExecutor(options.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_run_model, name, traces): name for name in names}
            for future in as_completed(futures):
                name = futures[future]
                try:
                    results[name] = future.result()
                except Exception as error:  # a worker died (segfault, OOM)
                    results[name] = [Outcome(name, t, "FXPROP-ERROR", f"worker died: {type(error).__name__}: {error}",
                                             kind="worker") for t in traces]
                print(f"  [{len(results)}/{len(names)}] {name}: "
                      + ", ".join(f"{o.trace}={o.status}" for o in results[name]), file=sys.stderr, flush=True)
    else:
        for name in names:
            results[name] = _run_model(name, traces)
            print(f"  [{len(results)}/{len(names)}] {name}: "
                  + ", ".join(f"{o.trace}={o.status}" for o in results[name]), file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start

    outcomes = [o for name in names for o in results[name]]
    report(names, traces, results, outcomes, elapsed, options)
    if options.json:
        Path(options.json).write_text(json.dumps([
            {"model": o.model, "family": CASES[o.model].family, "trace": o.trace, "status": o.status,
             "known": KNOWN_FAILURES.get(key(o.model, o.trace)),
             "detail": o.detail, "node": o.node, "op": o.op, "kind": o.kind, "nodes": o.nodes,
             "seconds": round(o.seconds, 2), "mismatches": [str(m) for m in o.mismatches]} for o in outcomes], indent=1))
    unexpected = [o for o in outcomes if (o.status != OK) != (key(o.model, o.trace) in KNOWN_FAILURES)]
    if unexpected:
        print("\nnot as tests/corpus/known_failures.py says (new failures, or known ones that now pass):")
        for o in unexpected:
            print(f"  {o.model}/{o.trace}: {o.short()[:200]}")
    return 1 if unexpected else 0


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(names, traces, results, outcomes, elapsed, options) -> None:
    print("\n| architecture | family | trace | nodes | result | seconds | known failure |")
    print("|---|---|---|---:|---|---:|---|")
    for name in names:
        for o in results[name]:
            known = KNOWN_FAILURES.get(key(name, o.trace), "")
            print(f"| {name} | {CASES[name].family} | {o.trace} | {o.nodes or ''} | {_md(_cell(o, options.width))} | "
                  f"{o.seconds:.1f} | {_md(known[:options.width])} |")
            if options.verbose and o.mismatches:
                for m in o.mismatches:
                    print(f"|  |  |  |  | {_md(str(m))} |  |  |")

    print("\nsummary (models x traces):")
    header = f"  {'trace':<11}" + "".join(f"  {s:>13}" for s in _statuses(outcomes))
    print(header)
    for how in traces + ["all"]:
        row = [o for o in outcomes if how == "all" or o.trace == how]
        counts = collections.Counter(o.status for o in row)
        print(f"  {how:<11}" + "".join(f"  {counts.get(s, 0):>13}" for s in _statuses(outcomes)))
    print(f"  {len(names)} models, {len(outcomes)} runs, {elapsed:.0f}s")

    faults = [o for o in outcomes if o.fxprop_fault]
    if faults:
        print("\nfxprop failures by signature (status, op, error type / field):")
        groups: dict[tuple, list[Outcome]] = collections.defaultdict(list)
        for o in faults:
            groups[o.signature].append(o)
        for signature, group in sorted(groups.items(), key=lambda item: -len(item[1])):
            status, op, kind = signature
            affected = sorted({f"{o.model}[{o.trace}]" for o in group})
            print(f"  {status} {op or '-'} {kind or ''}: {len(affected)} run(s)")
            print(f"      e.g. {group[0].model}[{group[0].trace}]: {group[0].detail[:300]}")
            print(f"      affects: {', '.join(affected)}")
    others = [o for o in outcomes if o.status not in FXPROP_FAULTS and o.status != OK]
    if others:
        print("\nnot fxprop's (torch could not trace or run it, or the model could not be built):")
        groups = collections.defaultdict(list)
        for o in others:
            groups[(o.status, o.trace, o.detail[:90])].append(o.model)
        for (status, how, detail), models in sorted(groups.items()):
            print(f"  {status} [{how}] {detail}: {', '.join(models)}")


def _statuses(outcomes) -> list[str]:
    order = ["OK", "MISMATCH", "FXPROP-ERROR", "SIDE-EFFECT", "LEAK", "GUARD", "EXPORT-FAILED", "COMPILE-FAILED",
             "REAL-FAILED", "BUILD-FAILED"]
    present = {o.status for o in outcomes}
    return [s for s in order if s in present or s in ("OK", "MISMATCH", "FXPROP-ERROR", "EXPORT-FAILED")]


if __name__ == "__main__":
    sys.exit(main())
