"""Training graphs of a corpus model, propagated by fxprop and compared node by node with real execution.

Traces (`TRAINING_TRACES`), each with the model in train mode (dropout present, so values are
never compared: shapes, dtypes, devices, significant strides, and requires_grad in the joint
graph; AOT's graphs run under no_grad on inputs AOT traced detached while it calls them with the
parameters themselves, so requires_grad says nothing about them):

- ``aot``: ``torch.compile(model, backend=aot_autograd(...), dynamic=False)``. The forward,
  backward and inference compilers propagate each graph AOT hands them on its fake example
  inputs, record what the propagation added to dynamo's ShapeEnv (guards, replacements, runtime
  asserts: it must add none), and return a callable that runs the graph node by node for real
  (a `torch.fx.Interpreter`) when AOT calls it, comparing every node with fxprop's ``meta["val"]``.
  The loss is the sum of the first floating output (``.loss`` when the model returns one).
- ``aot_dynamic``: the same with ``dynamic=True``, called twice: with the corpus inputs, then with
  one more batch row and token inputs two positions shorter, so that a size specialized by
  propagation would show. fxprop's symbolic sizes are SymInts of dynamo's ShapeEnv; each real call
  binds the ShapeEnv's symbols to the call's sizes (SymInt placeholders get ints, a tensor
  placeholder's symbolic sizes its real tensor's sizes; an unbacked size its first real value)
  and evaluates fxprop's sizes and strides with them.
- ``joint``: ``make_fx`` of a function computing the loss and ``torch.autograd.grad`` of it with
  respect to the parameters, traced with real inputs (static; see `JOINT_TRACINGS`), propagated
  with the same real inputs and compared with a real run of that joint graph.

The reference is real execution, not AOT's own metadata (which follows the meta kernels: e.g. the
CPU's ``native_layer_norm_backward`` lays out the gradient of a transposed input its own way).

A check that torch itself cannot do is not fxprop's fault: when ``torch.compile`` fails, the same
call with the ``aot_eager`` backend is tried, and if that fails too the run is ``COMPILE-FAILED``
with torch's error; ``make_fx`` failing on the joint function is ``EXPORT-FAILED``.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch
import torch.fx
from torch.utils import _pytree as pytree

from .harness import (BUILD_FAILED, COMPILE_FAILED, EXPORT_FAILED, FXPROP_ERROR, GUARD, MISMATCH, OK, REAL_FAILED,
                      TRAINING_TRACES, Outcome, first_line, quiet)
from .models import CASES


@dataclass(frozen=True)
class GraphMismatch:
    """One field of one node of one training graph where fxprop and real execution disagree."""
    graph: str       # "fw1", "bw1", "inference1" (the order AOT compiled them in), "joint"
    node: str
    op: str
    field: str
    expected: Any    # real execution
    got: Any         # fxprop, its symbolic sizes evaluated at the real call's sizes
    call: int = 0    # which real call of the graph (the dynamic trace calls the model twice)

    def __str__(self) -> str:
        call = f" (call {self.call + 1})" if self.call else ""
        return f"{self.graph} %{self.node} ({self.op}){call}: {self.field} expected {self.expected}, got {self.got}"


@dataclass
class GraphCheck:
    """What the checks of one graph found."""
    label: str
    nodes: int
    added: list[str] = field(default_factory=list)   # what propagation added to the ShapeEnv
    error: str | None = None                         # propagation's failure
    failed_node: str | None = None
    failed_op: str | None = None
    real_error: str | None = None                    # the real run's failure
    calls: int = 0
    seconds: float = 0.0                             # propagation's time
    mismatches: list[GraphMismatch] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The model's loss and its inputs

def loss_of(output: Any) -> torch.Tensor:
    """``output.loss`` when the model computed one, else the sum of its first floating output."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    items = output.to_tuple() if hasattr(output, "to_tuple") else output
    first = next(t for t in pytree.tree_leaves(items) if isinstance(t, torch.Tensor) and t.is_floating_point())
    return first.sum()


def resized(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs with one more batch row (a copy of the first) and 2-d integer inputs (token ids,
    masks) two positions shorter: sizes a dynamic graph must not have specialized on."""
    out = {}
    for name, t in inputs.items():
        t = torch.cat([t, t[:1]])
        if t.dim() == 2 and not t.is_floating_point() and t.shape[1] > 3:
            t = t[:, :t.shape[1] - 2].contiguous()
        out[name] = t
    return out


# ---------------------------------------------------------------------------------------------
# Symbolic sizes evaluated at a real call's sizes

class Bindings:
    """The ShapeEnv's symbols bound to one real call's sizes."""

    def __init__(self) -> None:
        self.values: dict[sympy.Symbol, int] = {}

    def bind(self, fake: Any, real: Any) -> None:
        """Bind the bare symbols of ``fake``'s sizes (a SymInt, or a tensor's sizes and strides) to
        ``real``'s; symbols already bound and compound expressions are left alone (the placeholders'
        own comparison then checks the compound ones)."""
        if isinstance(fake, torch.SymInt):
            if isinstance(real, int):
                self._bind_one(fake, real)
        elif isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and fake.dim() == real.dim():
            for f, r in zip(fake.shape, real.shape):
                self._bind_one(f, r)
            if fake.layout is torch.strided and real.layout is torch.strided:
                for f, r in zip(fake.stride(), real.stride()):
                    self._bind_one(f, r)
        elif isinstance(fake, (list, tuple)) and isinstance(real, (list, tuple)) and len(fake) == len(real):
            for f, r in zip(fake, real):
                self.bind(f, r)

    def bind_observed(self, fake: Any, real: Any) -> None:
        """Like `bind`, from a real value's recorded metadata (an unbacked size's first value)."""
        from fxprop.testing import Observed
        if isinstance(fake, torch.Tensor) and isinstance(real, Observed) and fake.dim() == len(real.shape):
            for f, r in zip(fake.shape, real.shape):
                self._bind_one(f, r)
        elif isinstance(fake, torch.SymInt) and isinstance(real, int):
            self._bind_one(fake, real)
        elif isinstance(fake, (list, tuple)) and isinstance(real, (list, tuple)) and len(fake) == len(real):
            for f, r in zip(fake, real):
                self.bind_observed(f, r)

    def _bind_one(self, size: Any, real: int) -> None:
        if isinstance(size, torch.SymInt):
            expr = _expr(size)
            if isinstance(expr, sympy.Symbol) and expr not in self.values:
                self.values[expr] = int(real)

    def evaluate(self, size: Any) -> Any:
        """An int for a size, a SymInt's expression at the bound values; None when a symbol is unbound."""
        if isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            expr = _expr(size).xreplace({s: sympy.Integer(v) for s, v in self.values.items()})
            if expr.free_symbols:
                return None
            kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(size)]
            return kind(expr)
        return size


def _expr(size: Any) -> sympy.Expr:
    node = size.node
    expr = node.expr
    env = getattr(node, "shape_env", None)
    return env.replace(expr) if env is not None else expr


# ---------------------------------------------------------------------------------------------
# Comparing a node's annotation with its real value

def compare(graph: str, gm: torch.fx.GraphModule, observed: dict[str, Any], bindings: Bindings, *, call: int = 0,
            check_grad: bool = True) -> list[GraphMismatch]:
    """Every node's ``meta["val"]`` (its sizes evaluated at ``bindings``, unbacked sizes bound in node
    order from their first real value) against what the real run ``observed``."""
    from fxprop.testing.mismatches import op_label
    out: list[GraphMismatch] = []
    for node in gm.graph.nodes:
        if node.op == "output" or node.name not in observed:
            continue
        got, real = node.meta.get("val"), observed[node.name]
        bindings.bind_observed(got, real)
        _compare(graph, node.name, op_label(node), got, real, bindings, check_grad, call, "", out)
    return out


def _compare(graph, node, op, got, real, bindings, grad, call, path, out) -> None:
    from fxprop.testing import Observed, significant_strides

    def differ(name, expected, value):
        out.append(GraphMismatch(graph, node, op, f"{name}{path}", expected, value, call))

    if isinstance(real, Observed):
        if not isinstance(got, torch.Tensor):
            return differ("value", "a tensor", type(got).__name__)
        shape = tuple(bindings.evaluate(s) for s in got.shape)
        if shape != real.shape:
            return differ("shape", real.shape, _shown(shape, got.shape))
        if got.dtype != real.dtype:
            differ("dtype", real.dtype, got.dtype)
        if got.device != real.device:
            differ("device", real.device, got.device)
        if grad and got.requires_grad != real.requires_grad:
            differ("requires_grad", real.requires_grad, got.requires_grad)
        if real.stride is not None and got.layout is torch.strided:
            stride = tuple(bindings.evaluate(s) for s in got.stride())
            if None in stride or significant_strides(shape, stride) != significant_strides(real.shape, real.stride):
                differ("stride", real.stride, _shown(stride, got.stride()))
        return
    if isinstance(real, (list, tuple)) and not isinstance(real, torch.Size):
        if not isinstance(got, (list, tuple)) or len(got) != len(real):
            return differ("structure", f"{type(real).__name__} of {len(real)}", type(got).__name__)
        for i, (g, r) in enumerate(zip(got, real)):
            _compare(graph, node, op, g, r, bindings, grad, call, f"{path}[{i}]", out)
        return
    if isinstance(real, (bool, int, float)) and not isinstance(got, torch.Tensor):
        value = bindings.evaluate(got)
        if value is None:  # a value read from data (``.item()``): only its type is known without running
            kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}.get(type(got))
            if kind is not type(real):
                differ("value", repr(real), repr(got))
        elif type(value) is not type(real) or (value != real and real == real):
            differ("value", real, value)
        return
    if real is None and got is not None:
        differ("value", None, type(got).__name__)


def _shown(evaluated: tuple, symbolic: tuple) -> tuple:
    """Evaluated sizes, with the expression where a symbol is unbound."""
    return tuple(str(s) if e is None else e for e, s in zip(evaluated, symbolic))


class RealRun(torch.fx.Interpreter):
    """A graph run for real, every node's value recorded as `fxprop.testing.observe` describes it."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, node: torch.fx.Node) -> Any:
        from fxprop.testing import observe
        result = super().run_node(node)
        self.values[node.name] = observe(result)
        return result


# ---------------------------------------------------------------------------------------------
# AOT's graphs

def _shape_env_state(env) -> tuple[int, dict, int]:
    if env is None:
        return 0, {}, 0
    asserts = sum(len(a) for a in env.deferred_runtime_asserts.values())
    return len(env.guards), dict(env.replacements), asserts


def _added(env, before: tuple[int, dict, int]) -> list[str]:
    if env is None:
        return []
    guards, replacements, asserts = before
    added = [f"guard {g.expr}" for g in env.guards[guards:]]
    added += [f"replacement {k} -> {v}" for k, v in env.replacements.items() if replacements.get(k) != v]
    if sum(len(a) for a in env.deferred_runtime_asserts.values()) != asserts:
        added.append("runtime assert(s)")
    return added


class Compilers:
    """AOT's forward, backward and inference compilers: propagate each graph, then check every real call."""

    def __init__(self) -> None:
        self.graphs: list[GraphCheck] = []
        self.counts: dict[str, int] = {}

    def compiler(self, kind: str) -> Callable:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            import fxprop
            from functorch.compile import make_boxed_func
            self.counts[kind] = self.counts.get(kind, 0) + 1
            check = GraphCheck(f"{kind}{self.counts[kind]}", len(gm.graph.nodes))
            self.graphs.append(check)
            fake_mode = torch._guards.detect_fake_mode(example_inputs)
            env = getattr(fake_mode, "shape_env", None)
            before = _shape_env_state(env)
            start = time.perf_counter()
            try:
                with quiet():
                    fxprop.propagate(gm, *example_inputs)
            except Exception as error:
                check.error = f"{type(error).__name__}: {getattr(error, 'reason', None) or first_line(error)}"
                check.failed_node, check.failed_op = getattr(error, "node_name", None), getattr(error, "op", None)
                return make_boxed_func(gm.forward)
            finally:
                check.added = _added(env, before)
                check.seconds = time.perf_counter() - start
            examples = list(example_inputs)

            def run(*args: Any) -> Any:
                real_run = RealRun(gm)
                try:
                    result = real_run.run(*args)
                except Exception as error:
                    check.real_error = f"{type(error).__name__}: {first_line(error)}"
                    raise
                bindings = Bindings()
                for fake, real in zip(examples, args):
                    bindings.bind(fake, real)
                check.mismatches += compare(check.label, gm, real_run.values, bindings, call=check.calls,
                                            check_grad=False)
                check.calls += 1
                return result
            return make_boxed_func(run)
        return compile_graph


def _train_steps(model: torch.nn.Module, calls: list[dict], backend: Any, dynamic: bool) -> None:
    import torch._dynamo
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for inputs in calls:
        loss_of(compiled(**inputs)).backward()


def check_compiled(model: torch.nn.Module, calls: list[dict], *, dynamic: bool, name: str = "?",
                   how: str = "aot") -> Outcome:
    """``torch.compile`` ``model`` with AOT compilers that propagate each graph and check each of its
    real calls (`Compilers`), take a training step per entry of ``calls`` (the model's keyword
    inputs), and judge every graph: ``OK``, ``MISMATCH``, ``GUARD``, ``FXPROP-ERROR`` (kind
    ``"compile"`` where torch.compile itself failed), or ``REAL-FAILED`` (AOT's graph does not run)."""
    from torch._dynamo.backends.common import aot_autograd
    compilers = Compilers()
    backend = aot_autograd(fw_compiler=compilers.compiler("fw"), bw_compiler=compilers.compiler("bw"),
                           inference_compiler=compilers.compiler("inference"))
    try:
        with quiet():
            _train_steps(model, calls, backend, dynamic)
    except Exception as error:
        if not any(g.error or g.real_error for g in compilers.graphs):
            tb = traceback.extract_tb(error.__traceback__)[-1]
            return Outcome(name, how, FXPROP_ERROR, f"torch.compile fails with fxprop's compilers: "
                           f"{type(error).__name__}: {first_line(error)} ({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})",
                           kind="compile", nodes=_nodes(compilers))
    return _verdict(name, how, compilers.graphs)


def check_aot(name: str, dynamic: bool) -> Outcome:
    how = "aot_dynamic" if dynamic else "aot"
    built = _built(name, how)
    if isinstance(built, Outcome):
        return built
    model, inputs = built
    calls = [inputs, resized(inputs)] if dynamic else [inputs]
    outcome = check_compiled(model, calls, dynamic=dynamic, name=name, how=how)
    if outcome.kind == "compile":
        eager = _aot_eager_error(name, calls, dynamic)
        if eager is not None:
            return Outcome(name, how, COMPILE_FAILED, f"torch.compile(backend='aot_eager') fails too: {eager}",
                           kind="compile")
        outcome.detail += " (aot_eager compiles it)"
    return outcome


def _built(name: str, how: str) -> tuple[torch.nn.Module, dict] | Outcome:
    """The model in train mode and its inputs; a ``BUILD-FAILED`` outcome when it cannot be built."""
    try:
        with quiet():
            model, inputs = CASES[name].build()
    except Exception as error:
        return Outcome(name, how, BUILD_FAILED, f"{type(error).__name__}: {first_line(error)}", kind=type(error).__name__)
    return model.train(), inputs


def _aot_eager_error(name: str, calls: list[dict], dynamic: bool) -> str | None:
    model, _ = CASES[name].build()
    model.train()
    try:
        with quiet():
            _train_steps(model, calls, "aot_eager", dynamic)
    except Exception as error:
        return f"{type(error).__name__}: {first_line(error)}"
    return None


def _nodes(compilers: Compilers) -> int:
    return sum(g.nodes for g in compilers.graphs)


def _verdict(name: str, how: str, graphs: list[GraphCheck]) -> Outcome:
    """One outcome for all the graphs of a trace: the first fault, all mismatches listed."""
    nodes = sum(g.nodes for g in graphs)
    shape = " ".join(f"{g.label}: {g.nodes} nodes, {g.calls} call(s), propagated in {g.seconds:.1f}s;"
                     for g in graphs).rstrip(";")
    outcome = lambda status, detail="", **kw: Outcome(name, how, status, f"{detail} [{shape}]".strip(),  # noqa: E731
                                                      nodes=nodes, **kw)
    for g in graphs:
        if g.error is not None:
            where = f" at {g.label} %{g.failed_node} ({g.failed_op})" if g.failed_node else f" in {g.label}"
            return outcome(FXPROP_ERROR, f"propagate{where}: {g.error}", node=g.failed_node, op=g.failed_op,
                           kind=g.error.split(":")[0])
    for g in graphs:
        if g.real_error is not None:
            return outcome(REAL_FAILED, f"{g.label}: {g.real_error}", kind="real")
    added = [f"{g.label}: {a}" for g in graphs for a in g.added]
    mismatches = [m for g in graphs for m in g.mismatches]
    if mismatches:
        m = mismatches[0]
        more = f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        extra = f"; also added to the ShapeEnv: {added}" if added else ""
        return outcome(MISMATCH, f"{m}{more}{extra}", node=f"{m.graph}:{m.node}", op=m.op,
                       kind=m.field.split("[")[0], mismatches=mismatches)
    if added:
        return outcome(GUARD, f"propagation added to dynamo's ShapeEnv: {'; '.join(added)}", kind="shape-env",
                       mismatches=added)
    unchecked = [g.label for g in graphs if g.calls == 0]
    if unchecked:
        return outcome(MISMATCH, f"graphs never called for real: {unchecked}", kind="uncalled")
    if not graphs:
        return outcome(MISMATCH, "no graph was compiled", kind="uncalled")
    return outcome(OK)


# ---------------------------------------------------------------------------------------------
# The joint graph

# How the joint function is traced, in order: real tensors; fake ones where transformers reads a
# value of the inputs (it then takes the path it takes under torch.compile); real ones with the
# values it reads burned into the graph (MoE routing, a detector's masks: the graph is of these inputs).
JOINT_TRACINGS = (("real", True), ("fake", True), ("real", False))


def check_joint(name: str) -> Outcome:
    import fxprop
    from torch.fx.experimental.proxy_tensor import make_fx
    built = _built(name, "joint")
    if isinstance(built, Outcome):
        return built
    model, inputs = built
    params = {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}

    def joint(params, buffers, inputs):
        loss = loss_of(torch.func.functional_call(model, (params, buffers), (), inputs))
        return loss, torch.autograd.grad(loss, list(params.values()), allow_unused=True)

    errors = []
    for mode, strict in JOINT_TRACINGS:
        try:
            with quiet():
                gm = make_fx(joint, tracing_mode=mode, _error_on_data_dependent_ops=strict)(params, buffers, inputs)
            check = GraphCheck(f"joint({mode}{'' if strict else ', values read burned in'})", len(gm.graph.nodes))
            break
        except Exception as error:
            errors.append(f"tracing_mode={mode!r}{'' if strict else ' (values burned in)'}: "
                          f"{type(error).__name__}: {first_line(error)[:200]}")
    else:
        return Outcome(name, "joint", EXPORT_FAILED, f"make_fx cannot trace it: {'; '.join(errors)}",
                       kind="make_fx")
    args = (params, {k: b.clone() for k, b in buffers.items()}, inputs)
    start = time.perf_counter()
    try:
        with quiet():
            fxprop.propagate(gm, *args)
    except Exception as error:
        check.error = f"{type(error).__name__}: {getattr(error, 'reason', None) or first_line(error)}"
        check.failed_node, check.failed_op = getattr(error, "node_name", None), getattr(error, "op", None)
        return _verdict(name, "joint", [check])
    check.seconds = time.perf_counter() - start
    real_run = RealRun(gm)
    try:
        with quiet():
            real_run.run(*args)
    except Exception as error:
        check.real_error = f"{type(error).__name__}: {first_line(error)}"
        return _verdict(name, "joint", [check])
    check.mismatches = compare(check.label, gm, real_run.values, Bindings())
    check.calls = 1
    return _verdict(name, "joint", [check])


def check_training(name: str, how: str) -> Outcome:
    """Check corpus model ``name``'s training graphs the way ``how`` names (one of `TRAINING_TRACES`)."""
    start = time.perf_counter()
    if how not in TRAINING_TRACES:
        raise ValueError(f"unknown training trace {how!r}; one of {TRAINING_TRACES}")
    try:
        result = check_joint(name) if how == "joint" else check_aot(name, dynamic=how == "aot_dynamic")
    except Exception as error:  # the harness itself failed
        tb = traceback.extract_tb(error.__traceback__)[-1]
        result = Outcome(name, how, FXPROP_ERROR, f"harness: {type(error).__name__}: {first_line(error)} "
                         f"({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})", kind=type(error).__name__)
    result.seconds = time.perf_counter() - start
    return result


