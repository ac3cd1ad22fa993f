"""FLOPs of one node, by the formulas of `torch.utils.flop_counter`, without running anything.

An aten node whose op has a formula is counted straight from its annotated inputs, and so is a
call of a recurrent module (`recurrent_flops`). Any other node that may reach such an op (a
torch-level call, a module, a composite aten op) is re-dispatched on meta tensors
built from its inputs' annotations, under `CountingMode`, which applies the formulas to every
aten op the call reaches, as `FlopCounterMode` does when the graph really runs. Module calls
run on a copy whose parameters and buffers are meta tensors (`fxprop.engine.module_state.StateView`, as the
engine shadows modules).

The formulas are torch's `flop_registry` plus the CPU kernels it misses (`EXTRA_FORMULAS`):
on a CPU, attention and LSTMs run fused kernels that `FlopCounterMode` would count as zero;
they are counted like the kernels torch does register for the same work.
"""
from __future__ import annotations

import contextlib
import operator
from typing import Any, Hashable

import torch
import torch.fx
from torch import nn

from ..torch_compat import (HigherOrderOperator, OpOverload, TorchDispatchMode, dispatch_without_importing_dynamo,
                            enable_python_dispatcher, functorch_unwrapped, is_composite_implicit, packet_of, pytree)
from ..memo.signatures import Uncacheable, symbolic_signature
from ..engine.module_state import StateView
from ..distributed.dtensors import META_KEY
from ..aten.flop_formulas import EXTRA_FORMULAS, FORMULAS  # noqa: F401  (re-exported)

aten = torch.ops.aten


def recurrent_flops(module: nn.RNNBase, input_shape: Any) -> Any:
    """An ``nn.RNN``/``nn.GRU``/``nn.LSTM`` call: what its composite path counts as addmm/mm, and
    its fused CPU kernel by `EXTRA_FORMULAS` (a formula, so that symbolic steps need no loop).

    >>> recurrent_flops(nn.LSTM(8, 16, num_layers=2, batch_first=True), (3, 5, 8))
    107520
    """
    steps_times_batch = 1
    for size in input_shape[:-1]:
        steps_times_batch = steps_times_batch * size
    directions = 2 if module.bidirectional else 1
    gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1) * module.hidden_size
    projected = getattr(module, "proj_size", 0) or 0
    hidden = projected or module.hidden_size
    total: Any = 0
    for layer in range(module.num_layers):
        width = module.input_size if layer == 0 else hidden * directions
        per_direction = 2 * steps_times_batch * gates * (width + hidden)
        if projected:
            per_direction = per_direction + 2 * steps_times_batch * module.hidden_size * projected
        total = total + directions * per_direction
    return total


_SHAPE_QUERIES = frozenset({
    aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
    aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
    aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
    torch.ops.prim.layout.default})


class CountingMode(TorchDispatchMode):
    """Adds up `FORMULAS` over the aten ops dispatched inside it, decomposing as FlopCounterMode does.

    >>> with CountingMode() as counting:
    ...     _ = torch.empty(8, 16, device="meta") @ torch.empty(16, 4, device="meta")
    >>> counting.flops
    1024
    """

    def __init__(self) -> None:
        super().__init__()
        self.flops: Any = 0
        dispatch_without_importing_dynamo(type(self))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SHAPE_QUERIES:
            return NotImplemented
        if isinstance(func, HigherOrderOperator):
            return NotImplemented
        if func is not torch.ops.prim.device.default:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        formula = FORMULAS.get(packet_of(func))
        if formula is not None:
            self.flops = self.flops + formula(*args, **kwargs, out_val=out)
        return out


_FREE_FUNCTIONS = frozenset({operator.getitem, getattr, len, isinstance, torch.Tensor.size, torch.Tensor.dim})
_FREE_METHODS = frozenset({"size", "dim", "numel", "stride", "view", "reshape", "transpose", "permute", "contiguous",
                           "unsqueeze", "squeeze", "flatten", "expand", "expand_as", "t", "split", "chunk",
                           "unbind", "narrow", "select", "to", "float", "half", "bfloat16", "type_as", "detach",
                           "clone", "view_as", "item", "tolist", "storage_offset", "is_contiguous"})
"""Tensor methods that reach no op with a formula: counted as 0 without a re-dispatch."""


def _has_formula(op: OpOverload) -> bool:
    return packet_of(op) in FORMULAS


def _may_reach_formulas(op: OpOverload) -> bool:
    """Whether dispatching ``op`` can reach other ops: only a composite (implicit) kernel decomposes
    before or inside a dispatch mode; any other kernel is counted as the op itself."""
    return is_composite_implicit(op)


_RUN_ONCE = frozenset({"wrap_with_set_grad_enabled", "wrap_with_autocast", "wrap", "tag_activation_checkpoint",
                       "wrap_activation_checkpoint", "invoke_subgraph", "autograd_function_apply", "hints_wrapper"})


_RUN_PER_SLICE = {"map_impl": 1, "scan": 2}
"""Higher-order ops that run their body once per slice along dim 0 of the inputs at this argument."""

_WRAPPERS = {"with_effects": 1, "auto_functionalized": 0, "auto_functionalized_v2": 0}
"""Higher-order ops that call the op at this argument once (ordered by a token, or on clones)."""

_NO_MATH = frozenset({"print"})


def _name(op: Any) -> str:
    return getattr(op, "__name__", str(op))


_UNKNOWN_RUNS = {
    "cond": "cond: its branches count differently, and which one runs depends on the values",
    "associative_scan": "associative_scan: how its implementation groups the combine calls is not in the graph",
}


def _slice_count(scanned: Any) -> Any:
    """The length of dim 0 shared by the scanned inputs, or None where there is none to read."""
    values = [_annotation(item) for item in scanned] if isinstance(scanned, (list, tuple)) else []
    if not values or not all(isinstance(value, torch.Tensor) and value.dim() for value in values):
        return None
    return values[0].shape[0]


class FlopCounter:
    """Counts the FLOPs of the nodes of one annotated graph (`count`), memoizing re-dispatches."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.shadows = StateView(param_device=None)
        self.memo: dict[Hashable, Any] = {}
        self.failures: dict[str, str] = {}

    def count(self, node: torch.fx.Node) -> Any:
        """The FLOPs of ``node`` (an int, or a SymInt for symbolic sizes); 0 for nodes that do no math."""
        if node.op not in ("call_function", "call_method", "call_module"):
            return 0
        sharding = node.meta.get(META_KEY)
        if sharding is not None:  # a DTensor graph's node: its local ops were counted as they ran
            return sharding.flops
        if isinstance(node.target, HigherOrderOperator):
            return self.higher_order(node)
        args = torch.fx.node.map_arg(node.args, _annotation)
        kwargs = torch.fx.node.map_arg(node.kwargs, _annotation)
        direct = self.direct(node, args, kwargs)
        if direct is not None:
            return direct
        try:
            key = (node.op, self.shadows.signature(self.gm.get_submodule(node.target)) if node.op == "call_module"
                   else node.target, symbolic_signature(args), symbolic_signature(kwargs))
            hash(key)
        except (Uncacheable, TypeError):
            key = None
        if key is not None and key in self.memo:
            return self.memo[key]
        try:
            flops = self.redispatch(node, args, kwargs)
        except Exception as error:
            flops = self.probe(node, args, kwargs, error)
            if flops is None:  # the node's own math is unknown: counted as 0, and the estimate names it
                first_line = str(error).splitlines()[0] if str(error) else ""
                self.failures[node.name] = f"{type(error).__name__}: {first_line}"
                return 0
        if key is not None:
            self.memo[key] = flops
        return flops

    def higher_order(self, node: torch.fx.Node) -> Any:
        """A higher-order op runs its bodies, whose nodes fxprop annotated: the FLOPs of a body run
        once (grad-mode and autocast regions, wrap, checkpoint, an autograd Function's forward), of
        cond's branch where both branches count alike, and of map's and scan's body once per slice.
        Others (while_loop's iterations, cond's branch choice) depend on values: unknown and named.
        ``with_effects`` and ``auto_functionalized`` run the op they wrap once: its count."""
        op, arguments, wrapped = node.target, [*node.args, *node.kwargs.values()], False
        if _name(op) in _WRAPPERS:
            position = _WRAPPERS[_name(op)]
            op, arguments, wrapped = node.args[position], [*node.args[position + 1:], *node.kwargs.values()], True
            if isinstance(op, OpOverload):
                return self.wrapped_op(node, op)
        name = _name(op)
        if name in _NO_MATH:
            return 0
        bodies = [self._attribute(str(arg.target)) for arg in arguments
                  if isinstance(arg, torch.fx.Node) and arg.op == "get_attr"]
        bodies = [body for body in bodies if isinstance(body, torch.fx.GraphModule)]
        counts = [sum((FlopCounter(body).count(inner) for inner in body.graph.nodes), 0) for body in bodies]
        if name in _RUN_ONCE and counts:
            return counts[0]
        if name == "cond" and len(counts) == 2 and counts[0] == counts[1]:
            return counts[0]
        if name in _RUN_PER_SLICE and len(counts) == 1 and not wrapped:
            length = _slice_count(node.args[_RUN_PER_SLICE[name]])
            if length is not None:
                return counts[0] * length
        self.failures[node.name] = _UNKNOWN_RUNS.get(name, f"{name}: how often its bodies run depends on the values")
        return 0

    def wrapped_op(self, node: torch.fx.Node, op: OpOverload) -> Any:
        """The count of the op that ``with_effects`` or ``auto_functionalized`` calls: its formula
        on the arguments it is given; 0 for an op with none (a custom op, ``_print``)."""
        if not _has_formula(op):
            return 0
        if node.target is torch.ops.higher_order.with_effects:
            args, kwargs = node.args[2:], node.kwargs
        elif node.target is torch.ops.higher_order.auto_functionalized:
            args, kwargs = (), node.kwargs
        else:  # auto_functionalized_v2 passes views of its bases by index: the op's arguments are not in the node
            self.failures[node.name] = f"auto_functionalized_v2 of {op}: its arguments are regenerated from bases"
            return 0
        args = torch.fx.node.map_arg(args, _annotation)
        kwargs = torch.fx.node.map_arg(kwargs, _annotation)
        value = node.meta.get("val")
        out = value[1:] if node.target is torch.ops.higher_order.with_effects and isinstance(value, tuple) else value
        return FORMULAS[packet_of(op)](*args, **kwargs, out_val=out)

    def _attribute(self, target: str) -> Any:
        owner: Any = self.gm
        for part in target.split("."):
            owner = getattr(owner, part)
        return owner

    def direct(self, node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
        """The count without a re-dispatch, where the target tells it; None where it does not."""
        target = node.target
        if isinstance(target, OpOverload):
            if _has_formula(target):
                return FORMULAS[packet_of(target)](*args, **kwargs, out_val=node.meta.get("val"))
            return None if _may_reach_formulas(target) else 0
        if node.op == "call_method" and target in _FREE_METHODS or node.op == "call_function" and _is_free(target):
            return 0
        if node.op == "call_module":
            module = self.gm.get_submodule(str(target))
            if isinstance(module, nn.RNNBase) and args and isinstance(args[0], torch.Tensor):
                return recurrent_flops(module, args[0].shape)
            return None
        return None if _holds_tensor((args, kwargs)) else 0

    def redispatch(self, node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
        args, kwargs = _to_meta((args, kwargs))
        if node.op == "call_module":
            call = self.shadows.shadow(self.gm.get_submodule(node.target))
        elif node.op == "call_method":
            call, args = getattr(args[0], node.target), args[1:]
        else:
            call = node.target
        symbolic = _is_symbolic((args, kwargs))
        with torch.no_grad(), torch.device("meta"), _python_dispatcher(symbolic), CountingMode() as counting:
            call(*args, **kwargs)
        return counting.flops

    def probe(self, node: torch.fx.Node, args: tuple, kwargs: dict, error: Exception) -> Any:
        """0 for a call that failed on symbolic sizes but counts 0 at two sets of concrete ones
        (a data movement such as ``repeat_interleave``); None otherwise."""
        if not _is_symbolic((args, kwargs)):
            return None
        for probe in _PROBE_SIZES:
            try:
                if self.redispatch(node, *_concrete((args, kwargs), probe)) != 0:
                    return None
            except Exception:
                return None
        return 0


_PROBE_SIZES = (5, 7)


def _concrete(value: Any, probe: int) -> Any:
    """``value`` with every symbolic size evaluated with all its symbols set to ``probe``."""
    if isinstance(value, torch.Tensor) and _is_symbolic(value):
        return torch.empty(tuple(_concrete(size, probe) for size in value.shape), dtype=value.dtype, device="meta")
    if isinstance(value, torch.SymInt):
        from .sizes import number
        expr = number(value)
        return int(expr.xreplace({symbol: probe for symbol in expr.free_symbols})) if hasattr(expr, "xreplace") \
            else int(expr)
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        items = [_concrete(item, probe) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, torch.Size):
        return tuple(_concrete(item, probe) for item in value)
    if isinstance(value, dict):
        return {key: _concrete(item, probe) for key, item in value.items()}
    return value


def _is_free(target: Any) -> bool:
    try:
        return target in _FREE_FUNCTIONS
    except TypeError:
        return False


def _annotation(node: torch.fx.Node) -> Any:
    """The node's value; inside a vmap level, the batched tensor's physical one, which the kernel
    that vmap's batching rule calls computes on."""
    return pytree.tree_map_only(torch.Tensor, functorch_unwrapped, node.meta.get("val"))


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_tensor(item) for item in value.values())
    return False


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(isinstance(size, torch.SymInt) for size in value.shape)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (tuple, list)):
        return any(_is_symbolic(item) for item in value)
    if isinstance(value, dict):
        return any(_is_symbolic(item) for item in value.values())
    return False


def _to_meta(value: Any) -> Any:
    """Annotations as plain meta tensors (devices as "meta"), each tensor a fresh one of its own."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        items = [_to_meta(item) for item in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {key: _to_meta(item) for key, item in value.items()}
    return value


def _python_dispatcher(symbolic: bool):
    if not symbolic:
        return contextlib.nullcontext()
    return enable_python_dispatcher()
