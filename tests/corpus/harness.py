"""Trace a corpus model the ways real pipelines do, propagate it with fxprop, compare with a real run.

Traces (`TRACES`):

- ``export``: the ``torch.export.ExportedProgram`` itself (``torch.export.export(model, (),
  kwargs=inputs, strict=False)``), propagated as ``fxprop.propagate(ep, *inputs)`` and
  compared node by node on ``ep.graph_module`` (parameters, buffers and constants lifted to
  placeholders, their values taken from the program). The primary trace.
- ``module``: ``ep.module()``, the unlifted graph module export-based lowerings receive.
- ``module_spec``: the same graph, propagated from `fxprop.TensorSpec` inputs (shape and dtype
  only, no data, as a static lowering has them); the real run uses the actual inputs.
- ``dynamo``: ``torch._dynamo.export(model)(**inputs)``, the torch-level graph torch.compile's
  frontend captures (torch functions, Tensor methods, modules inlined).
- ``fx``: ``torch.fx.symbolic_trace`` of the model called with its inputs as positional
  arguments (most transformers models branch on values and cannot be traced this way).
  transformers 5 dropped ``transformers.utils.fx``, so this is the only symbolic tracer left.

`check_case(name, trace)` returns an `Outcome` whose ``status`` is one of:

- ``OK``: fxprop annotated every node, and its every value (shape, dtype, device, significant
  strides, requires_grad) and the graph's output equal real execution; propagation had no
  side effects (parameters, buffers, constants and inputs unchanged bit for bit and in version,
  the global RNG state, grad mode and the graph's code unchanged), and nothing fake or meta
  leaked into the module or a real run after propagation.
- ``MISMATCH``: some node differs (``detail`` is the first; ``mismatches`` all of them).
- ``FXPROP-ERROR``: `fxprop.propagate` raised (``detail``: type, node, first line).
- ``SIDE-EFFECT`` / ``LEAK``: propagation changed the caller's state, or left fake/meta tensors
  behind (in the module, in a later real run, or in an output annotated off the cpu).
- ``EXPORT-FAILED``: torch itself could not trace the model this way: not fxprop's fault.
- ``REAL-FAILED``: torch's traced graph does not run for real: not fxprop's fault.
- ``BUILD-FAILED``: the model could not be built offline from its tiny config.

Training graphs (`TRAINING_TRACES`: ``aot``, ``aot_dynamic``, ``joint``; AOT's forward and
backward graphs under torch.compile, static and dynamic, and a ``make_fx`` joint graph) are
checked by tests/corpus/training.py, through the same `check_case`; they add the statuses
``GUARD`` (propagation added a guard to dynamo's ShapeEnv: fxprop's fault) and
``COMPILE-FAILED`` (torch.compile with the ``aot_eager`` backend fails too: not fxprop's).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from .models import CASES

TRACES = ("export", "module", "module_spec", "dynamo", "fx")
DEFAULT_TRACES = ("export", "module", "dynamo", "fx")
TRAINING_TRACES = ("aot", "aot_dynamic", "joint")   # training graphs: tests/corpus/training.py
OK, MISMATCH, FXPROP_ERROR, SIDE_EFFECT, LEAK = "OK", "MISMATCH", "FXPROP-ERROR", "SIDE-EFFECT", "LEAK"
GUARD = "GUARD"                                      # propagation added a guard to dynamo's ShapeEnv
EXPORT_FAILED, REAL_FAILED, BUILD_FAILED = "EXPORT-FAILED", "REAL-FAILED", "BUILD-FAILED"
COMPILE_FAILED = "COMPILE-FAILED"                    # torch.compile fails with the aot_eager backend too
FXPROP_FAULTS = (MISMATCH, FXPROP_ERROR, SIDE_EFFECT, LEAK, GUARD)           # statuses that are fxprop's to fix
NOT_FXPROP = (EXPORT_FAILED, REAL_FAILED, BUILD_FAILED, COMPILE_FAILED)     # torch's / transformers' / the corpus's


@dataclass
class Outcome:
    model: str
    trace: str
    status: str
    detail: str = ""
    node: str | None = None          # the first failing node's name
    op: str | None = None            # ... and its op
    kind: str | None = None          # the exception type, or the mismatching field
    mismatches: list = field(default_factory=list)
    nodes: int = 0
    seconds: float = 0.0

    @property
    def fxprop_fault(self) -> bool:
        return self.status in FXPROP_FAULTS

    @property
    def signature(self) -> tuple:
        """What identifies a root cause across models: status, op, and the error type or field."""
        return (self.status, self.op, self.kind)

    def short(self) -> str:
        if self.status == OK:
            return OK
        return f"{self.status}: {self.detail}"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


@contextlib.contextmanager
def quiet():
    """Silence transformers' and torch's warnings and prints while tracing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            yield


# ---------------------------------------------------------------------------------------------
# Tracing

class Positional(torch.nn.Module):
    """The model called by keyword, taking its inputs as named positional parameters (for
    torch.fx.symbolic_trace, which makes one placeholder per parameter of the class's ``forward``)."""

    def __new__(cls, model: torch.nn.Module, names: list[str]):
        if cls is not Positional:
            return super().__new__(cls)
        params = ", ".join(names)
        call = ", ".join(f"{n}={n}" for n in names)
        scope: dict[str, Any] = {}
        exec(f"def forward(self, {params}):\n    return self.model({call}, return_dict=False)\n", scope)
        return type("Positional", (Positional,), {"forward": scope["forward"]})(model, names)

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = names


@dataclass
class Traced:
    """What one trace hands fxprop, and how to run the same thing for real."""
    target: Any                      # what fxprop.propagate receives: a GraphModule or an ExportedProgram
    graph: torch.fx.GraphModule      # the graph whose nodes are compared
    args: list                       # propagate's inputs (real tensors; specs of them for module_spec)
    graph_args: list                 # the real values of graph's placeholders, in order
    call: Callable[[], Any]          # a real run of the traced program through its public entry point
    guarded: list                    # extra tensors the side-effect check covers (an ExportedProgram's state)


def export(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.export.ExportedProgram:
    with quiet():
        return torch.export.export(model, (), kwargs=dict(inputs), strict=False)


def trace(model: torch.nn.Module, inputs: dict[str, torch.Tensor], how: str,
          program: torch.export.ExportedProgram | None = None) -> Traced:
    """``model`` called on ``inputs``, traced the way ``how`` names (one of `TRACES`)."""
    from fxprop.engine.exported import program_inputs
    args = list(inputs.values())
    if how == "export":
        ep = program if program is not None else export(model, inputs)
        state = [t for t in list(ep.state_dict.values()) + list(ep.constants.values()) if isinstance(t, torch.Tensor)]
        return Traced(ep, ep.graph_module, args, program_inputs(ep, tuple(args)),
                      lambda: ep.module()(**inputs), state)
    if how in ("module", "module_spec"):
        ep = program if program is not None else export(model, inputs)
        gm = ep.module()
        prop = [as_spec(a) for a in args] if how == "module_spec" else args
        return Traced(gm, gm, prop, args, lambda: gm(**inputs), [])
    with quiet():
        if how == "dynamo":
            import torch._dynamo as dynamo
            dynamo.reset()
            gm, _guards = dynamo.export(model)(**inputs)
            ordered = _ordered(gm, inputs)
            return Traced(gm, gm, ordered, ordered, lambda: gm(*ordered), [])
        if how == "fx":
            gm = torch.fx.symbolic_trace(Positional(model, list(inputs)))
            return Traced(gm, gm, args, args, lambda: gm(*args), [])
    raise ValueError(f"unknown trace {how!r}; one of {TRACES}")


def _ordered(gm: torch.fx.GraphModule, inputs: dict[str, torch.Tensor]) -> list:
    """``inputs`` in the order the graph module's forward takes them."""
    params = inspect.signature(gm.forward).parameters
    if all(name in inputs for name in params):
        return [inputs[name] for name in params]
    return list(inputs.values())


def as_spec(value: Any) -> Any:
    import fxprop
    if isinstance(value, torch.Tensor):
        return fxprop.TensorSpec(tuple(value.shape), dtype=value.dtype, device=value.device, stride=value.stride(),
                                 requires_grad=value.requires_grad)
    return value


# ---------------------------------------------------------------------------------------------
# Checking

def _leaves(value: Any) -> list:
    from torch.utils import _pytree as pytree
    return pytree.tree_leaves(value)


def _is_fake_or_meta(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, torch.Tensor) and (isinstance(t, FakeTensor) or t.device.type == "meta")


def _module_leaks(gm: torch.nn.Module, guarded: list) -> list[str]:
    found = []
    for name, t in list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False)):
        if _is_fake_or_meta(t):
            found.append(f"{name} is {type(t).__name__} on {t.device}")
    for prefix, module in gm.named_modules():
        for key, item in vars(module).items():
            if _is_fake_or_meta(item):
                found.append(f"constant {prefix}.{key} is {type(item).__name__} on {item.device}")
    found += [f"program state tensor {i} is {type(t).__name__}" for i, t in enumerate(guarded) if _is_fake_or_meta(t)]
    return found


def check_traced(traced: Traced, *, model: str = "?", trace_name: str = "?") -> Outcome:
    """Propagate ``traced``, run it for real, compare everything."""
    import fxprop
    from fxprop.engine.propagation import Provenance
    from fxprop.testing import assert_no_side_effects, compare_nodes, compare_values, observe, real_value, \
        run_real_until_error

    gm = traced.graph
    nodes = len(gm.graph.nodes)
    outcome = lambda status, detail="", **kw: Outcome(model, trace_name, status, detail, nodes=nodes, **kw)  # noqa: E731

    for node in gm.graph.nodes:  # annotations an earlier propagate left (ep.module() copies node meta)
        node.meta.pop("fxprop", None)

    # 1. propagate, with no side effects on the module, the program's state, the inputs, the RNG
    #    or grad mode (assert_no_side_effects: values bit for bit, versions, strides, .grad).
    try:
        with assert_no_side_effects(gm, *traced.args, *traced.guarded):
            with quiet():
                out = fxprop.propagate(traced.target, *traced.args)
    except AssertionError as error:
        return outcome(SIDE_EFFECT, first_line(error) + " " + " ".join(str(error).splitlines()[1:3]),
                       kind="side-effect")
    except Exception as error:
        node = getattr(error, "node_name", None)
        op = getattr(error, "op", None)
        reason = getattr(error, "reason", None) or first_line(error)
        reason = reason.strip().splitlines()[0][:300] if reason else ""
        where = f" at %{node} ({op})" if node else ""
        cause = error.__cause__
        cause_text = f" [cause: {type(cause).__name__}: {first_line(cause)[:200]}]" if cause is not None else ""
        return outcome(FXPROP_ERROR, f"{type(error).__name__}{where}: {reason}{cause_text}", node=node, op=op,
                       kind=type(error).__name__)

    # 2. run a copy for real, recording every node.
    with quiet():
        real = run_real_until_error(gm, *real_value(list(traced.graph_args)))
    if real.error is not None:
        return outcome(REAL_FAILED, f"%{real.failed_node}: {type(real.error).__name__}: {first_line(real.error)}",
                       node=real.failed_node, kind=type(real.error).__name__)

    # 3. every node: annotated by fxprop (not export's own meta left in place), then shape,
    #    dtype, device, strides, requires_grad.
    missing = [n.name for n in gm.graph.nodes
               if n.op != "output" and ("val" not in n.meta or not isinstance(n.meta.get("fxprop"), Provenance))]
    mismatches = compare_nodes(gm, real.values, check_strides=True, check_device=True)
    if mismatches:
        m = mismatches[0]
        more = f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        return outcome(MISMATCH, f"%{m.node} ({m.op}): {m.field} expected {m.expected}, got {m.got}{more}",
                       node=m.node, op=m.op, kind=m.field.split("[")[0], mismatches=mismatches)
    if missing:
        return outcome(MISMATCH, f"{len(missing)} node(s) not annotated by fxprop, first %{missing[0]}",
                       node=missing[0], kind="missing-val")

    # 4. the graph's output as fxprop returns it, against a real run through the traced program's
    #    public entry point after propagation: its leaves are fake tensors on the cpu, the real
    #    run's are plain cpu tensors.
    leaks = _module_leaks(gm, traced.guarded)
    if leaks:
        return outcome(LEAK, f"after propagate: {leaks[0]}", kind="module")
    with quiet():
        real_out = traced.call()
    real_leaves, got_leaves = _leaves(real_out), _leaves(out)
    for i, t in enumerate(real_leaves):
        if isinstance(t, torch.Tensor) and (_is_fake_or_meta(t) or t.device.type != "cpu"):
            return outcome(LEAK, f"a real run after propagate returned output {i} as {type(t).__name__} on {t.device}",
                           kind="real-output")
    real_leaves = [t for t in real_leaves if t is not None]
    got_leaves = [t for t in got_leaves if t is not None]
    if len(real_leaves) != len(got_leaves):
        return outcome(MISMATCH, f"output: {len(real_leaves)} leaves really, fxprop returned {len(got_leaves)}",
                       node="output", op="output", kind="structure")
    for i, (g, e) in enumerate(zip(got_leaves, real_leaves)):
        if isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor) and g.device.type != "cpu":
            return outcome(LEAK, f"fxprop's output {i} is on {g.device}", kind="output-device")
        found = compare_values(g, observe(e), node=f"output[{i}]", op="output")
        if found:
            m = found[0]
            return outcome(MISMATCH, f"%{m.node}: {m.field} expected {m.expected}, got {m.got}", node=m.node,
                           op="output", kind=m.field, mismatches=found)
    return outcome(OK)


def check_graph(gm: torch.fx.GraphModule, args: list, *, spec_inputs: bool = False, model: str = "?",
                trace_name: str = "?") -> Outcome:
    """`check_traced` for a plain graph module called positionally on ``args``."""
    prop = [as_spec(a) for a in args] if spec_inputs else list(args)
    return check_traced(Traced(gm, gm, prop, list(args), lambda: gm(*args), []), model=model, trace_name=trace_name)


@functools.lru_cache(maxsize=1)
def _exported(name: str):
    """The model, its inputs and its ExportedProgram, shared by the export-based traces of one model
    (the program is deterministic; fxprop's annotations on it are overwritten by each propagate)."""
    with quiet():
        model, inputs = CASES[name].build()
    try:
        return model, inputs, export(model, inputs), None
    except Exception as error:
        return model, inputs, None, error


def check_case(name: str, how: str = "export") -> Outcome:
    """Build corpus model ``name``, trace it with ``how`` and check fxprop against a real run."""
    start = time.perf_counter()
    result = _check_case(name, how)
    result.seconds = time.perf_counter() - start
    return result


def _check_case(name: str, how: str) -> Outcome:
    if how in TRAINING_TRACES:
        from .training import check_training
        return check_training(name, how)
    program = None
    try:
        if how in ("export", "module", "module_spec"):
            model, inputs, program, export_error = _exported(name)
            if export_error is not None:
                return Outcome(name, how, EXPORT_FAILED, f"{type(export_error).__name__}: {first_line(export_error)}",
                               kind=type(export_error).__name__)
        else:
            with quiet():
                model, inputs = CASES[name].build()
    except Exception as error:
        return Outcome(name, how, BUILD_FAILED, f"{type(error).__name__}: {first_line(error)}", kind=type(error).__name__)
    try:
        traced = trace(model, inputs, how, program)
    except Exception as error:
        return Outcome(name, how, EXPORT_FAILED, f"{type(error).__name__}: {first_line(error)}",
                       kind=type(error).__name__)
    try:
        return check_traced(traced, model=name, trace_name=how)
    except Exception as error:  # the harness itself (or a real run after propagate) failed
        tb = traceback.extract_tb(error.__traceback__)[-1]
        return Outcome(name, how, FXPROP_ERROR, f"harness: {type(error).__name__}: {first_line(error)} "
                       f"({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})", kind=type(error).__name__)
