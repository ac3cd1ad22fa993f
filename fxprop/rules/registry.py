"""The rule registry and the one lookup order that the engine and the coverage report share.

For an aten overload the order is:

    python rule (hand-written, registered with `@rule`)
      -> meta kernel (torch's own, run on meta tensors)
      -> decomposition (torch._decomp, each decomposed op resolved again by this order)
      -> real-tensor fallback (materialize on the host, run, keep the metadata)

Device-changing ops are looked up first in `fxprop.devices.TRANSFERS`; a node handled by
that table reports the kind "device".
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._ops import OpOverload, OpOverloadPacket

from ..errors import RuleRegistrationError


class Kind(str, enum.Enum):
    """Which mechanism produced a value. Ordered from cheapest to most expensive."""
    PYTHON = "python"
    META = "meta"
    DECOMPOSITION = "decomposition"
    DEVICE = "device"
    FALLBACK = "fallback"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Rule:
    """How one target is handled. ``fn`` is None for kinds that run torch's own code."""
    kind: Kind
    name: str
    fn: Callable[..., Any] | None = None


_python_rules: dict[Any, Rule] = {}
_resolved: dict[Any, Rule] = {}
_lock = threading.Lock()
_generation = 0


def generation() -> int:
    """Changes whenever a rule is registered or removed, so memoized results can be told apart."""
    return _generation


def _changed() -> None:
    global _generation
    _resolved.clear()
    _generation += 1


def target_name(target: Any) -> str:
    """A short readable name: "aten.addmm.default", "torch.nn.functional.gelu", "Tensor.view"."""
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target) if str(target).startswith(("aten.", "prims.")) else f"{target}"
    if isinstance(target, str):
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    if module in ("_operator", "operator"):
        module = "operator"
    if module in ("builtins", ""):
        return qualname
    if module.startswith("torch._C") and qualname.startswith("TensorBase."):
        return f"Tensor.{qualname.split('.', 1)[1]}"
    if module == "torch._C._VariableFunctions" or module == "torch._C._nn":
        return f"torch.{qualname}"
    return f"{module}.{qualname}"


def rule(*targets: Any, name: str | None = None) -> Callable[[Callable], Callable]:
    """Register a hand-written python rule for one or more targets.

    A rule receives the op's arguments as meta tensors and python values, exactly as the op
    would, and returns what the op would return, as meta tensors::

        @fxprop.rule(torch.ops.mylib.scale.default)
        def scale(x, factor):
            return torch.empty_like(x)

    An `OpOverloadPacket` registers every overload. A rule for an `nn.Module` type covers
    call_module nodes of exactly that type and receives the module (its meta shadow) first.
    Registering a target that already has a rule is an error naming the target.
    """
    def register(fn: Callable) -> Callable:
        expanded = []
        for target in targets:
            if isinstance(target, OpOverloadPacket):
                expanded.extend(getattr(target, overload) for overload in target.overloads())
            elif isinstance(target, (OpOverload, str)) or callable(target):
                expanded.append(target)
            else:
                raise RuleRegistrationError(f"cannot register a rule for {target!r}: not an op, a callable or a method name")
        with _lock:
            for target in expanded:
                if target in _python_rules:
                    raise RuleRegistrationError(
                        f"a rule for {target_name(target)} is already registered "
                        f"({_python_rules[target].name}); unregister it first")
            for target in expanded:
                _python_rules[target] = Rule(Kind.PYTHON, name or f"{fn.__module__}.{fn.__qualname__}", fn)
            _changed()
        return fn
    return register


def unregister(target: Any) -> None:
    """Remove the python rule for a target (every overload, for a packet)."""
    targets = ([getattr(target, o) for o in target.overloads()] if isinstance(target, OpOverloadPacket) else [target])
    with _lock:
        for each in targets:
            _python_rules.pop(each, None)
        _changed()


def has_meta_kernel(op: OpOverload) -> bool:
    """Whether torch can run this overload on meta tensors without data."""
    tags = op.tags
    if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags:
        return False
    name = op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (has(name, "Meta") or has(name, "CompositeImplicitAutograd")
            or has(name, "CompositeExplicitAutograd") or has(name, "CompositeExplicitAutogradNonFunctional"))


def decomposition_for(op: OpOverload) -> Callable | None:
    from torch._decomp import decomposition_table
    return decomposition_table.get(op)


def shape_rule(op: OpOverload) -> Rule:
    """The rule that computes an aten overload's result on meta tensors (devices aside)."""
    cached = _resolved.get(op)
    if cached is not None:
        return cached
    resolved = _python_rules.get(op)
    if resolved is None:
        name = target_name(op)
        if has_meta_kernel(op):
            resolved = Rule(Kind.META, name)
        elif (decomposition := decomposition_for(op)) is not None:
            resolved = Rule(Kind.DECOMPOSITION, name, decomposition)
        else:
            resolved = Rule(Kind.FALLBACK, name)
    _resolved[op] = resolved
    return resolved


def python_rule(target: Any) -> Rule | None:
    try:
        return _python_rules.get(target)
    except TypeError:
        return None


def lookup(target: Any) -> Rule:
    """Which kind of rule handles ``target``, in the order the engine applies them.

    ``target`` is what an FX node holds: an aten/prims overload or packet, a torch callable,
    a Tensor method name (str), or an `nn.Module` type for call_module nodes.

    Torch-level callables with no rule of their own run on meta tensors, every aten op they
    reach being resolved by this same order; they report the kind "meta" here, and the
    engine's provenance records what each node really needed.
    """
    from ..devices import TRANSFERS

    if isinstance(target, OpOverloadPacket):
        overloads = target.overloads()
        target = getattr(target, "default" if "default" in overloads else overloads[0])
    own = python_rule(target)
    if own is not None:
        return own
    try:
        transfer = TRANSFERS.get(target)
    except TypeError:
        transfer = None
    if transfer is not None:
        return Rule(Kind.DEVICE, transfer[0], transfer[1])
    if isinstance(target, OpOverload):
        return shape_rule(target)
    if _is_plain_python(target):
        return Rule(Kind.PYTHON, target_name(target))
    return Rule(Kind.META, target_name(target))


def _is_plain_python(target: Any) -> bool:
    return getattr(target, "__module__", None) in ("_operator", "operator", "builtins", "math")


def registered_rules() -> dict[Any, Rule]:
    """A snapshot of every hand-written rule, keyed by target."""
    with _lock:
        return dict(_python_rules)
