"""Running an op as the ops it decomposes into, each of them resolved again."""
from __future__ import annotations

from typing import Any, Callable

from ..aten import layout
from ..engine.blame import boundary
from ..torch_compat import OpOverload, call_kernel


@boundary
def run_decomposition(op: OpOverload, decomposition: Callable, args: tuple, kwargs: dict) -> Any:
    """A `torch._decomp` decomposition; the caller has fxprop's dispatch active for its ops."""
    return layout.relayout(op, args, kwargs, decomposition(*args, **kwargs))


@boundary
def run_composite_kernel(op: OpOverload, key: str, args: tuple, kwargs: dict) -> Any:
    """torch's C++ composite kernel of ``op`` (registered for dispatch key ``key``), whose ops
    reach fxprop's dispatch."""
    return layout.relayout(op, args, kwargs, call_kernel(op, key, *args, **kwargs))
