"""`propagate`: annotate every node of an FX graph with the value it would produce.

Call tree::

    propagate(gm, *inputs)
      check the call, convert inputs to tagged meta tensors       (specs.to_internal)
      _Run.walk: for each node in order
        placeholder / get_attr / output: read the value
        call_*: place(...)            device rule: where the result lives  (devices)
                cache lookup           same target + same signature -> same result (cache)
                run under RuleDispatch every aten op resolved by lookup  (dispatch, rules)
        stage meta["val"], meta["tensor_meta"], meta["fxprop"]
      commit: write all staged metadata at once, only when every node succeeded
"""
from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.graph import _PyTreeCodeGen

from .cache import RuleCache, Uncacheable, rule_cache, signature
from .containers import FakeTensorFactory, map_structure, tensor_metadata
from .devices import default_device_if_set, device_of, logical_default_device, merge_devices, place, tag
from .context import NodeRecord, Session
from .dispatch import RuleDispatch
from .errors import FxpropError, InputError, PropagationError
from .index_values import IndexValues
from .modules import StateView
from .rules.registry import Kind, python_rule, target_name
from .rules.attention import attention_settings
from .rules.registry import generation as registry_generation
from .source import source_line
from .specs import meta_like, to_internal
from . import symbolic

DEFAULT_FALLBACK_LIMIT_BYTES = 1 << 30


@dataclass(frozen=True)
class Provenance:
    """Which kind of rule produced a node's value (``node.meta["fxprop"]``).

    kind: "python", "meta", "decomposition", "device" or "fallback".
    rule: the rule's name; for a node that reached several aten ops, the one that set its kind.
    fallback_bytes: bytes of real tensors materialized for this node (0 unless it fell back).
    """
    kind: str
    rule: str
    fallback_bytes: int = 0


@dataclass(frozen=True)
class _TensorRecord:
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    requires_grad: bool
    device: torch.device


def propagate(gm: torch.fx.GraphModule, *inputs: Any, param_device: torch.device | str | None = None,
              fallback_limit_bytes: int = DEFAULT_FALLBACK_LIMIT_BYTES, cache: bool | RuleCache = True,
              progress: Callable[[int, int], None] | None = None) -> Any:
    """Annotate every node of ``gm`` with shape, dtype, device and strides, without running it.

    Inputs may be real, meta or fake tensors, `fxprop.TensorSpec`, python scalars, or nested
    tuples/lists/dicts of those, one per placeholder (placeholders with defaults may be left
    out). Each node gets ``meta["val"]`` (FakeTensors, as torch.export writes them),
    ``meta["tensor_meta"]`` (as ShapeProp writes it) and ``meta["fxprop"]`` (a `Provenance`).
    Returns the graph's output as FakeTensors in the output's own structure.

    Options:
        param_device: parameters, buffers and constants on the meta device are treated as
            living on this device.
        fallback_limit_bytes: cap on the bytes the real-tensor fallback may materialize per op.
        cache: reuse rule results across nodes and calls (True: the process-wide cache;
            False: none; or a `RuleCache` of your own).
        progress: called as ``progress(done, total)`` before each node and once at the end.

    If any node fails, a `PropagationError` names it and no node's metadata is changed.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(16, 32, device="meta"))
    >>> out = fxprop.propagate(gm, fxprop.TensorSpec((8, 16), device="cuda:0"), param_device="cuda:0")
    >>> tuple(out.shape), out.device
    ((8, 32), device(type='cuda', index=0))
    """
    if not isinstance(gm, torch.fx.GraphModule):
        hint = (" (wrap a bare Graph with torch.fx.GraphModule(root_module, graph))"
                if isinstance(gm, torch.fx.Graph) else
                " (trace a module first, e.g. torch.fx.symbolic_trace(model) or torch.export.export(model, args).module())"
                if isinstance(gm, torch.nn.Module) else "")
        raise InputError(f"propagate expects a torch.fx.GraphModule, got {type(gm).__name__}{hint}")
    if not isinstance(fallback_limit_bytes, int) or fallback_limit_bytes < 0:
        raise InputError(f"fallback_limit_bytes must be a non-negative int, got {fallback_limit_bytes!r}")
    if not isinstance(cache, (bool, RuleCache)):
        raise InputError(f"cache must be True, False or a fxprop.RuleCache, got {type(cache).__name__}: {cache!r}")
    session = Session(fallback_limit_bytes)
    state = StateView(param_device)
    flat_inputs = _flatten_inputs(gm, inputs)
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    _check_arity(placeholders, flat_inputs)
    symbols = symbolic.SymbolicSession()
    with symbolic.scope(symbols):
        internal = [to_internal(value, f"input {i} (placeholder %{node.name})", session.real_values)
                    for i, (value, node) in enumerate(zip(flat_inputs, placeholders))]
        run = _Run(gm, session, state, _memo_for(cache), progress)
        with _restored_global_state(), logical_default_device():
            output = run.walk(internal)
        if symbols.active:
            symbols.adopt(run.staged)
    run.commit()
    gm.meta["fxprop"].update(symbols.summary())
    if isinstance(gm.graph._codegen, _PyTreeCodeGen) and gm.graph._codegen.pytree_info.out_spec is not None:
        return gm.graph._codegen.process_outputs(output)
    return output


def repropagate(gm: torch.fx.GraphModule, edited: Iterable[torch.fx.Node] = (), *,
                param_device: torch.device | str | None = None,
                fallback_limit_bytes: int = DEFAULT_FALLBACK_LIMIT_BYTES, cache: bool | RuleCache = True) -> set:
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
    if not isinstance(gm, torch.fx.GraphModule):
        raise InputError(f"repropagate expects a torch.fx.GraphModule, got {type(gm).__name__}")
    graph_nodes = set(gm.graph.nodes)
    seeds = [node for node in edited]
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
    session = Session(fallback_limit_bytes)
    symbols = symbolic.session_of(gm)
    with symbolic.scope(symbols):
        run = _Run(gm, session, StateView(param_device), _memo_for(cache))
        with _restored_global_state(), logical_default_device():
            run.walk([], dirty=dirty)
        if symbols.active:
            symbols.adopt(run.staged)
    run.commit()
    gm.meta["fxprop"].update(symbols.summary())
    return dirty


def _memo_for(cache: bool | RuleCache) -> RuleCache | None:
    if cache is True:
        return rule_cache
    return cache if isinstance(cache, RuleCache) else None  # not `cache or None`: an empty RuleCache is falsy


def _flatten_inputs(gm: torch.fx.GraphModule, inputs: tuple) -> list:
    codegen = gm.graph._codegen
    if isinstance(codegen, _PyTreeCodeGen) and codegen.pytree_info.in_spec is not None:
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


@contextlib.contextmanager
def _restored_global_state():
    """Graph nodes may toggle grad mode; the caller's state and RNG come back unchanged."""
    grad_enabled = torch.is_grad_enabled()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            torch.set_grad_enabled(grad_enabled)


_IN_PLACE_OPERATORS = frozenset({"iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imod", "imul", "imatmul", "ior",
                                  "ipow", "irshift", "isub", "itruediv", "ixor"})
_PURE_MODULES = ("torch", "_operator", "operator", "math", "builtins")
_IMPURE_CALLS = frozenset({operator.setitem, operator.delitem, torch._C._set_grad_enabled, print,
                           getattr(torch, "_assert_async", print)})


class _Run:
    def __init__(self, gm: torch.fx.GraphModule, session: Session, state: StateView, memo: RuleCache | None,
                 progress: Callable[[int, int], None] | None = None):
        self.gm = gm
        self.progress = progress
        self.session = session
        self.state = state
        self.memo = memo
        self.symbols = symbolic.current()
        self.mode = RuleDispatch(session)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.make_fake = FakeTensorFactory(self.fake_mode)
        self.default_device: torch.device | None = None
        self.attention_settings: tuple = ()
        self.env: dict[torch.fx.Node, Any] = {}
        self.staged: dict[torch.fx.Node, tuple] = {}
        self.index_values = IndexValues()
        self.reuse_annotations = False

    # --- walking ---------------------------------------------------------------------

    def walk(self, inputs: list, dirty: set[torch.fx.Node] | None = None) -> Any:
        """Propagate every node, or with ``dirty`` only those, reusing the others' annotations."""
        self.default_device = default_device_if_set()  # None (unset) and a set "cpu" differ for torch.tensor
        self.attention_settings = attention_settings()  # sdpa's backend choice reads them
        self.reuse_annotations = dirty is not None
        remaining = iter(inputs)
        output = None
        total = len(self.gm.graph.nodes)
        for index, node in enumerate(self.gm.graph.nodes):
            if self.progress is not None:
                self.progress(index, total)
            if dirty is not None and node not in dirty:
                continue
            try:
                if node.op == "placeholder":
                    value, provenance = self.placeholder(node, remaining), Provenance("python", "input")
                elif node.op == "get_attr":
                    value, provenance = self.state.value(self.fetch_attr(node)), Provenance("python", "attribute")
                elif node.op == "output":
                    value, provenance = self.load(node.args[0]), Provenance("python", "output")
                    output = value
                elif node.op in ("call_function", "call_method", "call_module"):
                    value, provenance = self.call(node)
                else:
                    raise PropagationError(f"unknown node kind {node.op!r}")
                self.env[node] = value
                self.stage(node, value, provenance)  # a value torch cannot represent is this node's error
            except FxpropError as error:
                if isinstance(error, PropagationError) and error.node_name is not None:
                    raise
                raise self.node_error(node, error) from error
            except Exception as error:
                raise self.node_error(node, error) from error
        if self.progress is not None:
            self.progress(total, total)
        return self.staged_output(output)

    def placeholder(self, node: torch.fx.Node, remaining) -> Any:
        if str(node.target).startswith("*"):
            return tuple(remaining)
        try:
            return next(remaining)
        except StopIteration:
            if node.args:
                return self.state.value(node.args[0])
            raise PropagationError(f"no input for placeholder %{node.name}")

    def fetch_attr(self, node: torch.fx.Node) -> Any:
        owner: Any = self.gm
        walked = []
        for part in str(node.target).split("."):
            walked.append(part)
            if not hasattr(owner, part):
                raise PropagationError(f"get_attr: the module has no attribute {'.'.join(walked)!r} "
                                       f"(target {node.target!r})")
            owner = getattr(owner, part)
        return owner

    def load(self, argument: Any) -> Any:
        def value_of(node: torch.fx.Node) -> Any:
            if node not in self.env:
                if not (self.reuse_annotations and "val" in node.meta):
                    raise PropagationError(f"node %{node.name} is used before it is defined")
                self.env[node] = map_structure(lambda fake: meta_like(fake, fake.device), node.meta["val"])
            return self.env[node]
        return torch.fx.node.map_arg(argument, value_of)

    # --- calls -----------------------------------------------------------------------

    def call(self, node: torch.fx.Node) -> tuple[Any, Provenance]:
        args, kwargs = self.load(node.args), self.load(node.kwargs)
        if node.op == "call_module":
            target = self.submodule(node)
        elif node.op == "call_method":
            target = node.target
            if not isinstance(target, str):
                raise PropagationError(f"call_method target must be a method name, got {target!r}")
        else:
            target = node.target
            if not callable(target):
                raise PropagationError(f"call_function target {target!r} is not callable")
        value, provenance = self.memoized(node, target, args, kwargs)
        self.index_values.observe(node, type(target) if node.op == "call_module" else target, args, kwargs, value)
        return value, provenance

    def memoized(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> tuple[Any, Provenance]:
        key = self.cache_key(node, target, args, kwargs)
        if key is not None:
            entry = self.memo.get(key)
            if entry is not None:
                recipe, provenance, aliases_inputs = entry
                return _rebuild(recipe, _tensors(args, kwargs) if aliases_inputs else ()), provenance
        value, provenance = self.compute(node, target, args, kwargs)
        if self.symbols.active:  # symbolic values are never shared across calls
            self.symbols.claim(node.name)
            self.symbols.check_size(value)
            key = None
        if key is not None:
            inputs = _tensors(args, kwargs)
            recipe = _recipe(value, inputs)
            if recipe is not None:
                self.memo.put(key, (recipe, provenance, _mentions_alias(recipe)))
        return value, provenance

    def submodule(self, node: torch.fx.Node) -> torch.nn.Module:
        try:
            return self.gm.get_submodule(str(node.target))
        except AttributeError as error:
            raise PropagationError(f"call_module: the module has no submodule {node.target!r} ({error})") from None

    def cache_key(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> Hashable | None:
        if self.memo is None or self.symbols.active or not _is_pure(node, target):
            return None
        try:
            target_key = self.state.signature(target) if node.op == "call_module" else target
            return (node.op, target_key, signature(args), signature(kwargs), torch.is_grad_enabled(),
                    torch.get_default_dtype(), self.default_device, self.attention_settings, registry_generation())
        except (Uncacheable, TypeError):
            return None

    def compute(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> tuple[Any, Provenance]:
        if node.op == "call_module":
            module = self.state.shadow(target)
            device = merge_devices([*_tensors(args, kwargs), *self.state.state_tensors(target)])
            placement = None
            # A rule for a module type receives the module (its meta shadow) first.
            call_target, call_args, call_kwargs = module, args, kwargs
            own_rule = python_rule(type(target))
            if own_rule is not None:
                call_args = (module, *args)
        else:
            placement = place(target, args, kwargs)
            if placement.has_host_value:
                return placement.host_value, Provenance("device", placement.rule)
            device = placement.device
            call_target, call_args, call_kwargs = placement.target, placement.args, placement.kwargs
            own_rule = python_rule(call_target)
        record = NodeRecord(device=device)
        self.session.record = record
        with torch.device("meta"), self.mode, symbolic.dispatcher(self.symbols):
            if own_rule is not None:
                record.note(Kind.PYTHON, own_rule.name)
                value = own_rule.fn(*call_args, **call_kwargs)
            elif isinstance(call_target, str):
                value = getattr(call_args[0], call_target)(*call_args[1:], **call_kwargs)
            else:
                value = call_target(*call_args, **call_kwargs)
        produced: list[torch.Tensor] = []
        map_structure(lambda t: produced.append(tag(t, device) if device is not None else t), value)
        if not produced:
            placement = None  # a python value: no device was placed
        return value, _provenance(record, placement, call_target, own_rule)

    # --- metadata --------------------------------------------------------------------

    def stage(self, node: torch.fx.Node, value: Any, provenance: Provenance) -> None:
        found_tensor = False

        def to_fake(tensor: torch.Tensor):
            nonlocal found_tensor
            found_tensor = True
            return self.make_fake(tensor, device_of(tensor))

        fake = map_structure(to_fake, value)
        tensor_meta = map_structure(tensor_metadata, value) if found_tensor else None
        self.staged[node] = (fake, tensor_meta, provenance)

    def staged_output(self, output: Any) -> Any:
        outputs = [node for node in self.gm.graph.nodes if node.op == "output"]
        if not outputs:
            return None
        staged = self.staged.get(outputs[-1])
        return staged[0] if staged is not None else outputs[-1].meta.get("val")

    def commit(self) -> None:
        for node, (fake, tensor_meta, provenance) in self.staged.items():
            node.meta["val"] = fake
            if tensor_meta is not None:
                node.meta["tensor_meta"] = tensor_meta
            else:
                node.meta.pop("tensor_meta", None)
            node.meta["fxprop"] = provenance
        kinds: dict[str, int] = {}
        fallback_bytes = 0
        for node in self.gm.graph.nodes:
            provenance = node.meta.get("fxprop")
            if isinstance(provenance, Provenance):
                kinds[provenance.kind] = kinds.get(provenance.kind, 0) + 1
                fallback_bytes += provenance.fallback_bytes
        summary = self.gm.meta.setdefault("fxprop", {})
        summary.update({"kinds": kinds, "fallback_bytes": fallback_bytes,
                        "cache": self.memo.stats() if self.memo is not None else None})

    def node_error(self, node: torch.fx.Node, error: BaseException) -> PropagationError:
        reason = error.reason if isinstance(error, PropagationError) else f"{type(error).__name__}: {error}"
        inputs = tuple(_describe_inputs(self.load_for_error(node.args), self.load_for_error(node.kwargs)))
        if self.symbols.active:
            reason, inputs = self.symbols.readable(reason), tuple(map(self.symbols.readable, inputs))
        error_type = type(error) if isinstance(error, PropagationError) else PropagationError
        return error_type(f"fxprop: {_op_name(node)} failed: {reason}", node_name=node.name, op=_op_name(node),
                          inputs=inputs, source=source_line(node))

    def load_for_error(self, argument: Any) -> Any:
        return torch.fx.node.map_arg(argument, lambda n: self.env.get(n, f"%{n.name} (not computed)"))


_purity: dict[tuple[str, Any], bool] = {}


def _is_pure(node: torch.fx.Node, target: Any) -> bool:
    """Whether the result depends only on the arguments (no mutation, no side effects)."""
    if node.op == "call_module":
        return True
    key = (node.op, target)
    try:
        return _purity[key]
    except KeyError:
        pure = _purity[key] = _judge_purity(node.op, target)
        return pure
    except TypeError:
        return _judge_purity(node.op, target)


def _judge_purity(op: str, target: Any) -> bool:
    if op == "call_method":
        return not target.endswith("_") and target not in ("item", "tolist", "numpy", "backward", "register_hook")
    if isinstance(target, torch._ops.OpOverload):
        return not target._schema.is_mutable
    if isinstance(target, torch._ops.OpOverloadPacket):
        return not any(getattr(target, o)._schema.is_mutable for o in target.overloads())
    if target in _IMPURE_CALLS:
        return False
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", "") or ""
    if module in ("_operator", "operator") and name in _IN_PLACE_OPERATORS:
        return False
    return module.split(".")[0] in _PURE_MODULES and not name.endswith("_") and "autocast" not in module


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    from .devices.transfers import tensors_in
    return tensors_in(args, kwargs)


def _provenance(record: NodeRecord, placement, call_target: Any, own_rule) -> Provenance:
    if record.kind is Kind.FALLBACK:
        return Provenance("fallback", record.rule, record.fallback_bytes)
    if placement is not None and placement.transfer:
        return Provenance("device", placement.rule)
    if own_rule is not None:
        return Provenance("python", own_rule.name)
    if record.kind is None:
        return Provenance("python", target_name(call_target) if not isinstance(call_target, torch.nn.Module)
                          else type(call_target).__name__)
    return Provenance(record.kind.value, record.rule)


@dataclass(frozen=True)
class _AliasRecord:
    """A result that is an input itself (``view`` None) or a view of one: rebuilt as a view of
    the new call's input, so that autograd and in-place ops see the alias as torch would."""
    index: int
    view: _TensorRecord | None


def _recipe(value: Any, inputs: list[torch.Tensor]) -> Any:
    """An immutable description of a result, or None when it holds something that cannot be shared."""
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            return None
        for index, tensor in enumerate(inputs):
            if value is tensor:
                return _AliasRecord(index, None)
        record = _TensorRecord(tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                               value.requires_grad, device_of(value))
        if not value._is_view():
            return record
        aliased = [index for index, tensor in enumerate(inputs) if _same_base(value, tensor)]
        if not aliased:
            return record  # a view of an intermediate the graph never sees: a fresh tensor is as good
        index = aliased[0]
        if inputs[index].dtype != value.dtype or inputs[index].requires_grad != value.requires_grad:
            return None
        return _AliasRecord(index, record)
    if isinstance(value, (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.Size,
                          torch.memory_format, torch.layout)):
        return value
    if isinstance(value, (tuple, list)):
        parts = [_recipe(item, inputs) for item in value]
        if any(part is None and item is not None for part, item in zip(parts, value)):
            return None
        return (_Sequence, type(value), tuple(parts))
    return None


def _mentions_alias(recipe: Any) -> bool:
    if isinstance(recipe, _AliasRecord):
        return True
    return isinstance(recipe, tuple) and len(recipe) == 3 and recipe[0] is _Sequence and any(
        _mentions_alias(part) for part in recipe[2])


def _same_base(view: torch.Tensor, tensor: torch.Tensor) -> bool:
    base = view._base
    return tensor is base or (tensor._is_view() and tensor._base is base)


class _Sequence:
    pass


def _rebuild(recipe: Any, inputs: list[torch.Tensor]) -> Any:
    if isinstance(recipe, _TensorRecord):
        return tag(_fresh_meta(recipe), recipe.device)
    if isinstance(recipe, _AliasRecord):
        source = inputs[recipe.index]
        if recipe.view is None:
            return source
        view = recipe.view
        return tag(source.as_strided(view.shape, view.stride, view.offset), view.device)
    if isinstance(recipe, tuple) and len(recipe) == 3 and recipe[0] is _Sequence:
        _, kind, parts = recipe
        items = [_rebuild(part, inputs) for part in parts]
        if kind is list:
            return items
        if kind is tuple:
            return tuple(items)
        if hasattr(kind, "_fields"):
            return kind(*items)
        return kind(items)
    return recipe


def _fresh_meta(record: _TensorRecord) -> torch.Tensor:
    if record.offset:
        extent = record.offset + 1 + sum((s - 1) * st for s, st in zip(record.shape, record.stride) if s)
        meta = torch.empty(extent, dtype=record.dtype, device="meta").as_strided(record.shape, record.stride, record.offset)
    else:
        meta = torch.empty_strided(record.shape, record.stride, dtype=record.dtype, device="meta")
    if record.requires_grad:
        # A result of an op is not a leaf: in-place ops on it must stay legal, as they are in torch.
        meta = torch._C._functions.DelayedError("fxprop: no gradients through propagation results", 1)(
            meta.requires_grad_(True))
    return meta


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
