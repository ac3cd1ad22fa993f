"""`propagate`: annotate every node of an FX graph with the value it would produce.

Call tree::

    propagate(gm, *inputs)
      check the call, convert inputs to tagged meta tensors          (specs.to_internal)
      Propagation.walk(gm): GraphWalk.run_node for each node, dispatched by node.op
        placeholder / get_attr / output: read the value            (kind "plain")
        call_function / call_method / call_module:
          memo hit?                         same target + same signature -> same result (cache)
          resolve_call(target, args)        the rule, and where the result lives       (resolution)
          run it under RuleDispatch          each aten op reached resolved the same way (dispatch)
        stage meta["val"], meta["tensor_meta"], meta["type"], meta["fxprop"]
      commit: write all staged metadata at once, only when every node succeeded

A call_module whose module is a GraphModule (split_module, fuse_partitions) is walked into:
its own nodes are annotated too.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import torch
import torch.fx

from . import symbolic, torch_compat
from .backend_flags import environment
from .blame import blame, boundary
from .cache import (CallMemo, RuleCache, TensorSignatures, is_pure, may_differentiate, rule_cache, same_result,
                    symbolic_signature, verify_by_default)
from .containers import FakeTensorFactory, map_structure, tensor_metadata
from .context import NodeRecord, Session, swap_session
from .devices import default_device_if_set, device_of, logical_default_device, merge_devices, tag
from .devices.transfers import tensors_in
from .dispatch import RuleDispatch
from .errors import InputError, InternalError, NodeError, PropagationError, UnsupportedError
from .exported import program_inputs, sync_symbols, user_outputs
from .index_values import IndexValues
from .kinds import Kind, costlier
from .modules import StateView
from .registry import generation as registry_generation, target_name
from .resolution import reaches_dispatch, resolve_call
from .source import source_line
from .specs import meta_like, to_internal, values_worth_knowing
from .torch_compat import FakeTensorMode

DEFAULT_FALLBACK_LIMIT_BYTES = 1 << 30
KNOWN_INPUTS = "fxprop_known_inputs"


@dataclass(frozen=True)
class Provenance:
    """What produced a node's value (``node.meta["fxprop"]``).

    kind: a `fxprop.Kind` ("plain", "device", "meta", "python", "decomposition", "fallback").
    rule: the rule's name; for a composite (a torch-level call), the call's own name.
    fallback_bytes: bytes of real tensors materialized for this node (0 unless something fell back).
    device_rule: the device rule that placed the result (`fxprop.devices`), when one did; None
        when the result simply lives on the common device of the inputs.
    via: for a composite, the rule of the op that set its kind.
    """
    kind: Kind
    rule: str
    fallback_bytes: int = 0
    device_rule: str | None = None
    via: str | None = None


def propagate(gm: torch.fx.GraphModule, *inputs: Any, param_device: torch.device | str | None = None,
              fallback_limit_bytes: int = DEFAULT_FALLBACK_LIMIT_BYTES, cache: bool | str | RuleCache = True,
              progress: Callable[[int, int], None] | None = None) -> Any:
    """Annotate every node of ``gm`` with shape, dtype, device and strides, without running it.

    ``gm`` may also be an ExportedProgram: its parameters, buffers and constants come from the
    program, ``inputs`` are its user inputs, and without them the values it was traced with
    are propagated. Inputs may be real, meta or fake tensors, `fxprop.TensorSpec`, python scalars, or nested
    tuples/lists/dicts of those, one per placeholder (placeholders with defaults may be left
    out). Each node gets ``meta["val"]`` (FakeTensors, as torch.export writes them),
    ``meta["tensor_meta"]`` and ``meta["type"]`` (as ShapeProp writes them) and ``meta["fxprop"]``
    (a `Provenance`). Returns the graph's output as FakeTensors in the output's own structure.

    Options:
        param_device: parameters, buffers and constants on the meta device are treated as
            living on this device.
        fallback_limit_bytes: cap on the bytes the real-tensor fallback may materialize per op.
        cache: reuse rule results across nodes and calls (True: the process-wide cache;
            False: none; a `RuleCache` of your own; "verify": the process-wide cache, with
            every hit recomputed and compared).
        progress: called as ``progress(done, total)`` before each node and once at the end.

    If any node fails, a `PropagationError` (the model's error), `UnsupportedError` (fxprop
    cannot answer) or `InternalError` (fxprop's bug) names it, and no node's metadata is changed.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(16, 32, device="meta"))
    >>> out = fxprop.propagate(gm, fxprop.TensorSpec((8, 16), device="cuda:0"), param_device="cuda:0")
    >>> tuple(out.shape), out.device
    ((8, 32), device(type='cuda', index=0))
    """
    if isinstance(gm, torch.export.ExportedProgram):
        program = gm
        outputs = propagate(program.graph_module, *program_inputs(program, inputs), param_device=param_device,
                            fallback_limit_bytes=fallback_limit_bytes, cache=cache, progress=progress)
        sync_symbols(program)  # range_constraints and unbacked_bindings follow the new annotations
        return user_outputs(program, outputs)
    _check_graph_module(gm, "propagate")
    options = _Options.checked(param_device, fallback_limit_bytes, cache, progress)
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    flat_inputs = _flatten_inputs(gm, inputs)
    _check_arity(placeholders, flat_inputs)
    symbols = symbolic.SymbolicSession()
    with logical_default_device(), torch_compat.without_ambient_modes(), symbolic.scope(symbols), \
            garbage_collection_paused():
        propagation = Propagation(gm, options, symbols)
        internal = [to_internal(symbolic.traced_example(node, value), f"input {i} (placeholder %{node.name})",
                                propagation.session.real_values)
                    for i, (value, node) in enumerate(zip(flat_inputs, placeholders))]
        output = propagation.run(lambda: propagation.walk(gm, internal))
    codegen = torch_compat.pytree_codegen(gm)
    if codegen is not None and codegen.pytree_info.out_spec is not None:
        return codegen.process_outputs(output)
    return output


def repropagate(gm: torch.fx.GraphModule, edited: Iterable[torch.fx.Node] = (), *,
                param_device: torch.device | str | None = None,
                fallback_limit_bytes: int = DEFAULT_FALLBACK_LIMIT_BYTES, cache: bool | str | RuleCache = True) -> set:
    """Re-annotate, after a pass edited ``gm``, only the edited nodes and everything downstream.

    ``edited`` names the nodes whose target or arguments changed; nodes that carry no fxprop
    annotation yet (new ones) are included automatically. Every other node keeps its
    annotation and serves as input. `gm` must have been propagated before. Returns the set of
    nodes that were re-annotated. As with `propagate`, a failure changes nothing.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
    >>> _ = fxprop.propagate(gm, fxprop.TensorSpec((2, 4)))
    >>> relu = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "1")
    >>> with gm.graph.inserting_after(relu):
    ...     doubled = gm.graph.call_function(torch.cat, ([relu, relu],))
    >>> relu.replace_all_uses_with(doubled, delete_user_cb=lambda user: user is not doubled)
    [output]
    >>> sorted(n.name for n in fxprop.repropagate(gm))
    ['cat', 'output']
    """
    _check_graph_module(gm, "repropagate")
    options = _Options.checked(param_device, fallback_limit_bytes, cache, None)
    dirty = _downstream_of_edits(gm, edited)
    symbols = symbolic.session_of(gm)
    with logical_default_device(), torch_compat.without_ambient_modes(), symbolic.scope(symbols), \
            garbage_collection_paused():
        propagation = Propagation(gm, options, symbols)
        propagation.run(lambda: propagation.walk(gm, [], dirty=dirty))
    return dirty


@contextlib.contextmanager
def garbage_collection_paused():
    """Python's cyclic garbage collector paused for the call: every generation-2 pass walks all
    live objects, which a large graph's values make many, and time per node would grow with the
    graph. The collector is resumed (when this call paused it) even when the call fails."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@dataclass(frozen=True)
class _Options:
    param_device: Any
    fallback_limit_bytes: int
    memo: RuleCache | None
    verify: bool
    progress: Callable[[int, int], None] | None

    @staticmethod
    def checked(param_device, fallback_limit_bytes, cache, progress) -> "_Options":
        if isinstance(fallback_limit_bytes, bool) or not isinstance(fallback_limit_bytes, int) or fallback_limit_bytes < 0:
            raise InputError(f"fallback_limit_bytes must be a non-negative int, got {fallback_limit_bytes!r}")
        if not (isinstance(cache, (bool, RuleCache)) or cache == "verify"):
            raise InputError(f"cache must be True, False, 'verify' or a fxprop.RuleCache, got "
                             f"{type(cache).__name__}: {cache!r}")
        if progress is not None and not callable(progress):
            raise InputError(f"progress must be a callable progress(done, total), got {type(progress).__name__}: "
                             f"{progress!r}")
        memo = rule_cache if cache is True or cache == "verify" else cache if isinstance(cache, RuleCache) else None
        return _Options(param_device, fallback_limit_bytes, memo, cache == "verify" or verify_by_default(), progress)


def _check_graph_module(gm: Any, name: str) -> None:
    if isinstance(gm, torch.fx.GraphModule):
        return
    hint = (" (wrap a bare Graph with torch.fx.GraphModule(root_module, graph))" if isinstance(gm, torch.fx.Graph) else
            " (trace a module first, e.g. torch.fx.symbolic_trace(model) or torch.export.export(model, args).module())"
            if isinstance(gm, torch.nn.Module) else "")
    raise InputError(f"{name} expects a torch.fx.GraphModule, got {type(gm).__name__}{hint}")


def _downstream_of_edits(gm: torch.fx.GraphModule, edited: Iterable[torch.fx.Node]) -> set:
    graph_nodes = set(gm.graph.nodes)
    seeds = list(edited)
    for node in seeds:
        if node not in graph_nodes:
            raise InputError(f"node %{node.name} is not in this graph")
    seeds += [node for node in gm.graph.nodes if not isinstance(node.meta.get("fxprop"), Provenance)]
    dirty: set[torch.fx.Node] = set()
    while seeds:
        node = seeds.pop()
        if node not in dirty:
            dirty.add(node)
            seeds.extend(node.users)
    placeholders = [node.name for node in dirty if node.op == "placeholder"]
    if placeholders:
        raise InputError(f"placeholders {placeholders} have no annotation to reuse; call propagate with inputs")
    if dirty and any(_may_mutate(gm, node) for node in gm.graph.nodes):
        # A mutation (a.unsqueeze_(0)) changes a value that its later readers see without an
        # edge from the mutating node, and annotations are snapshots: every node runs again.
        dirty = {node for node in gm.graph.nodes if node.op != "placeholder"}
    return dirty


_READS_ONLY = frozenset({"item", "tolist", "numpy", "data_ptr", "untyped_storage", "storage"})


def _may_mutate(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether the node may change a value other nodes read (never memoized calls that only read,
    such as ``item``, included)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if node.op == "call_method" and node.target in _READS_ONLY:
        return False
    if node.op == "call_function" and getattr(node.target, "__name__", None) in _READS_ONLY \
            and getattr(node.target, "__objclass__", None) is torch.Tensor:
        return False
    target = gm.get_submodule(str(node.target)) if node.op == "call_module" else node.target
    return not is_pure(node.op, target, node.args, node.kwargs)


def _flatten_inputs(gm: torch.fx.GraphModule, inputs: tuple) -> list:
    codegen = torch_compat.pytree_codegen(gm)
    if codegen is not None and codegen.pytree_info.in_spec is not None:
        try:
            return list(codegen.process_inputs(*inputs))
        except Exception as error:
            raise InputError(f"inputs do not match the graph's input structure "
                             f"{codegen.pytree_info.in_spec}: {error}") from None
    return list(inputs)


def _check_arity(placeholders: list[torch.fx.Node], inputs: list) -> None:
    if any(str(node.target).startswith("*") for node in placeholders):
        return
    required = [node for node in placeholders if not node.args]
    if len(required) <= len(inputs) <= len(placeholders):
        return
    names = ", ".join(node.name for node in placeholders)
    expected = (f"{len(placeholders)}" if len(required) == len(placeholders)
                else f"{len(required)} to {len(placeholders)}")
    raise InputError(f"the graph takes {expected} inputs ({names}), got {len(inputs)}")


class Propagation:
    """One `propagate` or `repropagate` call: the state every graph it walks shares."""

    def __init__(self, gm: torch.fx.GraphModule, options: _Options, symbols: symbolic.SymbolicSession):
        self.gm = gm
        self.options = options
        self.session = Session(options.fallback_limit_bytes)
        self.session.walk_subgraph = self.walk_subgraph
        self.session.open_region, self.session.close_region = self.open_region, self.close_region
        self.regions: list[tuple[Hashable, Callable | None, Callable[[], None]]] = []
        self.state = StateView(options.param_device)
        self.symbols = symbols
        self.mode = RuleDispatch(self.session)
        self.make_fake = FakeTensorFactory(FakeTensorMode(allow_non_fake_inputs=True))
        self.staged: dict[torch.fx.Node, tuple] = {}
        self.index_values = IndexValues()
        self.default_device: torch.device | None = None
        self.environment: Hashable = ()
        self.around: Callable | None = None  # set by walk_subgraph for a body's calls (autocast's casts)
        self.differentiates = options.memo is not None and may_differentiate(gm)
        self.known_inputs: dict[str, torch.Tensor] | None = None  # set when the root's placeholders run
        self.symbolic_memo = RuleCache(max_entries=1 << 16)
        self.signatures = TensorSignatures()
        self.symbolic_formats: dict = {}  # memory formats of symbolic sizes, by their expressions

    def run(self, walk: Callable[[], Any]) -> Any:
        """Run ``walk`` with the caller's global state kept, then commit what it staged."""
        torch_compat.install_patches(_node_device_of_current_session)
        self.default_device = default_device_if_set()  # None (unset) and a set "cpu" differ for torch.tensor
        self.environment = (environment(), None, None)  # the flags now, the enclosing frame, its context
        outer = swap_session(self.session)
        grad_enabled, default_dtype = torch.is_grad_enabled(), torch.get_default_dtype()
        autograd_modes = torch_compat.autograd_modes(self.gm)
        failed = True
        try:
            with logical_default_device():
                output = walk()
            failed = False
        finally:
            while self.regions:  # a region the graph never closed (or one a failure left open)
                self.close_region()
            torch_compat.restore_autograd_modes(autograd_modes, failed)
            torch.set_grad_enabled(grad_enabled)
            torch.set_default_dtype(default_dtype)
            swap_session(outer)
        if self.symbols.active:
            self.symbols.adopt(self.staged)
        self.commit()
        self.gm.meta["fxprop"].update(self.symbols.summary())
        return output

    def walk(self, gm: torch.fx.GraphModule, inputs: list, dirty: set | None = None) -> Any:
        return GraphWalk(self, gm, dirty, progress=self.options.progress).run(inputs)

    def walk_subgraph(self, gm: torch.fx.GraphModule, inputs: list, context: Hashable = None,
                      around: Callable | None = None) -> Any:
        """Propagate a subgraph (a higher-order op's body, a nested GraphModule), annotating its nodes.

        A higher-order op's rule calls this while its own node runs: the subgraph's nodes are
        propagated as nodes of their own (each its own record, kind and fallback bytes, the latter
        also counted for the calling node), under the grad mode the rule set. ``context``
        names anything else the rule set around the body that its results depend on (autocast's
        state), so that memoized results are told apart. ``around(target, args, kwargs, compute)``,
        when given, computes each call_function / call_method node of the body (and of the
        subgraphs it calls) in place of ``compute(args, kwargs)``; both return (value, provenance).
        Returns the subgraph's output as the walk's own values (meta tensors), to compute on.
        """
        mode, session = self.mode, self.session
        saved = (session.record, mode.depth, mode.noted_depth, mode.in_progress, mode.pushed, self.environment,
                 self.around)
        mode.depth = mode.noted_depth = 0
        mode.in_progress = ()
        self.environment = (environment(), self.environment, context)
        if around is not None:
            self.around = around
        walk = GraphWalk(self, gm, None)
        try:
            with torch_compat.without_ambient_modes():  # each node enters fxprop's dispatch afresh
                walk.run(list(inputs))
        finally:
            (session.record, mode.depth, mode.noted_depth, mode.in_progress, mode.pushed, self.environment,
             self.around) = saved
        session.record.fallback_bytes += sum(self.staged[node][3].fallback_bytes for node in walk.env)
        return walk.output_value

    def open_region(self, context: Hashable, around: Callable, on_close: Callable[[], None]) -> None:
        """The nodes from here until `close_region` run inside a region a node opened (an
        ``_enter_autocast`` node): each call computes through ``around`` (as a higher-order op's body
        does, see `walk_subgraph`), memoized apart by ``context``; ``on_close`` undoes the rule's own state."""
        self.regions.append((self.environment, self.around, on_close))
        self.environment = (environment(), self.environment, context)
        self.around = around

    def refresh_environment(self) -> None:
        """Read the flags again after a call that may have set them (``_set_grad_enabled``,
        ``set_default_dtype``): later results are keyed by the flags they ran under."""
        self.environment = (environment(), *self.environment[1:])

    def close_region(self) -> None:
        self.environment, self.around, on_close = self.regions.pop()
        on_close()

    def memo_for(self, op: str, target: Any, args: tuple, kwargs: dict) -> CallMemo | None:
        """The cache slot of one call, or None where a cached answer could be wrong."""
        cache = self.options.memo
        if cache is None:
            return None
        symbolic_call = self.symbols.active
        if symbolic_call:
            cache = self.symbolic_memo  # expressions name this propagation's symbols: never shared beyond it
        real_values = self.session.real_values
        if real_values and any(t in real_values for t in tensors_in(args, kwargs)):
            return None  # a rule may read the values, which the key does not hold
        context = (self.environment, self.default_device, registry_generation())
        target_key = (lambda: self.state.signature(target)) if op == "call_module" else (lambda: target)
        return CallMemo.for_call(cache, op, target, target_key, args, kwargs, context, self.differentiates,
                                 symbolic_signature if symbolic_call else self.signatures)

    def commit(self) -> None:
        for node, (fake, tensor_meta, value_type, provenance) in self.staged.items():
            node.meta["val"] = fake
            if tensor_meta is not None:
                node.meta["tensor_meta"] = tensor_meta
            else:
                node.meta.pop("tensor_meta", None)
            node.meta["type"] = value_type
            node.meta["fxprop"] = provenance
        kinds: dict[str, int] = {}
        fallback_bytes = 0
        for node in self.gm.graph.nodes:
            provenance = node.meta.get("fxprop")
            if isinstance(provenance, Provenance):
                kinds[provenance.kind.value] = kinds.get(provenance.kind.value, 0) + 1
                fallback_bytes += provenance.fallback_bytes
        if self.known_inputs is not None:
            # The values of inputs passed for real that rules may read: kept so that a repropagate
            # (which takes its inputs from the annotations) knows them as this call did.
            self.gm.meta[KNOWN_INPUTS] = self.known_inputs
        summary = self.gm.meta.setdefault("fxprop", {})
        memo = self.options.memo
        summary.update({"kinds": kinds, "fallback_bytes": fallback_bytes,
                        "cache": memo.stats() if memo is not None else None})


def _node_device_of_current_session():
    from .context import node_device
    return node_device()


_PLAIN_INPUT = Provenance(Kind.PLAIN, "input")
_PLAIN_ATTRIBUTE = Provenance(Kind.PLAIN, "attribute")
_PLAIN_OUTPUT = Provenance(Kind.PLAIN, "output")


class GraphWalk:
    """Propagates one graph node by node, like `torch.fx.Interpreter`: one method per node op."""

    def __init__(self, propagation: Propagation, gm: torch.fx.GraphModule, dirty: set | None,
                 progress: Callable[[int, int], None] | None = None):
        self.propagation = propagation
        self.gm = gm
        self.dirty = dirty
        self.progress = progress
        self.env: dict[torch.fx.Node, Any] = {}
        self.output_value: Any = None

    def run(self, inputs: list) -> Any:
        self.remaining = iter(inputs)
        nodes = self.gm.graph.nodes
        total = len(nodes)
        for index, node in enumerate(nodes):
            if self.progress is not None:
                self.progress(index, total)
            if self.dirty is not None and node not in self.dirty:
                continue
            self.run_node(node)
        if self.progress is not None:
            self.progress(total, total)
        return self.staged_output()

    def run_node(self, node: torch.fx.Node) -> None:
        try:
            handler = getattr(self, node.op, None) if node.op in _NODE_OPS else None
            if handler is None:
                raise PropagationError(f"unknown node kind {node.op!r}", error_type=RuntimeError)
            value, provenance = handler(node)
            self.env[node] = value
            self.stage(node, value, provenance)  # a value torch cannot represent is this node's error
        except NodeError as error:
            if error.node_name is not None:
                raise
            raise self.placed(node, error) from (error.__cause__ or error)
        except Exception as error:
            blamed = blame(error)
            raise self.placed(node, blamed) from error

    # --- node ops -----------------------------------------------------------------------

    def placeholder(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        if str(node.target).startswith("*"):
            return tuple(self.remaining), _PLAIN_INPUT
        try:
            value = next(self.remaining)
        except StopIteration:
            if node.args:
                return self.propagation.state.value(node.args[0]), _PLAIN_INPUT
            raise PropagationError(f"no input for placeholder %{node.name}", error_type=TypeError)
        propagation = self.propagation
        if self.gm is propagation.gm:
            if propagation.known_inputs is None:
                propagation.known_inputs = {}
            known = propagation.session.real_values.get(value) if isinstance(value, torch.Tensor) else None
            if known is not None:
                propagation.known_inputs[node.name] = known.detach().clone()
        return value, _PLAIN_INPUT

    def get_attr(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        owner: Any = self.gm
        walked = []
        for part in str(node.target).split("."):
            walked.append(part)
            if not hasattr(owner, part):
                raise PropagationError(f"get_attr: the module has no attribute {'.'.join(walked)!r} "
                                       f"(target {node.target!r})", error_type=AttributeError)
            owner = getattr(owner, part)
        if isinstance(owner, torch.fx.GraphModule):
            return owner, _PLAIN_ATTRIBUTE  # a subgraph (a higher-order op's body): walked, never run, so not shadowed
        value = self.propagation.state.value(owner)
        if isinstance(owner, torch.Tensor) and values_worth_knowing(owner) and self.propagation.state.unwritten(value):
            self.propagation.session.real_values.remember(value, owner)  # a constant: its values are the module's
        return value, _PLAIN_ATTRIBUTE

    def output(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        self.output_value = self.load(node.args[0])
        return self.output_value, _PLAIN_OUTPUT

    def call_function(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        if not callable(node.target):
            raise PropagationError(f"call_function target {node.target!r} is not callable", error_type=TypeError)
        return self.call(node, node.target)

    def call_method(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        if not isinstance(node.target, str):
            raise PropagationError(f"call_method target must be a method name, got {node.target!r}",
                                   error_type=TypeError)
        return self.call(node, node.target)

    def call_module(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        try:
            module = self.gm.get_submodule(str(node.target))
        except AttributeError as error:
            raise PropagationError(f"call_module: the module has no submodule {node.target!r} ({error})",
                                   error_type=AttributeError) from None
        return self.call(node, module)

    # --- calls --------------------------------------------------------------------------

    def load(self, argument: Any) -> Any:
        def value_of(node: torch.fx.Node) -> Any:
            if node not in self.env:
                if not (self.dirty is not None and "val" in node.meta):
                    raise PropagationError(f"node %{node.name} is used before it is defined", error_type=NameError)
                self.env[node] = map_structure(lambda fake: meta_like(fake, fake.device), node.meta["val"])
                known = self.gm.meta.get(KNOWN_INPUTS, {}).get(node.name) if node.op == "placeholder" else None
                if known is not None and isinstance(self.env[node], torch.Tensor):
                    self.propagation.session.real_values.remember(self.env[node], known)
            return self.env[node]
        return torch.fx.node.map_arg(argument, value_of)

    def call(self, node: torch.fx.Node, target: Any) -> tuple[Any, Provenance]:
        args, kwargs = self.load(node.args), self.load(node.kwargs)
        memo = self.propagation.memo_for(node.op, target, args, kwargs)
        hit = memo.lookup(args, kwargs, self.propagation.session.fallback_limit_bytes) if memo is not None else None
        if hit is not None and not self.propagation.options.verify:
            value, provenance = hit
        else:
            symbols_before = self.propagation.symbols.symbol_count()
            around = self.propagation.around
            if around is not None and node.op != "call_module":
                value, provenance = around(target, args, kwargs, lambda a, k: self.compute(node, target, a, k))
            else:
                value, provenance = self.compute(node, target, args, kwargs)
            if hit is not None and not same_result(hit[0], value, tensors_in(args, kwargs)):
                raise InternalError(f"the rule cache returned a different result for {target_name(target)} than "
                                    f"the rule computes now: cached {_describe(hit[0])}, computed {_describe(value)}")
            symbols = self.propagation.symbols
            created_symbols = False
            if symbols.active:
                created_symbols = symbols.claim(node.name) or symbols.symbol_count() != symbols_before
                symbols.check_size(value)
            if memo is None:
                if self.propagation.options.memo is not None:
                    # the call may have changed a tensor it was given, or global state the key holds
                    self.propagation.signatures.forget()
                    self.propagation.refresh_environment()
            elif hit is None and not created_symbols:
                memo.store(args, kwargs, value, provenance)
        self.propagation.index_values.observe(node, type(target) if node.op == "call_module" else target,
                                              args, kwargs, value)
        return value, provenance

    def compute(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> tuple[Any, Provenance]:
        propagation = self.propagation
        if isinstance(target, torch.fx.GraphModule) and node.op == "call_module":
            return self.nested_graph(target, args, kwargs)
        resolution = resolve_call(target, args, kwargs)
        rule, placement = resolution.rule, resolution.placement
        if rule.kind is Kind.DEVICE:
            return placement.host_value, Provenance(Kind.DEVICE, rule.name, device_rule=rule.device_rule)
        if rule.kind is Kind.UNSUPPORTED:
            raise UnsupportedError(rule.name)
        state = propagation.state
        if node.op == "call_module":
            device = merge_devices([*tensors_in(args, kwargs), *state.state_tensors(target)])
            call_target = state.shadow(target)
            call_args = (call_target, *args) if rule.kind is Kind.PYTHON else args
            call_kwargs, device_rule = kwargs, None
        else:
            device = placement.device
            call_target, call_args, call_kwargs = placement.target, placement.args, placement.kwargs
            device_rule = rule.device_rule
        record = NodeRecord(device=device)
        propagation.session.record = record
        mode = propagation.mode
        with torch.device("meta"), mode, symbolic.dispatcher(propagation.symbols):
            if rule.kind is Kind.PYTHON and not reaches_dispatch(call_target):
                with mode.running(call_target if node.op != "call_module" else type(target)):
                    value = rule.fn(*call_args, **call_kwargs)
                kind, name, via = Kind.PYTHON, rule.name, None
            else:
                value = _invoke(call_target, call_args, call_kwargs)
                if rule.composite:
                    kind, name, via = record.kind or Kind.PLAIN, rule.name, record.rule or None
                else:  # an aten op that reached the dispatch: its rule is the one the dispatch applied
                    kind, name, via = record.kind or rule.kind, record.rule or rule.name, None
        produced: list[torch.Tensor] = []
        map_structure(lambda t: produced.append(tag(t, device) if device is not None else t), value)
        if not produced:
            device_rule = None  # a python value: no device was placed
        return value, Provenance(kind, name, record.fallback_bytes, device_rule, via)

    def nested_graph(self, gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> tuple[Any, Provenance]:
        """A call_module of a GraphModule: walked into, so that its nodes are annotated too."""
        if kwargs:
            raise PropagationError(f"a GraphModule takes positional inputs, got keyword arguments {sorted(kwargs)}",
                                   error_type=TypeError)
        before = set(self.propagation.staged)
        value = self.propagation.walk_subgraph(gm, list(args))  # the original: its get_attrs read its own state
        kind, fallback_bytes = Kind.PLAIN, 0
        for inner, staged in self.propagation.staged.items():
            if inner not in before:
                kind = costlier(kind, staged[3].kind)
                fallback_bytes += staged[3].fallback_bytes
        return value, Provenance(kind, f"subgraph {type(gm).__name__}", fallback_bytes)

    # --- metadata -----------------------------------------------------------------------

    def stage(self, node: torch.fx.Node, value: Any, provenance: Provenance) -> None:
        found_tensor = False
        make_fake = self.propagation.make_fake

        def to_fake(tensor: torch.Tensor):
            nonlocal found_tensor
            found_tensor = True
            return make_fake(tensor, device_of(tensor))

        fake = map_structure(to_fake, value)
        formats = self.propagation.symbolic_formats
        tensor_meta = map_structure(lambda t: tensor_metadata(t, formats), value) if found_tensor else None
        self.propagation.staged[node] = (fake, tensor_meta, type(value), provenance)

    def staged_output(self) -> Any:
        outputs = [node for node in self.gm.graph.nodes if node.op == "output"]
        if not outputs:
            return None
        staged = self.propagation.staged.get(outputs[-1])
        return staged[0] if staged is not None else outputs[-1].meta.get("val")

    def placed(self, node: torch.fx.Node, error: NodeError) -> NodeError:
        inputs = tuple(_describe_inputs(self.load_for_error(node.args), self.load_for_error(node.kwargs)))
        reason = error.reason
        symbols = self.propagation.symbols
        if symbols.active:
            reason, inputs = symbols.readable(reason), tuple(map(symbols.readable, inputs))
        return error.at_node(node_name=node.name, op=_op_name(node), inputs=inputs, source=source_line(node),
                             reason=f"fxprop: {_op_name(node)} failed: {reason}")

    def load_for_error(self, argument: Any) -> Any:
        return torch.fx.node.map_arg(argument, lambda n: self.env.get(n, f"%{n.name} (not computed)"))


_NODE_OPS = frozenset({"placeholder", "get_attr", "call_function", "call_method", "call_module", "output"})


@boundary
def _invoke(target: Any, args: tuple, kwargs: dict) -> Any:
    """The node's own call, on meta tensors: what torch or the user's code raises here is theirs."""
    if isinstance(target, str):
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"call_module {node.target}"
    if node.op == "call_method":
        return f"call_method Tensor.{node.target}"
    if node.op == "call_function":
        return f"call_function {target_name(node.target)}"
    return f"{node.op} {node.target}"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"Tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')}, "
                f"device={device_of(value)}{', requires_grad=True' if value.requires_grad else ''})")
    if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
        return "[" + ", ".join(_describe(item) for item in value) + "]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe_inputs(args: tuple, kwargs: dict):
    for i, value in enumerate(args):
        yield f"arg{i}: {_describe(value)}"
    for name, value in kwargs.items():
        yield f"{name}: {_describe(value)}"
