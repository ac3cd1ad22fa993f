"""The walk over one graph's nodes: one handler per node kind, as `torch.fx.Interpreter` has, each
staging what its node becomes and the `Provenance` of the answer."""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from .. import symbolic, torch_compat
from .blame import blame, boundary
from .composite_kernels import call_composite
from ..memo.cache import same_result
from ..memo.purity import reads_process_state
from ..memo.replay import NodeRecording, template
from .metadata import map_structure, tensor_metadata
from .session import NodeRecord
from ..devices import device_of, merge_devices, tag
from ..call import Call
from ..errors import InternalError, NodeError, PropagationError, UnsupportedError
from ..kinds import Kind, costlier
from ..resolve.registry import target_name
from ..resolve.order import reaches_dispatch, resolve_call
from .source import source_line
from ..distributed import dtensors
from .inputs import meta_like, values_worth_knowing

_PYTHON_FUNCTIONS = (types.FunctionType, types.MethodType)


def _geometries(tensors: list) -> list:
    """What a call may change of the tensors it is given outside torch's dispatcher (``.data =``,
    ``torch.utils.swap_tensors``, ``requires_grad_``); symbolic sizes compared by their nodes,
    never by asking the ShapeEnv."""
    return [(torch_compat.storage_key(t), _plain(t.untyped_storage().nbytes()), _plain(t.storage_offset()),
             tuple(map(_plain, t.shape)), tuple(map(_plain, t.stride())), t.dtype, t.requires_grad) for t in tensors]


def _plain(size: Any) -> Any:
    return size.node if isinstance(size, torch.SymInt) else size


class DTensorMade(Exception):
    """A node of a graph propagated without DTensor handling made a DTensor: start again with it."""


KNOWN_INPUTS = "fxprop_known_inputs"  # gm.meta key: the real values of the inputs, for repropagate


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


_PLAIN_INPUT = Provenance(Kind.PLAIN, "input")
_PLAIN_ATTRIBUTE = Provenance(Kind.PLAIN, "attribute")
_PLAIN_OUTPUT = Provenance(Kind.PLAIN, "output")


class GraphWalk:
    """Propagates one graph node by node, like `torch.fx.Interpreter`: one method per node op."""

    def __init__(self, propagation: Any, gm: torch.fx.GraphModule, dirty: set | None,
                 progress: Callable[[int, int], None] | None = None):
        self.propagation = propagation
        self.gm = gm
        self.dirty = dirty
        self.progress = progress
        self.env: dict[torch.fx.Node, Any] = {}
        self.passed: set[torch.fx.Node] = set()  # the nodes the walk has gone past, in graph order
        self.output_node: torch.fx.Node | None = None
        self.output_value: Any = None

    def run(self, inputs: list) -> Any:
        """Propagate every node in graph order, as the graph's generated code runs them: its
        placeholders bind the inputs first (they are the code's parameters, wherever they stand),
        and the first output returns (nodes after it never run)."""
        if self.gm is self.propagation.gm:
            inputs = self.propagation.fsdp_before_graph(inputs)
        self.remaining = iter(inputs)
        nodes = self.gm.graph.nodes
        total = len(nodes)
        for node in self.gm.graph.find_nodes(op="placeholder"):
            if self.dirty is None or node in self.dirty:
                self.run_node(node)
            self.passed.add(node)
        for index, node in enumerate(nodes):
            if self.progress is not None:
                self.progress(index, total)
            if node.op != "placeholder" and (self.dirty is None or node in self.dirty):
                self.run_node(node)
            self.passed.add(node)
            if node.op == "output":
                self.output_node = node
                break
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
        except DTensorMade:
            raise
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
                if torch_compat.is_erased(node):
                    raise PropagationError(f"node %{node.name} was erased from the graph but is still used",
                                           error_type=RuntimeError)
                if node.graph is not self.gm.graph:
                    raise PropagationError(f"node %{node.name} belongs to another graph (copy nodes with "
                                           "Graph.node_copy(node, arg_transform) to map their arguments)",
                                           error_type=RuntimeError)
                # re-propagating: an untouched node that came before keeps its annotation
                if not (self.dirty is not None and node in self.passed and node not in self.dirty
                        and "val" in node.meta):
                    raise PropagationError(f"node %{node.name} is used before it is defined", error_type=NameError)
                self.env[node] = map_structure(_internal_again, node.meta["val"])
                known = self.gm.meta.get(KNOWN_INPUTS, {}).get(node.name) if node.op == "placeholder" else None
                if known is not None and isinstance(self.env[node], torch.Tensor):
                    self.propagation.session.real_values.remember(self.env[node], known)
            return self.env[node]
        return torch.fx.node.map_arg(argument, value_of)

    def call(self, node: torch.fx.Node, target: Any) -> tuple[Any, Provenance]:
        args, kwargs = self.load(node.args), self.load(node.kwargs)
        call = Call(target, args, kwargs)
        memo = self.propagation.memo_for(node.op, call)
        hit = memo.lookup(call, self.propagation.session.fallback_limit_bytes) if memo is not None else None
        if hit is not None and not self.propagation.options.verify:
            value, provenance, values = hit
            if values:
                self.propagation.remember_values(value, values)
        else:
            symbols_before = self.propagation.symbols.symbol_count()
            session = self.propagation.session
            storages_before, reshaped_before = session.storages_of_calls, session.reshaped_in_place
            given_before = None
            if memo is not None:
                session.storages_of_calls = storages_before.union(map(torch_compat.storage_key, call.tensors))
                if node.op == "call_module" or isinstance(target, _PYTHON_FUNCTIONS):
                    given_before = _geometries(call.tensors)
            try:
                around = self.propagation.around
                if around is not None and node.op != "call_module":
                    with symbolic.dispatcher(self.propagation.symbols):  # its casts run outside the node's kernels
                        value, provenance = around(target, args, kwargs,
                                                   lambda a, k: self.compute(node, Call(target, a, k)))
                else:
                    value, provenance = self.compute(node, call)
            finally:
                session.storages_of_calls = storages_before
            if hit is not None and not same_result(hit[0], value, call.tensors):
                raise InternalError(f"the rule cache returned a different result for {target_name(target)} than "
                                    f"the rule computes now: cached {_describe(hit[0])}, computed {_describe(value)}")
            symbols = self.propagation.symbols
            created_symbols = False
            if symbols.active:
                created_symbols = symbols.claim(node.name) or symbols.symbol_count() != symbols_before
                symbols.check_size(value)
            # A call that resized or restrided a tensor it was given (``torch._refs._maybe_resize_out``,
            # ``torch._C._swap_tensor_impl`` inside a python function, whose names do not say so): a
            # hit would skip that, and the signatures taken of its inputs are stale.
            reshaped = session.reshaped_in_place != reshaped_before or (
                given_before is not None and _geometries(call.tensors) != given_before)
            if memo is None or reshaped:
                if self.propagation.options.memo is not None:
                    # the call may have changed a tensor it was given, or global state the key holds
                    self.propagation.signatures.forget()
                    self.propagation.symbolic_signatures.forget()
                    self.propagation.refresh_environment()
            elif hit is None and not created_symbols and not reads_process_state(node, value):
                values = self.propagation.values_held_by(value)
                if values is not None:  # None: values too large to keep with the entry, so it is not kept
                    memo.store(call, value, provenance, values)
        self.propagation.index_values.observe(node, type(target) if node.op == "call_module" else target,
                                              args, kwargs, value)
        return value, provenance

    def compute(self, node: torch.fx.Node, call: Call) -> tuple[Any, Provenance]:
        propagation = self.propagation
        target, args, kwargs = call.target, call.args, call.kwargs
        if isinstance(target, torch.fx.GraphModule) and node.op == "call_module":
            return self.nested_graph(target, args, kwargs)
        resolution = resolve_call(call)
        rule, placement = resolution.rule, resolution.placement
        if rule.kind is Kind.DEVICE:
            return placement.host_value, Provenance(Kind.DEVICE, rule.name, device_rule=rule.device_rule)
        if rule.kind is Kind.UNSUPPORTED:
            raise UnsupportedError(rule.name)
        state = propagation.state
        if node.op == "call_module":
            device = merge_devices([*call.tensors, *state.state_tensors(target)])
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
        sharding = propagation.sharding
        if sharding is not None:
            sharding.begin(args, kwargs, tuple(state.state_tensors(target)) if node.op == "call_module" else ())
        with torch.device("meta"), mode, symbolic.dispatcher(propagation.symbols):
            if rule.kind is Kind.PYTHON and not reaches_dispatch(call_target):
                with mode.running(call_target if node.op != "call_module" else type(target)):
                    value = rule.fn(*call_args, **call_kwargs)
                kind, name, via = Kind.PYTHON, rule.name, None
            else:
                if sharding is not None:
                    value = _invoke_with_dtensors(call_target, call_args, call_kwargs)
                elif rule.composite:
                    value = call_composite(call_target, call_args, call_kwargs, device)
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
        if sharding is not None:
            propagation.shardings[node] = sharding.finish(value)
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
            if dtensors.is_dtensor(tensor):
                if self.propagation.sharding is None:  # made in the graph (DTensor.from_local)
                    raise DTensorMade
                return dtensors.stage_dtensor(tensor, make_fake)
            return make_fake(tensor, device_of(tensor))

        fake = map_structure(to_fake, value)
        formats = self.propagation.symbolic_formats
        tensor_meta = map_structure(lambda t: tensor_metadata(t, formats), value) if found_tensor else None
        self.propagation.staged[node] = (fake, tensor_meta, type(value), provenance)
        recordings = self.propagation.recordings
        if recordings is not None and self.gm is self.propagation.gm:
            described = None if reads_process_state(node, value) else template(value)  # None: walked every time
            recordings[node] = NodeRecording(described, tensor_meta, type(value), provenance)

    def staged_output(self) -> Any:
        if self.output_node is None:
            return None
        staged = self.propagation.staged.get(self.output_node)
        return staged[0] if staged is not None else self.output_node.meta.get("val")

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


def _invoke_with_dtensors(target: Any, args: tuple, kwargs: dict) -> Any:
    """`_invoke` where DTensors may take part: an op DTensor has no sharding strategy for is one
    fxprop cannot answer (it takes placements from DTensor alone), not the model's error."""
    try:
        return _invoke(target, args, kwargs)
    except Exception as error:
        if "does not have a sharding strategy registered" in str(error):
            raise dtensors.refuse_unsharded(error, target, args, kwargs) from error
        raise


def _internal_again(fake: torch.Tensor) -> torch.Tensor:
    """An annotation as a value to compute on again (`repropagate`)."""
    if dtensors.is_dtensor(fake):
        return dtensors.internal_dtensor(fake, meta_like)
    return meta_like(fake, fake.device)


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
    if isinstance(value, torch.UntypedStorage):  # its repr reads a symbolic size as an int, and raises
        return f"UntypedStorage(nbytes={value.nbytes()})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe_inputs(args: tuple, kwargs: dict):
    for i, value in enumerate(args):
        yield f"arg{i}: {_describe(value)}"
    for name, value in kwargs.items():
        yield f"{name}: {_describe(value)}"
