"""The registry of hand-written python rules, keyed by target.

Registration reads like the op's signature::

    @fxprop.rule(torch.ops.mylib.scale.default)
    def scale(x, factor):
        return torch.empty_like(x)

Which rule handles a call is decided by `fxprop.resolve.order`, which reads this table first.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from ..errors import RuleRegistrationError
from ..kinds import Kind, Rule
from ..torch_compat import OpOverload, OpOverloadPacket

_python_rules: dict[Any, Rule] = {}
_lock = threading.Lock()
_generation = 0
_listeners: list[Callable[[], None]] = []


def generation() -> int:
    """Changes whenever a rule is registered or removed, so memoized results can be told apart."""
    return _generation


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever the table changes (resolution tables drop what they derived from it)."""
    _listeners.append(listener)


def _changed() -> None:
    global _generation
    _generation += 1
    for listener in _listeners:
        listener()


def target_name(target: Any) -> str:
    """A short readable name: "aten.addmm.default", "torch.nn.functional.gelu", "Tensor.view"."""
    try:
        return _target_name(target)
    except Exception:  # a user's metaclass whose __module__ or __qualname__ raises
        return f"<a {type(target).__name__}>"


def _target_name(target: Any) -> str:
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    if isinstance(target, str):
        return f"Tensor.{target}"
    if isinstance(target, type):
        return f"{target.__module__}.{target.__qualname__}"
    module = getattr(target, "__module__", None) or ""
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    if module in ("_operator", "operator"):
        module = "operator"
    if module in ("builtins", ""):
        return qualname
    if module.startswith("torch._C") and qualname.startswith("TensorBase."):
        return f"Tensor.{qualname.split('.', 1)[1]}"
    if module in ("torch._C._VariableFunctions", "torch._C._nn"):
        return f"torch.{qualname}"
    return f"{module}.{qualname}"


def rule(*targets: Any, name: str | None = None) -> Callable[[Callable], Callable]:
    """Register a hand-written python rule for one or more targets.

    A rule receives the op's arguments as meta tensors and python values, exactly as the op
    would, and returns what the op would return, as meta tensors::

        @fxprop.rule(torch.ops.mylib.scale.default)
        def scale(x, factor):
            return torch.empty_like(x)

    Targets: an aten or custom `OpOverload` (an `OpOverloadPacket` registers every overload),
    a higher-order operator, a torch callable, a Tensor method name, or an `nn.Module` type (for
    call_module nodes of exactly that type; the rule receives the module's meta shadow first).
    A rule refuses a call the way torch does, with ``torch._check(...)``, or by raising an
    `fxprop.FxpropError`; any other exception escaping it is reported as fxprop's own failure.
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


def is_rule_code(code: Any) -> bool:
    """Whether ``code`` is the body of a registered rule (wherever the rule was written)."""
    return any(getattr(rule.fn, "__code__", None) is code for rule in list(_python_rules.values()))


def python_rule(target: Any) -> Rule | None:
    """The rule registered for ``target``, or for the function it wraps: torch rewraps some of its
    functions at run time (``torch._dynamo`` replaces ``torch.manual_seed`` when imported)."""
    seen = 0
    while target is not None and seen < 8:
        try:
            found = _python_rules.get(target)
        except TypeError:  # an unhashable target has no rule
            return None
        if found is not None:
            return found
        target = getattr(target, "__wrapped__", None) if callable(target) else None
        seen += 1
    return None


def registered_rules() -> dict[Any, Rule]:
    """A snapshot of every hand-written rule, keyed by target."""
    with _lock:
        return dict(_python_rules)
