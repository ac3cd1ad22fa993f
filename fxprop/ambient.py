"""The one ambient handle: the state of the `propagate` call running on this thread.

A propagation passes its state explicitly where it can. What torch calls back into (a rule, a
meta kernel's device hint, a dispatch mode) cannot be handed an argument, so it reaches the call
through this handle: `session()` (the engine's `Session`: the node's record and logical device,
the known values, the subgraph walker) and `symbols()` (the `SymbolicSession`: the call's
ShapeEnv and symbols). `entered` makes them current for a block and restores the outer ones after,
so nested calls (a rule that propagates a graph of its own) and threads never see each other's.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

_local = threading.local()
_UNCHANGED = object()


def session() -> Any:
    """The engine's `Session` of the call in progress, or None outside any."""
    return getattr(_local, "session", None)


def symbols() -> Any:
    """The `SymbolicSession` of the call in progress, or None outside any."""
    return getattr(_local, "symbols", None)


def node_device() -> Any:
    """The logical device of the node being propagated (None outside a call, or before one is known)."""
    current = session()
    return current.record.device if current is not None else None


@contextlib.contextmanager
def entered(*, session: Any = _UNCHANGED, symbols: Any = _UNCHANGED):
    """Make ``session`` and/or ``symbols`` current on this thread for the block."""
    outer = (getattr(_local, "session", None), getattr(_local, "symbols", None))
    if session is not _UNCHANGED:
        _local.session = session
    if symbols is not _UNCHANGED:
        _local.symbols = symbols
    try:
        yield
    finally:
        _local.session, _local.symbols = outer
