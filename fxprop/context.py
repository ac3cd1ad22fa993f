"""The state of the `propagate` call in progress, for the rules that need to consult it."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from .rules.registry import Kind

_STRENGTH = {Kind.PYTHON: 0, Kind.META: 1, Kind.DECOMPOSITION: 2, Kind.FALLBACK: 3}


@dataclass
class NodeRecord:
    """What one node needed: the most expensive rule kind reached, its name, and host bytes."""
    kind: Kind | None = None
    rule: str = ""
    fallback_bytes: int = 0
    device: torch.device | None = None

    def note(self, kind: Kind, rule: str, fallback_bytes: int = 0) -> None:
        if self.kind is None or _STRENGTH[kind] > _STRENGTH[self.kind]:
            self.kind, self.rule = kind, rule
        self.fallback_bytes += fallback_bytes


@dataclass
class Session:
    """State of one `propagate` call that rules may consult."""
    fallback_limit_bytes: int
    real_values: dict[int, torch.Tensor] = field(default_factory=dict)
    record: NodeRecord = field(default_factory=NodeRecord)


_local = threading.local()


def swap_session(session: Session | None) -> Session | None:
    """Make ``session`` current for this thread; returns the one it replaces."""
    previous = current_session()
    _local.session = session
    return previous


def current_session() -> Session | None:
    return getattr(_local, "session", None)


def node_device() -> torch.device | None:
    """The logical device of the node being propagated, for rules whose result depends on it."""
    session = current_session()
    return session.record.device if session is not None else None




def on_host():
    """Leave fxprop's dispatch for a moment, for a rule that must ask the host's own kernels."""
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()
