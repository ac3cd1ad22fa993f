"""Which rule handles a call: the one place where the kinds are ordered.

For an aten or custom op the order is::

    a hand-written python rule (`fxprop.rule`)
      -> torch's meta kernel (or the fake a custom op registered)
      -> torch's composite implementation (CompositeImplicitAutograd, which decomposes before
         fxprop's dispatch sees the op, or a CompositeExplicitAutograd kernel), each op it
         reaches resolved again
      -> a decomposition from torch._decomp, each op it reaches resolved again
      -> the real-tensor fallback on the host (any op with a CPU kernel)
      -> unsupported

with four turns that depend on the call's values: a device rule that answers on its own
(``x.device``, ``x.is_cuda``) gives the kind "device"; inputs with symbolic sizes refuse the
fallback (there is no data to run on); an op whose output *shape* depends on the data (tagged
``dynamic_output_shape``) never falls back on synthesized data; and a call of only empty CPU
tensors that the meta kernel refuses is asked of the CPU kernel (there are no values to make
up). A custom op whose Meta kernel only refuses ("no fake impl registered") has no meta kernel.

Torch-level callables, Tensor methods and modules with no rule of their own are composites:
torch's own code runs on meta tensors, and each aten op it reaches is resolved by this same
order; the call's kind is the costliest of theirs. Plain python (``operator.add`` of two sizes)
needs no rule: "plain".

The engine, fxprop's dispatch mode and the coverage report all call `resolve`.
"""
from __future__ import annotations

import dataclasses
import math

import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..engine import session as context
from ..memo.purity import owned_by_torch
from . import registry
from .. import symbolic
from ..devices import TRANSFERS, Placement, place
from ..call import Call
from ..engine.known_values import has_no_values
from ..kinds import Kind, Rule, is_python_operator
from .registry import target_name
from ..torch_compat import (HigherOrderOperator, OpOverload, OpOverloadPacket, custom_op_without_fake,
                            decomposition_table, has_kernel, is_composite_implicit, meta_kernel_takes_no_outs,
                            overload_for_call, pytree, register_collective_meta_kernels, registered_fake, schema_of)

_COMPOSITE_KINDS = frozenset({Kind.PLAIN, Kind.META, Kind.PYTHON, Kind.DECOMPOSITION, Kind.FALLBACK,
                              Kind.UNSUPPORTED})
_ANY_KERNEL = ("Meta", "CPU", "CUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
               "CompositeExplicitAutogradNonFunctional", "Autograd")


@dataclass(frozen=True)
class Resolution:
    """A call resolved: its rule, and where its result lives (``placement``, for calls at a node)."""
    rule: Rule
    placement: Placement | None = None


_static: dict[Any, Rule] = {}
_static_lock = threading.Lock()
registry.on_change(_static.clear)


def resolve(target: Any, args: tuple | None = None, kwargs: dict | None = None, *,
            in_progress: tuple = ()) -> Rule:
    """The rule that handles ``target`` called with ``args``/``kwargs`` (or, without them, every
    kind it may resolve to in `Rule.kinds`). ``in_progress`` holds the ops whose python rules are
    running: an op called from its own rule resolves past that rule.

    Devices are decided per node (`resolve_call`), so nothing here consults the inputs' devices.
    """
    if args is None:
        return _static_in(target, in_progress)
    return resolve_op(Call(target, args, kwargs or {}), in_progress=in_progress)


def resolve_op(call: Call, *, in_progress: tuple = ()) -> Rule:
    """`resolve` of one call: how fxprop's dispatch resolves each aten op a node reaches."""
    return _for_values(_static_in(call.target, in_progress), call, context.node_device())


def _static_in(target: Any, in_progress: tuple) -> Rule:
    rule = static_rule(target)
    if rule.kind is Kind.PYTHON and target in in_progress:
        rule = _after_python_rule(target)
    return rule


def resolve_call(call: Call) -> Resolution:
    """`resolve` for a node's own call, with the placement of its result: a device rule may answer on its own."""
    target = call.target
    if isinstance(target, OpOverloadPacket):
        overload = overload_for_call(target, call.args, call.kwargs)
        if overload is not None:
            return resolve_call(call.of(overload))
    rule = static_rule(target)
    placement = None
    if not isinstance(target, torch.nn.Module):
        placement = place(call)
        if placement.has_host_value:
            return Resolution(Rule(Kind.DEVICE, placement.rule, device_rule=placement.rule), placement)
    resolved = _for_values(rule, call, placement.device if placement is not None else None)
    placed_by = placement.rule if placement is not None and placement.transfer else None
    if isinstance(target, OpOverload) and not schema_of(target).returns:
        placed_by = None  # an op that returns nothing places nothing (_assert_tensor_metadata)
    if resolved.device_rule != placed_by:
        resolved = dataclasses.replace(resolved, device_rule=placed_by)
    return Resolution(resolved, placement)


def static_rule(target: Any) -> Rule:
    """What handles ``target`` before its values are known (memoized per target)."""
    key = type(target) if isinstance(target, torch.nn.Module) else target
    if not owned_by_torch(key):  # a user's function or bound method: kept by no table
        return _static_rule(target)
    found = _static.get(key)
    if found is None:
        found = _static_rule(target)
        with _static_lock:
            _static[key] = found
    return found


def _static_rule(target: Any) -> Rule:
    if isinstance(target, OpOverloadPacket):
        overloads = target.overloads()
        return static_rule(getattr(target, "default" if "default" in overloads else overloads[0]))
    device_rule = _device_rule_name(target)
    own = registry.python_rule(type(target) if isinstance(target, torch.nn.Module) else target)
    if own is not None:
        return Rule(Kind.PYTHON, own.name, own.fn, device_rule=device_rule)
    if isinstance(target, HigherOrderOperator):
        return Rule(Kind.UNSUPPORTED, f"higher-order op {target.name()}: no rule")
    if isinstance(target, OpOverload):
        return _op_rule(target, device_rule)
    return _composite(target, device_rule)


def _after_python_rule(op: Any) -> Rule:
    """How an op runs when called from its own python rule: the rest of the order."""
    if isinstance(op, OpOverload):
        return _op_rule(op, _device_rule_name(op))
    return _composite(op, _device_rule_name(op))


def _device_rule_name(target: Any) -> str | None:
    try:
        entry = TRANSFERS.get(target)
    except TypeError:
        return None
    return entry[0] if entry is not None else None


def _composite(target: Any, device_rule: str | None) -> Rule:
    if isinstance(target, torch.nn.Module):
        name = type(target).__name__
    else:
        name = target_name(target)
    if is_python_operator(target):
        return Rule(Kind.PLAIN, name, kinds=_COMPOSITE_KINDS, device_rule=device_rule, composite=True)
    return Rule(Kind.META, name, kinds=_COMPOSITE_KINDS, device_rule=device_rule, composite=True)


def _op_rule(op: OpOverload, device_rule: str | None) -> Rule:
    name = op.name()
    has = has_kernel
    if op.namespace in _COMMUNICATING_NAMESPACES:
        register_collective_meta_kernels()  # at the first collective: the import costs every other program
    label = target_name(op)
    if not any(has(name, key) for key in _ANY_KERNEL):  # a TorchScript builtin: it calls other ops
        return _composite(op, device_rule)
    if custom_op_without_fake(op):
        return _fallback_or_unsupported(op, label, device_rule, why="a custom op with no fake implementation")
    if op.namespace in _COMMUNICATING_NAMESPACES and not (has(name, "Meta") or has(name, "CompositeImplicitAutograd")):
        return Rule(Kind.UNSUPPORTED, f"{label}: a collective with no meta kernel (its other kernels communicate, "
                    "and are never run here)", device_rule=device_rule)
    if has(name, "Meta") and not (meta_kernel_takes_no_outs(op) and has(name, "CompositeExplicitAutograd")):
        label = f"{label} (registered fake)" if op.namespace not in ("aten", "prims") and registered_fake(op) else label
        return Rule(Kind.META, label, kinds=_meta_or_on_the_host_when_empty(op), device_rule=device_rule)
    if is_composite_implicit(op):
        return Rule(Kind.META, f"{label} (composite)", kinds=_COMPOSITE_KINDS, device_rule=device_rule, composite=True)
    if torch.Tag.dynamic_output_shape in op.tags:
        # Its output's shape depends on the data: only real values may answer (`_for_values`).
        return Rule(Kind.UNSUPPORTED, f"{label}: its output shape depends on the data, and no rule makes it symbolic",
                    kinds=frozenset({Kind.UNSUPPORTED, Kind.FALLBACK}), device_rule=device_rule)
    for key in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"):
        if has(name, key):
            return Rule(Kind.META, f"{label} ({key} kernel)", key, kinds=_COMPOSITE_KINDS, device_rule=device_rule,
                        composite=True)
    decomposition = decomposition_table.get(op)
    if decomposition is not None:
        return Rule(Kind.DECOMPOSITION, label, decomposition, device_rule=device_rule)
    return _fallback_or_unsupported(op, label, device_rule, why="no meta kernel and no decomposition")


_COMMUNICATING_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
                                       "_dtensor"})
"""Collectives talk to the other ranks of a process group: never run for real while propagating
(one rank alone would wait for the others, or send them data)."""


def _fallback_or_unsupported(op: OpOverload, label: str, device_rule: str | None, why: str) -> Rule:
    if has_kernel(op.name(), "CPU") or has_kernel(op.name(), "CompositeExplicitAutograd"):
        return Rule(Kind.FALLBACK, label, kinds=frozenset({Kind.FALLBACK, Kind.UNSUPPORTED}), device_rule=device_rule)
    return Rule(Kind.UNSUPPORTED, f"{label}: {why}, and no CPU kernel to fall back to", device_rule=device_rule)


def _meta_or_on_the_host_when_empty(op: OpOverload) -> frozenset:
    """The meta kernel, and the fallback where the meta kernel refuses a call whose tensors are all empty,
    on the CPU: with no values to stand in for, the host's kernel gives the real answer, and CPU
    kernels return before checks that meta kernels make (``bmm`` of an empty float and an empty
    bool batch computes an empty bool result; the meta kernel refuses the dtypes). Views and
    writes keep their kernel, as they must alias their inputs, and random ops never reach the host."""
    schema = schema_of(op)
    if (op.namespace == "aten" and schema.returns and not schema.is_mutable
            and not any(ret.alias_info for ret in schema.returns)
            and torch.Tag.nondeterministic_seeded not in op.tags and has_kernel(op.name(), "CPU")):
        return frozenset({Kind.META, Kind.FALLBACK})
    return frozenset({Kind.META})


_EMPTY_CALL_SIZE_LIMIT = 1 << 16
"""Elements: the sizes of a call of empty tensors (their non-zero dims, and sizes given as
numbers) whose product passes this keep the meta kernel's answer, as the host's output might be
as large (``mm`` of (n, 0) by (0, m) is n x m zeros)."""


def _only_empty_tensors(call: Call) -> bool:
    tensors = call.tensors
    if not tensors or call.has_symbolic or any(t.numel() for t in tensors):
        return False
    sizes = [v for v in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(v, int) and not isinstance(v, bool)]
    sizes += [size for t in tensors for size in t.shape]
    return math.prod(size for size in sizes if size > 0) <= _EMPTY_CALL_SIZE_LIMIT


def _meta_kernel_refuses(call: Call) -> bool:
    try:
        with context.on_host():
            call.target(*call.args, **call.kwargs)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return True
    except Exception:  # not a refusal of the call: the meta kernel's own limits
        return False
    return False


def _for_values(rule: Rule, call: Call, device: torch.device | None) -> Rule:
    """The turns of the order that depend on the call's values (``device``: the call's own)."""
    if (rule.kind is Kind.META and Kind.FALLBACK in rule.kinds and not rule.composite
            and device is not None and device.type == "cpu"
            and _only_empty_tensors(call) and _meta_kernel_refuses(call)):
        return rule.with_kind(Kind.FALLBACK)
    if rule.kind is Kind.FALLBACK and call.has_symbolic:
        return rule.with_kind(Kind.UNSUPPORTED, symbolic.no_symbolic_rule(call.target, call.args, call.kwargs))
    if rule.kind is Kind.UNSUPPORTED and Kind.FALLBACK in rule.kinds and _all_values_known(call):
        return rule.with_kind(Kind.FALLBACK, target_name(call.target))
    if rule.composite and rule.kind is Kind.PLAIN and call.tensors:
        return Rule(Kind.META, rule.name, kinds=rule.kinds, device_rule=rule.device_rule, composite=True)
    return rule


def reaches_dispatch(op: Any) -> bool:
    """Whether fxprop's dispatch mode sees ``op`` itself: every op but a CompositeImplicitAutograd one,
    which decomposes above the dispatch (its parts arrive instead), and a TorchScript builtin."""
    return (isinstance(op, OpOverload) and not is_composite_implicit(op)
            and any(has_kernel(op.name(), key) for key in _ANY_KERNEL))


def _all_values_known(call: Call) -> bool:
    session = context.current_session()
    tensors = call.tensors
    return session is not None and bool(tensors) and all(t in session.real_values or has_no_values(t) for t in tensors)
