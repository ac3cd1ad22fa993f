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
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import torch
import torch.fx

from .. import ambient, symbolic, torch_compat
from ..call import Call
from ..memo.backend_flags import environment
from ..memo.purity import is_pure, may_differentiate
from ..memo.cache import CallMemo, RuleCache, rule_cache, verify_by_default
from ..memo.signatures import TensorSignatures, known_values_signature
from .metadata import FakeTensorFactory, map_structure
from .session import NodeRecord, Session
from ..devices import default_device_if_set, logical_default_device
from .dispatch import DTensorDispatch, RuleDispatch
from ..distributed import dtensors
from ..distributed.fsdp import FsdpEmulation
from ..errors import InputError
from .exported import program_inputs, sync_symbols, user_outputs
from ..aten.index_values import IndexValues
from .module_state import StateView
from ..resolve.registry import generation as registry_generation
from .inputs import TensorSpec, to_internal, traced_example
from ..torch_compat import own_state, pytree
from .walk import KNOWN_INPUTS, DTensorMade, GraphWalk, Provenance
from .collector import garbage_collection_paused
from .call_checks import check_arity, check_graph_module, check_output, flatten_inputs
from .replaying import run_or_replay

DEFAULT_FALLBACK_LIMIT_BYTES = 1 << 30
_VALUES_KEPT_WITH_AN_ENTRY = 4096  # elements: a larger known result (a long arange) is computed each time


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
    A graph that does not end in exactly one output node, or the wrong number of inputs, raises
    `InputError` before any node is visited.

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
    check_graph_module(gm, "propagate")
    check_output(gm.graph)
    options = _Options.checked(param_device, fallback_limit_bytes, cache, progress)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    flat_inputs = flatten_inputs(gm, inputs)
    check_arity(placeholders, flat_inputs)
    with_dtensors = _holds_dtensors(gm, flat_inputs)
    while True:
        symbols = symbolic.SymbolicSession()
        with logical_default_device(), torch_compat.without_ambient_modes(), \
                torch_compat.without_callers_python_dispatcher(), symbolic.scope(symbols), garbage_collection_paused():
            try:
                output = _propagate_once(gm, options, symbols, with_dtensors, flat_inputs, placeholders)
            except DTensorMade:
                with_dtensors = True  # a node made one (DTensor.from_local): again, DTensor's way
                continue
        break
    codegen = torch_compat.pytree_codegen(gm)
    if codegen is not None and codegen.pytree_info.out_spec is not None:
        return codegen.process_outputs(output)
    return output


def _propagate_once(gm: torch.fx.GraphModule, options: "_Options", symbols: Any, with_dtensors: bool,
                    flat_inputs: list, placeholders: list) -> Any:
    """One propagation of ``gm``, in a frame of its own: what the walk held is freed as it returns,
    before the garbage collector resumes and would walk it."""
    propagation = Propagation(gm, options, symbols, with_dtensors)
    try:
        internal = [to_internal(traced_example(node, value), f"input {i} (placeholder %{node.name})",
                                propagation.session.real_values)
                    for i, (value, node) in enumerate(zip(flat_inputs, placeholders))]
        return run_or_replay(propagation, internal)
    finally:
        propagation.release()  # neither a refused input nor a replay runs the walk, which releases it otherwise


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
    check_graph_module(gm, "repropagate")
    check_output(gm.graph)
    options = _Options.checked(param_device, fallback_limit_bytes, cache, None)
    dirty = _downstream_of_edits(gm, edited)
    symbols = symbolic.session_of(gm)
    # The annotations the walk starts from are its inputs: DTensors there take DTensor's way again.
    annotations = [node.meta.get("val") for node in gm.graph.nodes if node not in dirty]
    with_dtensors = _holds_dtensors(gm, annotations)
    with logical_default_device(), torch_compat.without_ambient_modes(), \
            torch_compat.without_callers_python_dispatcher(), symbolic.scope(symbols), garbage_collection_paused():
        propagation = Propagation(gm, options, symbols, with_dtensors)
        propagation.run(lambda: propagation.walk(gm, [], dirty=dirty))
    return dirty


def _holds_dtensors(gm: torch.fx.GraphModule, inputs: list) -> bool:
    """Whether the graph's inputs or its module's state hold DTensors: checked once per call, so
    that graphs without them take the plain path (no DTensor can exist before its module is imported)."""
    if torch_compat.dtensor_type() is None and not any(isinstance(value, TensorSpec) and value.mesh is not None
                                                       for value in inputs):
        return False
    found = []
    map_structure(lambda tensor: found.append(dtensors.is_dtensor(tensor)), inputs)
    return (any(found) or any(isinstance(value, TensorSpec) and value.mesh is not None for value in inputs)
            or _state_holds(gm, torch_compat.dtensor_type()))


def _state_holds(module: torch.nn.Module, kind: type) -> bool:
    """Whether a parameter or buffer of ``module`` or of a module it holds is a ``kind``."""
    pending, seen = [module], {id(module)}
    while pending:
        parameters, buffers, submodules = own_state(pending.pop())
        for tensor in (*parameters.values(), *buffers.values()):
            if tensor is not None and type(tensor) is not torch.Tensor and isinstance(tensor, kind):
                return True
        for child in submodules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                pending.append(child)
    return False


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


class Propagation:
    """One `propagate` or `repropagate` call: the state every graph it walks shares."""

    def __init__(self, gm: torch.fx.GraphModule, options: _Options, symbols: symbolic.SymbolicSession,
                 with_dtensors: bool = False):
        self.gm = gm
        self.options = options
        self.session = Session(options.fallback_limit_bytes)
        self.session.walk_subgraph = self.walk_subgraph
        self.session.open_region, self.session.close_region = self.open_region, self.close_region
        self.regions: list[tuple[Hashable, Callable | None, Callable[[], None]]] = []
        self.state = StateView(options.param_device, self.session.real_values)
        self.symbols = symbols
        self.sharding = dtensors.ShardingRecorder() if with_dtensors else None
        if with_dtensors:
            torch_compat.prepare_dtensor_decompositions()
        self.mode = DTensorDispatch(self.session, self.sharding) if with_dtensors else RuleDispatch(self.session)
        torch_compat.dispatch_without_importing_dynamo(type(self.mode))
        self.shardings: dict[torch.fx.Node, dtensors.NodeSharding] = {}
        self.fsdp = FsdpEmulation.for_graph(gm, self.state, self.sharding) if with_dtensors else None
        if self.fsdp is not None:
            self.state.adjust_shadow = self.fsdp.adjust_shadow
        self.before_graph: dtensors.NodeSharding | None = None  # FSDP's root pre-forward, before the first node
        self.make_fake = FakeTensorFactory(torch_compat.container_fake_mode())
        self.staged: dict[torch.fx.Node, tuple] = {}
        self.index_values = IndexValues()
        self.default_device: torch.device | None = None
        self.environment: Hashable = ()
        self.around: Callable | None = None  # set by walk_subgraph for a body's calls (autocast's casts)
        self._differentiates: bool | None = None
        self.known_inputs: dict[str, torch.Tensor] | None = None  # set when the root's placeholders run
        self.symbolic_memo = RuleCache(max_entries=1 << 16)
        self.signatures = TensorSignatures()
        self.symbolic_signatures = TensorSignatures(symbolic=True)
        self.symbolic_formats: dict = {}  # memory formats of symbolic sizes, by their expressions
        self.recordings: dict[torch.fx.Node, Any] | None = None  # what the walk staged, to replay (`replaying`)

    def run(self, walk: Callable[[], Any]) -> Any:
        """Run ``walk`` with the caller's global state kept, then commit what it staged."""
        torch_compat.install_patches()
        self.default_device = default_device_if_set()  # None (unset) and a set "cpu" differ for torch.tensor
        self.environment = (environment(), None, None)  # the flags now, the enclosing frame, its context
        grad_enabled, default_dtype = torch.is_grad_enabled(), torch.get_default_dtype()
        with torch_compat.dual_level_turn(self.gm) as enters_dual_level:
            autograd_modes = torch_compat.autograd_modes(enters_dual_level)
            failed = True
            try:
                with logical_default_device(), ambient.entered(session=self.session), \
                        self.symbols.decisions_kept_from_caller(), \
                        self.sharding.observing() if self.sharding is not None else contextlib.nullcontext():
                    output = walk()
                failed = False
            finally:
                while self.regions:  # a region the graph never closed (or one a failure left open)
                    self.close_region()
                torch_compat.restore_autograd_modes(autograd_modes, failed)
                torch.set_grad_enabled(grad_enabled)
                torch.set_default_dtype(default_dtype)
                self.release()
        if self.symbols.active:
            self.symbols.adopt(self.staged)
        self.commit()
        self.gm.meta["fxprop"].update(self.symbols.summary())
        return output

    def fsdp_before_graph(self, inputs: list) -> list:
        """The pre-forward of the FSDP module the graph was traced from (`fxprop.distributed.fsdp`):
        it runs before the graph's first node, is recorded with that node, and gives the graph its
        inputs (cast as its mixed precision policy asks)."""
        if self.fsdp is None:
            return inputs
        self.session.record = NodeRecord(device=None)
        self.sharding.begin((), {})
        with torch.device("meta"), self.mode, symbolic.dispatcher(self.symbols):
            inputs = self.fsdp.before_graph(inputs)
        self.before_graph = self.sharding.finish(None)
        return inputs

    def release(self) -> None:
        """Drop the session's callbacks into this propagation: the cycle they make would otherwise
        leave everything the call held (its values, signatures and known values) to the cyclic
        garbage collector rather than to reference counting."""
        self.session.walk_subgraph = self.session.open_region = self.session.close_region = None

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
        walk = GraphWalk(self, gm, None)
        with self.mode.outermost(), self.calling_frame(context, around), torch_compat.without_ambient_modes():
            walk.run(list(inputs))  # each node enters fxprop's dispatch afresh, as a node of its own
        self.session.record.fallback_bytes += sum(self.staged[node][3].fallback_bytes for node in walk.env)
        return walk.output_value

    @contextlib.contextmanager
    def calling_frame(self, context: Hashable, around: Callable | None):
        """The calling node's record, the memo's environment and ``around`` while a subgraph runs
        inside a node: the subgraph's nodes keep records of their own, are memoized apart by
        ``context``, and compute through ``around`` when given; the caller's come back after."""
        saved = (self.session.record, self.environment, self.around)
        self.environment = (environment(), self.environment, context)
        if around is not None:
            self.around = around
        try:
            yield
        finally:
            self.session.record, self.environment, self.around = saved

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

    def values_held_by(self, value: Any) -> tuple | None:
        """The known values a result holds, as a memo entry keeps them: (position among its tensors,
        a copy of the real values); None where one is larger than an entry keeps."""
        known = self.session.real_values
        if not known:
            return ()
        held = []
        for position, leaf in enumerate(leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)):
            real = known.get(leaf)
            if real is not None:
                if real.numel() > _VALUES_KEPT_WITH_AN_ENTRY:
                    return None
                held.append((position, real.clone()))
        return tuple(held)

    def remember_values(self, value: Any, values: tuple) -> None:
        """A memoized result's known values, for the tensors rebuilt from the entry."""
        tensors = [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]
        for position, real in values:
            self.session.real_values.remember(tensors[position], real.clone())

    def memo_for(self, op: str, call: Call) -> CallMemo | None:
        """The cache slot of a node's call (``op``: the node's op), or None where a cached answer could be wrong."""
        cache = self.options.memo
        if cache is None or self.sharding is not None:  # a DTensor's signature would not hold its placements
            return None
        symbolic_call = self.symbols.active
        if symbolic_call:
            cache = self.symbolic_memo  # expressions name this propagation's symbols: never shared beyond it
        if op == "call_module" and torch_compat.global_module_hooks_registered():
            return None  # hooks every module call runs (nn.modules.module.register_module_forward_hook)
        known = known_values_signature(call.tensors, self.session.real_values) if self.session.real_values else ()
        if known is None:
            return None
        context = (self.environment, self.default_device, registry_generation(), known)
        target = call.target
        target_key = (lambda: self.state.signature(target)) if op == "call_module" else (lambda: target)
        if self._differentiates is None:
            self._differentiates = may_differentiate(self.gm)
        return CallMemo.for_call(cache, op, call, target_key, context, self._differentiates,
                                 self.symbolic_signatures if symbolic_call else self.signatures)

    def commit(self) -> None:
        for node, (fake, tensor_meta, value_type, provenance) in self.staged.items():
            node.meta["val"] = fake
            if tensor_meta is not None:
                node.meta["tensor_meta"] = tensor_meta
            else:
                node.meta.pop("tensor_meta", None)
            node.meta["type"] = value_type
            node.meta["fxprop"] = provenance
        first = next(iter(self.gm.graph.nodes))
        if self.before_graph is not None and self.before_graph.gathers and first in self.staged:
            self.shardings[first] = dtensors.before(self.before_graph, self.shardings.get(first), self.staged[first][0])
        if self.sharding is not None or self.gm.meta.get("fxprop", {}).get("dtensors"):
            for node in self.staged:
                sharding = self.shardings.get(node)
                if sharding is not None:
                    node.meta[dtensors.META_KEY] = sharding
                else:
                    node.meta.pop(dtensors.META_KEY, None)
        counted: dict = {}
        fallback_bytes = 0
        for node in self.gm.graph.nodes:
            provenance = node.meta.get("fxprop")
            if isinstance(provenance, Provenance):
                kind = provenance.kind
                counted[kind] = counted.get(kind, 0) + 1
                fallback_bytes += provenance.fallback_bytes
        kinds = {kind.value: count for kind, count in counted.items()}
        if self.known_inputs is not None:
            # The values of inputs passed for real that rules may read: kept so that a repropagate
            # (which takes its inputs from the annotations) knows them as this call did.
            self.gm.meta[KNOWN_INPUTS] = self.known_inputs
        summary = self.gm.meta.setdefault("fxprop", {})
        memo = self.options.memo
        summary.update({"kinds": kinds, "fallback_bytes": fallback_bytes,
                        "cache": memo.stats() if memo is not None else None, "dtensors": self.sharding is not None})
