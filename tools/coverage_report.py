#!/usr/bin/env python
"""Which ops fxprop can propagate without real tensors, and whether its rules match real execution.

    python tools/coverage_report.py                                   # every aten overload, by rule kind
    python tools/coverage_report.py --model fxprop.examples:gpt_example    # one model's graph, node by node
    python tools/coverage_report.py --model pkg.mod:make --trace symbolic  # one tracer only (default: auto)
    python tools/coverage_report.py --graph program.pt2                # a torch.export.save'd program
    python tools/coverage_report.py --verify [--ops mm,add | --slice]  # OpInfo conformance vs FakeTensorMode
    python tools/coverage_report.py --verify-modules [--modules nn.Linear | --slice]  # ModuleInfo vs FakeTensorProp

Every mode prints a terminal table and a summary (counts per rule kind or status);
``--format md|json|csv`` changes the output (csv writes the summary to stderr).
``--fail-on-fallback`` exits with 3 (as ``fxprop run --fail-on-fallback`` does) when any op or
node needs the real-tensor fallback (or has no rule at all), for CI gates; 1 is an error.
``--model`` traces with torch.export, and where export cannot (a custom op without a fake kernel,
control flow on tensor values) with fx.symbolic_trace, then dynamo; the summary's "trace" names
the tracer used and "trace fallback" why the ones before it failed. Kinds come from
`fxprop.lookup`, which asks the resolution the engine itself uses (`fxprop.resolve.order`), so the
report and the engine cannot disagree.
The overload mode lists higher-order operators too: "unsupported" when fxprop has no rule for one.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TextIO

import torch

import fxprop
from fxprop import conformance
from fxprop.conformance import modules as module_conformance
from fxprop.conformance.expected_modules import EXPECTED_MODULE_FAILURES
from fxprop.cli.report import describe_value, format_table
from fxprop import Kind, lookup
from fxprop.cli.tracing import AUTO, TRACERS, TraceError, trace_model
from fxprop.resolve.registry import target_name
from fxprop.torch_compat import higher_order_ops

KINDS = tuple(kind.value for kind in Kind)
FALLBACK_KINDS = (Kind.FALLBACK.value, Kind.UNSUPPORTED.value)
EXIT_OK, EXIT_ERROR, EXIT_FALLBACK = 0, 1, 3  # fxprop.cli.main's codes


@dataclass
class Report:
    title: str
    header: tuple[str, ...]
    rows: list[tuple] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    kind_column: str | None = None

    def kinds(self) -> list[str]:
        index = self.header.index(self.kind_column) if self.kind_column else None
        return [row[index] for row in self.rows] if index is not None else []


# --- (a) every aten overload --------------------------------------------------------------

def aten_overloads() -> Iterator[torch._ops.OpOverload]:
    """Every overload registered in the aten namespace, in name order."""
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if not name.startswith("aten::"):
            continue
        base, _, overload = name.removeprefix("aten::").partition(".")
        try:
            yield getattr(getattr(torch.ops.aten, base), overload or "default")
        except (AttributeError, RuntimeError):
            continue


def all_ops_report(only: str | None = None) -> Report:
    report = Report("aten overloads and higher-order operators by the rule that covers them", ("op", "kind", "rule"),
                    kind_column="kind")
    counts = dict.fromkeys(KINDS, 0)
    targets = [*aten_overloads(), *(op for _, op in sorted(higher_order_ops().items()))]
    for target in targets:
        rule = lookup(target)
        counts[rule.kind.value] += 1
        if only is None or rule.kind.value == only:
            report.rows.append((target_name(target), rule.kind.value, rule.name))
    report.summary = {"targets": sum(counts.values()), **{k: v for k, v in counts.items() if v or k != "plain"}}
    return report


# --- (b) one graph ------------------------------------------------------------------------

def load_model(spec: str) -> tuple[torch.nn.Module, tuple]:
    """``module:callable``; the callable returns ``(model, example_inputs)``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"--model expects module:callable, got {spec!r}")
    factory = importlib.import_module(module_name)
    for part in attribute.split("."):
        factory = getattr(factory, part)
    model, inputs = factory()
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def load_program(path: str) -> tuple[torch.fx.GraphModule, tuple, dict]:
    """A `torch.export.save`'d program and inputs for it: its example inputs, or its placeholders' specs."""
    program = torch.export.load(path)
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        return program.module(), tuple(args), dict(kwargs)
    specs = [fxprop.TensorSpec(tuple(node.meta["val"].shape), node.meta["val"].dtype, node.meta["val"].device)
             for node in program.graph.nodes
             if node.op == "placeholder" and node.name in program.graph_signature.user_inputs]
    return program.module(), tuple(specs), {}


def graph_report(graphs: Sequence[tuple[torch.fx.GraphModule, tuple, dict]], title: str) -> Report:
    """One row per call node; with several graphs (dynamo's graph breaks) each node is ``g<i>.<name>``."""
    report = Report(title, ("node", "op", "kind", "rule", "fallback bytes", "shape", "dtype", "device"),
                    kind_column="kind")
    counts = dict.fromkeys(KINDS, 0)
    fallback_bytes = 0
    for index, (gm, inputs, kwargs) in enumerate(graphs):
        fxprop.propagate(gm, *inputs, **kwargs)
        prefix = f"g{index}." if len(graphs) > 1 else ""
        for node in gm.graph.nodes:
            if not node.op.startswith("call"):
                continue
            provenance = node.meta["fxprop"]
            name = target_name(node.target) if node.op != "call_module" else f"module {node.target}"
            shape, dtype, device = describe_value(node.meta.get("val"))
            kind = provenance.kind.value
            report.rows.append((prefix + node.name, name, kind, provenance.rule, provenance.fallback_bytes,
                                shape, dtype, device))
            counts[kind] += 1
        fallback_bytes += gm.meta["fxprop"]["fallback_bytes"]
    report.summary = {"nodes": len(report.rows), **{k: v for k, v in counts.items() if v or k != "unsupported"},
                      "distinct ops": len({row[1] for row in report.rows}),
                      "fallback bytes": fallback_bytes}
    if len(graphs) > 1:
        report.summary["graphs"] = len(graphs)
        report.title += f" ({len(graphs)} graphs: the code between them ran eagerly and is in no row)"
    return report


def model_report(spec: str, tracers: Sequence[str]) -> Report:
    """``--model``: traced by the first of ``tracers`` that can; the summary names it, and why the others failed."""
    model, inputs = load_model(spec)
    traced = trace_model(model, inputs, tracers)
    report = graph_report([(gm, graph_inputs, {}) for gm, graph_inputs in traced.graphs],
                          f"{spec} ({traced.name}): nodes by the rule that covered them")
    report.summary["trace"] = traced.name
    if traced.failures:
        report.summary["trace fallback"] = traced.why
    return report


# --- (c) OpInfo conformance ---------------------------------------------------------------

class ProgressBar:
    """A progress bar on stderr: redrawn in place on a terminal, a line every 10% otherwise."""

    def __init__(self, stream: TextIO = sys.stderr, enabled: bool = True, width: int = 30, unit: str = "ops"):
        self.stream, self.enabled, self.width, self.unit = stream, enabled, width, unit
        self.started = time.monotonic()
        self.last_decile = -1

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled or total == 0:
            return
        fraction = done / total
        elapsed = time.monotonic() - self.started
        text = f"{done}/{total} {self.unit} ({fraction:.0%}), {elapsed:.0f}s"
        if self.stream.isatty():
            filled = int(self.width * fraction)
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(f"\r[{bar}] {text} {label[:30]:<30}")
            if done == total:
                self.stream.write("\n")
        elif int(fraction * 10) > self.last_decile:
            self.last_decile = int(fraction * 10)
            self.stream.write(f"verify: {text}\n")
        self.stream.flush()


def verify_report(keys: Sequence[str] | None, max_samples: int | None, progress: Callable | None) -> Report:
    started = time.monotonic()
    results = conformance.sweep(keys, max_samples=max_samples, progress=progress)
    elapsed = time.monotonic() - started
    report = Report("OpInfo conformance: fxprop and FakeTensorMode against real execution",
                    ("op", "status", "fxprop", "FakeTensorMode", "samples", "mismatch", "expected failure"))
    for result in results:
        expected = conformance.EXPECTED_FAILURES.get(result.key)
        report.rows.append((result.key, result.status, _rate(result.fxprop_matches, result.total),
                            _rate(result.fake_matches, result.total), result.total,
                            ",".join(result.categories()) or (result.skipped or ""),
                            expected.reason if expected else ""))
    report.summary = verify_summary(results, elapsed)
    return report


def verify_summary(results: list, elapsed: float) -> dict[str, Any]:
    samples = sum(r.total for r in results)
    fxprop_ok = sum(r.fxprop_matches for r in results)
    fake_ok = sum(r.fake_matches for r in results)
    statuses = {status: sum(r.status == status for r in results) for status in ("verified", "mismatched", "unverified")}
    categories: dict[str, int] = {}
    for result in results:
        for sample in result.fxprop_mismatches():
            categories[sample.fxprop.category] = categories.get(sample.fxprop.category, 0) + 1
    unexpected = [r.key for r in results if r.status == "mismatched" and r.key not in conformance.EXPECTED_FAILURES]
    return {"ops": len(results), **statuses, "samples": samples,
            "fxprop match rate": _rate(fxprop_ok, samples), "FakeTensorMode match rate": _rate(fake_ok, samples),
            "fxprop ops fully matching": _rate(sum(r.total and r.fxprop_matches == r.total for r in results),
                                               sum(bool(r.total) for r in results)),
            "FakeTensorMode ops fully matching": _rate(sum(r.total and r.fake_matches == r.total for r in results),
                                                       sum(bool(r.total) for r in results)),
            "fxprop mismatched samples by field": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "mismatched ops not in the expected-failure table": len(unexpected),
            "seconds": round(elapsed, 1)}


def verify_modules_report(keys: Sequence[str] | None, max_samples: int | None, progress: Callable | None) -> Report:
    started = time.monotonic()
    results = module_conformance.sweep(keys, max_samples=max_samples, progress=progress)
    elapsed = time.monotonic() - started
    report = Report("ModuleInfo conformance: fxprop and FakeTensorProp against real execution",
                    ("module", "status", "fxprop", "FakeTensorProp", "FakeTensorProp, requires_grad not compared",
                     "samples", "mismatch", "expected failure"))
    for result in results:
        expected = EXPECTED_MODULE_FAILURES.get(result.key)
        report.rows.append((result.key, result.status, _rate(result.fxprop_matches, result.total),
                            _rate(result.fake_matches, result.total),
                            _rate(result.fake_matches_ignoring_requires_grad, result.total), result.total,
                            ",".join(result.categories()) or (result.skipped or ""),
                            expected.reason if expected else ""))
    samples = sum(r.total for r in results)
    checked = [r for r in results if r.total]

    def fully(count: Callable) -> str:
        return _rate(sum(count(r) == r.total for r in checked), len(checked))
    unexpected = [r.key for r in results if r.status == "mismatched" and r.key not in EXPECTED_MODULE_FAILURES]
    report.summary = {
        "modules": len(results), "samples": samples,
        "constructor errors (no forward to check)": sum(r.construction_errors for r in results),
        "fxprop match rate": _rate(sum(r.fxprop_matches for r in results), samples),
        "FakeTensorProp match rate": _rate(sum(r.fake_matches for r in results), samples),
        "FakeTensorProp match rate, requires_grad not compared":
            _rate(sum(r.fake_matches_ignoring_requires_grad for r in results), samples),
        "fxprop modules fully matching": fully(lambda r: r.fxprop_matches),
        "FakeTensorProp modules fully matching": fully(lambda r: r.fake_matches),
        "FakeTensorProp modules fully matching, requires_grad not compared":
            fully(lambda r: r.fake_matches_ignoring_requires_grad),
        "mismatched modules not in the expected-failure table": len(unexpected),
        "seconds": round(elapsed, 1)}
    return report


def _rate(matches: int, total: int) -> str:
    return f"{matches}/{total} ({100 * matches / total:.1f}%)" if total else "-"


# --- output -------------------------------------------------------------------------------

def render(report: Report, fmt: str, out: TextIO, err: TextIO) -> None:
    if fmt == "json":
        json.dump({"title": report.title, "rows": [dict(zip(report.header, row)) for row in report.rows],
                   "summary": report.summary}, out, indent=1, default=str)
        out.write("\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(report.header)
        writer.writerows(report.rows)
        err.write(_summary_text(report.summary) + "\n")
    elif fmt == "md":
        out.write(f"## {report.title}\n\n")
        out.write("| " + " | ".join(report.header) + " |\n|" + "---|" * len(report.header) + "\n")
        for row in report.rows:
            out.write("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |\n")
        out.write("\n**Summary**\n\n" + "\n".join(f"- {key}: {_flat(value)}" for key, value in report.summary.items())
                  + "\n")
    else:
        out.write(f"{report.title}\n\n")
        out.write(format_table(report.header, [tuple(map(str, row)) for row in report.rows]) + "\n\n")
        out.write(_summary_text(report.summary) + "\n")


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return str(value)


def _summary_text(summary: dict[str, Any]) -> str:
    width = max(len(key) for key in summary)
    return "summary\n" + "\n".join(f"  {key.ljust(width)}  {_flat(value)}" for key, value in summary.items())


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="coverage_report.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="MODULE:CALLABLE", help="a callable returning (model, example_inputs)")
    source.add_argument("--graph", metavar="FILE", help="a program saved with torch.export.save")
    source.add_argument("--verify", action="store_true", help="run the OpInfo samples (fxprop vs FakeTensorMode)")
    source.add_argument("--verify-modules", action="store_true",
                        help="run the ModuleInfo samples (fxprop vs FakeTensorProp)")
    parser.add_argument("--trace", choices=("auto", *TRACERS), default="auto",
                        help="how --model is traced: auto (default) tries torch.export (aten ops), then "
                             "fx.symbolic_trace, then dynamo (both torch-level), and says why it moved on; "
                             "a named tracer is the only one tried")
    parser.add_argument("--ops", help="--verify: comma-separated OpInfo keys (default: all of op_db)")
    parser.add_argument("--modules", help="--verify-modules: comma-separated ModuleInfo names (default: all)")
    parser.add_argument("--slice", action="store_true", help="--verify, --verify-modules: only the CI slice")
    parser.add_argument("--max-samples", type=int, default=None,
                        help=f"--verify: samples per op and dtype (default {conformance.MAX_SAMPLES}); "
                             f"--verify-modules: per module, mode and requires_grad (default "
                             f"{module_conformance.MAX_SAMPLES}); spread evenly, 0: all")
    parser.add_argument("--kind", choices=KINDS, help="list only rows of this kind (the summary counts all)")
    parser.add_argument("--format", choices=("table", "md", "json", "csv"), default="table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--fail-on-fallback", action="store_true",
                        help=f"exit {EXIT_FALLBACK} when an op or node needs the real-tensor fallback or has no rule")
    args = parser.parse_args(argv)

    try:
        if args.verify:
            keys = (args.ops.split(",") if args.ops else list(conformance.CI_SLICE) if args.slice else None)
            limit = conformance.MAX_SAMPLES if args.max_samples is None else args.max_samples or None
            report = verify_report(keys, limit, ProgressBar(err, enabled=not args.no_progress))
        elif args.verify_modules:
            keys = (args.modules.split(",") if args.modules else
                    list(module_conformance.MODULE_CI_SLICE) if args.slice else None)
            limit = module_conformance.MAX_SAMPLES if args.max_samples is None else args.max_samples or None
            report = verify_modules_report(keys, limit, ProgressBar(err, enabled=not args.no_progress, unit="modules"))
        elif args.model:
            report = model_report(args.model, AUTO if args.trace == "auto" else (args.trace,))
        elif args.graph:
            report = graph_report([load_program(args.graph)], f"{args.graph}: nodes by the rule that covered them")
        else:
            report = all_ops_report()
    except (fxprop.FxpropError, KeyError, TraceError) as error:
        err.write(f"coverage_report: {error}\n")
        no_rule = (isinstance(error, fxprop.UnsupportedError)
                   and not isinstance(error, (fxprop.DataDependentError, fxprop.FallbackLimitError)))
        return EXIT_FALLBACK if args.fail_on_fallback and no_rule else EXIT_ERROR
    kinds = report.kinds()
    if args.kind:
        if report.kind_column is None:
            parser.error("--kind applies to the overload and graph modes")
        index = report.header.index(report.kind_column)
        report.rows = [row for row in report.rows if row[index] == args.kind]
    render(report, args.format, out, err)
    fell_back = [kind for kind in kinds if kind in FALLBACK_KINDS]
    if args.fail_on_fallback and fell_back:
        err.write(f"coverage_report: {len(fell_back)} op(s)/node(s) need the real-tensor fallback or have no rule\n")
        return EXIT_FALLBACK
    return EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader (e.g. `| head`) closed the pipe: nothing left to say
        sys.stderr.close()
        sys.exit(0)
