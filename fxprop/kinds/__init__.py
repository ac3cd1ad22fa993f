"""The kinds of rule that produce a value, and `Rule`: what handles one call.

How each kind runs lives beside this file: `meta` (torch's meta kernels, laid out as the
real kernels lay results out), `decomposition` (torch._decomp), `fallback` (real tensors on
the host). Which kind handles a call is decided in one place, `fxprop.resolve.order`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable


class Kind(str, enum.Enum):
    """What produced a value, cheapest first (the order in which a composite's kinds add up)."""
    PLAIN = "plain"                  # no rule needed: inputs, outputs, attributes, python arithmetic
    DEVICE = "device"                # a device rule answered alone (x.device, x.is_cuda, x.get_device())
    META = "meta"                    # torch's meta kernel (or a custom op's registered fake)
    PYTHON = "python"                # a hand-written fxprop rule
    DECOMPOSITION = "decomposition"  # a torch._decomp decomposition, each of its ops resolved again
    FALLBACK = "fallback"            # real tensors on the host, metadata kept
    UNSUPPORTED = "unsupported"      # nothing can run it here; propagating it raises UnsupportedError

    def __str__(self) -> str:
        return self.value


ORDER = {kind: rank for rank, kind in enumerate(Kind)}
_PYTHON_OPERATOR_MODULES = ("_operator", "operator", "builtins", "math")


def is_python_operator(target: Any) -> bool:
    """Whether ``target`` is python's own arithmetic or builtin (``operator.add``, ``math.floor``,
    ``getattr``): it reaches no tensor op unless a tensor is among its arguments."""
    return getattr(target, "__module__", None) in _PYTHON_OPERATOR_MODULES


def costlier(first: Kind | None, second: Kind) -> Kind:
    """The costlier of two kinds (how the kinds of a composite's ops add up)."""
    return second if first is None or ORDER[second] > ORDER[first] else first


@dataclass(frozen=True)
class Rule:
    """What handles a call.

    kind: the kind of rule that runs (for a composite, see below).
    name: the rule's name: a python rule's qualified name, an op's name, a device rule's name.
    fn: the python rule, decomposition or device rule to call; None for torch's own kernels.
    kinds: every kind this target may resolve to, when the choice depends on the call's values
        (a symbolic input refuses the fallback, a device attribute is answered by its device
        rule); ``{kind}`` when it does not.
    device_rule: the device rule that places the result, when one from `fxprop.devices` does.
    composite: torch's own composite code runs (a torch-level function, a module's forward, a
        C++ composite kernel) and each aten op it reaches is resolved on its own; the call's
        kind is the costliest of theirs.
    """
    kind: Kind
    name: str
    fn: Callable[..., Any] | None = field(default=None, compare=False)
    kinds: frozenset = frozenset()
    device_rule: str | None = None
    composite: bool = False

    def __post_init__(self) -> None:
        if not self.kinds:
            object.__setattr__(self, "kinds", frozenset({self.kind}))

    def with_kind(self, kind: Kind, name: str | None = None) -> "Rule":
        """The same rule resolved for a call: one kind, the call's own."""
        return Rule(kind, name or self.name, self.fn, frozenset({kind}), self.device_rule, self.composite)
