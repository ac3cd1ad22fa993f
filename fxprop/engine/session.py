"""The state of the `propagate` call in progress, for the rules that need to consult it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import ambient
from ..kinds import Kind, costlier
from .known_values import KnownValues
from ..torch_compat import _disable_current_modes


@dataclass
class NodeRecord:
    """What one node needed: the costliest rule its ops reached, host bytes, its logical device."""
    device: torch.device | None = None
    kind: Kind | None = None
    rule: str = ""
    fallback_bytes: int = 0

    def note(self, kind: Kind, rule: str) -> None:
        if costlier(self.kind, kind) is not self.kind:
            self.kind, self.rule = kind, rule


@dataclass
class Session:
    """State of one `propagate` call that rules may consult."""
    fallback_limit_bytes: int
    real_values: KnownValues = field(default_factory=KnownValues)
    record: NodeRecord = field(default_factory=NodeRecord)
    walk_subgraph: Callable[[Any, list], Any] | None = None  # propagates a subgraph, annotating its nodes
    open_region: Callable[..., None] | None = None  # the nodes that follow run inside a region (autocast's)
    close_region: Callable[[], None] | None = None  # ... until the region is closed
    # the sizes, strides and offset of the views computed with symbolic sizes, by their geometry's
    # expressions (`fxprop.aten.view_strides.remembered_view`): they name this call's symbols
    view_geometries: dict = field(default_factory=dict)
    # The storages of the tensors given to the calls being computed whose results may be kept
    # (`GraphWalk.call`), and how many ops so far reshaped one of them in place (`reshapes_in_place`).
    storages_of_calls: frozenset = frozenset()
    reshaped_in_place: int = 0


def current_session() -> Session | None:
    """The session of the call in progress (`fxprop.ambient`), for the rules that consult it."""
    return ambient.session()


def node_device() -> torch.device | None:
    """The logical device of the node being propagated, for rules whose result depends on it."""
    return ambient.node_device()


def node_on_cpu() -> bool:
    """Whether the node being propagated runs on the CPU (whose kernels some rules follow)."""
    device = ambient.node_device()
    return device is not None and device.type == "cpu"


def on_host():
    """Leave fxprop's dispatch for a moment, for a rule that must ask the host's own kernels."""
    return _disable_current_modes()
