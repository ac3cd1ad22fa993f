#!/usr/bin/env python
"""Check `fxprop.estimate` against real execution on every model of the corpus.

    python tools/estimate_sweep.py                  # every corpus model
    python tools/estimate_sweep.py --models t5,vit  # some of them

Each model is exported (``ep.module()``), estimated under ``torch.no_grad()`` and run for real,
node by node, by the reference of ``tests/test_estimate.py`` (live storages after each node,
dead values freed as ``torch.fx.Interpreter`` frees them, FlopCounterMode per node). A model
matches when every node's FLOPs and live bytes, the totals, the peak and its node are equal.
Prints one line per model (OK, MISMATCH with the first differing node, EXPORT-FAILED,
ESTIMATE-ERROR, REAL-FAILED) and a count; exits 1 when any model mismatches or fxprop fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

import fxprop  # noqa: E402
from corpus import harness, models  # noqa: E402
from test_estimate import assert_matches, measure  # noqa: E402


def check(name: str) -> tuple[str, str]:
    try:
        model, inputs = models.build(name)
        gm = harness.export(model, inputs).module()
    except Exception as error:  # torch could not trace it: not fxprop's
        return "EXPORT-FAILED", f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
    args = list(inputs.values())
    try:
        with torch.no_grad():
            est = fxprop.estimate(gm, *args)
    except Exception as error:
        return "ESTIMATE-ERROR", f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
    try:
        records = measure(gm, *args)
    except Exception as error:
        return "REAL-FAILED", f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
    if est.flops_unknown:
        return "MISMATCH", f"FLOPs unknown at {sorted(est.flops_unknown)[:3]}"
    try:
        assert_matches(est, records)
    except AssertionError:
        got = [(node.name, node.flops, node.live_bytes.get("cpu", 0)) for node in est.nodes]
        first = next(((g, r) for g, r in zip(got, records) if g != r), None)
        return "MISMATCH", f"first differing node (estimate, real): {first}"
    return "OK", f"{len(records)} nodes, peak {est.peak_bytes['cpu']:,} bytes after %{est.peak_node['cpu']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    options = parser.parse_args(argv)
    names = [n.strip() for n in options.models.split(",")] if options.models else list(models.CASES)
    unknown = [n for n in names if n not in models.CASES]
    if unknown:
        parser.error(f"unknown models {unknown}")
    torch.set_num_threads(1)
    counts: dict[str, int] = {}
    start = time.perf_counter()
    for name in names:
        began = time.perf_counter()
        status, detail = check(name)
        counts[status] = counts.get(status, 0) + 1
        print(f"{name:20} {status:15} {time.perf_counter() - began:5.1f} s  {detail}", flush=True)
    print(f"\n{len(names)} models in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{count} {status}" for status, count in sorted(counts.items())))
    return 1 if counts.keys() & {"MISMATCH", "ESTIMATE-ERROR"} else 0


if __name__ == "__main__":
    sys.exit(main())
