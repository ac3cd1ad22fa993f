"""A model traced into FX graphs by the first tracer that can, and why the ones before it could not.

The tracers, in the order `trace_model` tries them:

- ``export``: `torch.export`, one aten-level graph. It runs every op on FakeTensors, so it
  refuses a custom op without a fake kernel, and python control flow on tensor values.
- ``symbolic``: `torch.fx.symbolic_trace`, one torch-level graph. It runs no op at all, so ops
  without a fake kernel trace; control flow on tensor values does not.
- ``dynamo``: `torch.compile` with a backend that keeps each graph it is handed, torch-level.
  A copy of the model runs once for real (its buffers, not the model's, are updated; what its
  forward does to the world outside the module happens); python control flow on tensor values
  splits it into several graphs (graph breaks), and the code between them runs eagerly, in no
  graph. Dynamo's compiled state is reset before and after, so other compiled code in the
  process compiles again on its next call.

>>> import torch
>>> traced = trace_model(torch.nn.Linear(2, 3), (torch.ones(1, 2),), ("symbolic",))
>>> traced.name, len(traced.graphs), traced.why
('torch.fx.symbolic_trace', 1, '')
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import io
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.fx

from .. import torch_compat
from .loading import SourceTracer

TRACER_NAMES = {"export": "torch.export", "symbolic": "torch.fx.symbolic_trace", "dynamo": "dynamo (torch.compile)"}
AUTO = ("export", "symbolic", "dynamo")


class TraceError(Exception):
    """No tracer could trace the model; the message has each tracer's reason."""


@dataclass
class Traced:
    """The graphs one tracer produced, each with the inputs to propagate it with."""
    tracer: str
    graphs: list[tuple[torch.fx.GraphModule, tuple]]
    failures: list[tuple[str, str]] = field(default_factory=list)  # (tracer, first line of its error), in order

    @property
    def name(self) -> str:
        return TRACER_NAMES[self.tracer]

    @property
    def why(self) -> str:
        """Why the tracers tried before this one failed ("" when the first one worked)."""
        return "; ".join(f"{TRACER_NAMES[tracer]} failed: {reason}" for tracer, reason in self.failures)


def trace_model(model: torch.nn.Module, inputs: tuple, tracers: Sequence[str] = AUTO) -> Traced:
    """Trace with each of ``tracers`` in turn until one succeeds; `TraceError` when none does."""
    try:
        inspect.signature(model.forward).bind(*inputs)
    except TypeError as error:  # symbolic_trace would bind the inputs by position regardless
        raise TraceError(f"{type(model).__name__} cannot be called with these inputs: {error}") from None
    failures: list[tuple[str, str]] = []
    for tracer in tracers:
        try:
            graphs = TRACERS[tracer](model, inputs)
        except Exception as error:  # any failure of the user's model under this tracer: try the next
            failures.append((tracer, first_line(error)))
            continue
        return Traced(tracer, graphs, failures)
    raise TraceError(f"no tracer could trace {type(model).__name__}: "
                     + "; ".join(f"{TRACER_NAMES[tracer]} failed: {reason}" for tracer, reason in failures))


def first_line(error: BaseException) -> str:
    """``RuntimeError: There was no fake impl registered for ...``: the type and the message's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def export_graphs(model: torch.nn.Module, inputs: tuple) -> list[tuple[torch.fx.GraphModule, tuple]]:
    # A failed export prints its partial graph to stderr, which would bury the report that names
    # the failure in one line; what export prints is passed on only when it succeeds.
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        program = torch.export.export(model, inputs)
    sys.stderr.write(printed.getvalue())
    return [(program.module(), inputs)]


def symbolic_graphs(model: torch.nn.Module, inputs: tuple) -> list[tuple[torch.fx.GraphModule, tuple]]:
    tracer = SourceTracer()
    graph = tracer.trace(model)
    return [(torch.fx.GraphModule(tracer.root, graph, type(model).__name__), inputs)]


def dynamo_graphs(model: torch.nn.Module, inputs: tuple) -> list[tuple[torch.fx.GraphModule, tuple]]:
    captured: list[tuple[torch.fx.GraphModule, tuple]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        captured.append((gm, tuple(example_inputs)))
        return gm.forward  # run as captured: the model's own result, and the code after the break sees it

    torch_compat.reset_dynamo()  # a cached compilation of the same code would not call this backend again
    try:
        torch.compile(copy.deepcopy(model), backend=keep)(*inputs)  # a copy: the run updates buffers
    finally:
        torch_compat.reset_dynamo()  # nothing compiled here outlives the capture
    if not captured:
        raise TraceError("dynamo captured no graph (the model ran entirely outside dynamo)")
    return captured


TRACERS: dict[str, Callable[[torch.nn.Module, tuple], list[tuple[torch.fx.GraphModule, tuple]]]] = {
    "export": export_graphs, "symbolic": symbolic_graphs, "dynamo": dynamo_graphs}
