"""The symbolic session of the propagation in progress, and what its rules and kernels ask of it."""
from __future__ import annotations

import contextlib
from typing import Any

import sympy
import torch

from .. import ambient
from ..errors import DataDependentError, InputError, PropagationError
from .session import _INACTIVE, _SESSIONS, SymbolicSession, _plain
from .sizes import broadcast_shapes, contiguous_strides, definitely_equal, has_symbolic


def broadcast_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A pointwise op's tensor inputs, made to agree where the bounds cannot decide their broadcast.

    torch would take the non-broadcasting path there and assume ``B == C``; fxprop assumes only
    what broadcasting needs (``B == 1 | C == 1 | B == C``) and gives the exact size
    (``Max(B, C)``, or the literal ``c`` against ``B``), by handing the kernel stand-ins of that size.
    """
    tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
    if len(tensors) < 2 or not has_symbolic(tensors):
        return args, kwargs
    shape, assumptions = broadcast_shapes(*(tensor.shape for tensor in tensors))
    if not assumptions:
        return args, kwargs
    env = current().start()
    for assumption in assumptions:
        if not env.guard_or_defer_runtime_assert(assumption, "fxprop: broadcasting"):
            raise PropagationError(f"broadcasting: shapes {[tuple(t.shape) for t in tensors]} cannot broadcast "
                                   f"under what was assumed before ({assumption} is false)")
    rank = len(shape)

    def stand_in(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        sizes = list(value.shape)
        changed = False
        for i, size in enumerate(sizes):
            target = shape[rank - len(sizes) + i]
            if not definitely_equal(size, 1) and not definitely_equal(size, target):
                sizes[i], changed = target, True
        if not changed:
            return value
        return torch.empty_strided(sizes, contiguous_strides(sizes), dtype=value.dtype, device="meta")

    return tuple(stand_in(value) for value in args), {key: stand_in(value) for key, value in kwargs.items()}






_NO_DISPATCHER = contextlib.nullcontext()


def current() -> SymbolicSession:
    """The symbolic session of the `propagate` call in progress (an inactive one outside any)."""
    return ambient.symbols() or _INACTIVE


def scope(session: SymbolicSession):
    """Make ``session`` the symbolic session of the call in progress for a block (`fxprop.ambient`)."""
    return ambient.entered(symbols=session)


def program_range(shape_env: Any, symbol: sympy.Symbol) -> tuple | None:
    """``(lower, upper)`` of ``symbol`` for an ExportedProgram's ``range_constraints``, or None
    where ``shape_env`` does not know it (`SymbolicSession.program_range`)."""
    if symbol not in shape_env.var_to_range:
        return None
    session = _SESSIONS.get(shape_env)
    if session is not None:
        return session.program_range(symbol)
    bounds = shape_env.var_to_range[symbol]
    return bounds.lower, bounds.upper


def session_of(gm: torch.fx.GraphModule) -> SymbolicSession:
    """The session a graph was propagated in, so that re-propagating part of it shares its symbols."""
    if gm.meta.get("fxprop", {}).get("symbols"):
        from ..torch_compat import pytree
        tree_leaves = pytree.tree_leaves
        for node in gm.graph.nodes:
            for leaf in tree_leaves(node.meta.get("val")):
                sizes = leaf.shape if isinstance(leaf, torch.Tensor) else (leaf,)
                for size in sizes:
                    if isinstance(size, torch.SymInt):
                        found = _SESSIONS.get(size.node.shape_env)
                        if found is not None:
                            return found
    return SymbolicSession()


def python_dispatcher():
    from ..torch_compat import enable_python_dispatcher
    return enable_python_dispatcher()


def dispatcher(session: SymbolicSession):
    """torch's python dispatcher while symbols are live: it holds the symbolic meta kernels."""
    if not session.active:
        return _NO_DISPATCHER
    from ..torch_compat import enable_python_dispatcher
    return enable_python_dispatcher()


def spec_to_meta(shape: tuple, stride: tuple | None, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor for a TensorSpec with symbolic dims, in the session in progress."""
    session = current()
    if session is _INACTIVE:
        raise InputError(f"a TensorSpec with symbolic dims {shape} can only be used as a propagate input")
    sizes = [session.size(dim, shape) for dim in shape]
    if stride is None:
        stride = contiguous_strides(sizes)
    return torch.empty_strided(sizes, stride, dtype=dtype, device="meta")


def no_symbolic_rule(func: Any, args: tuple, kwargs: dict) -> str:
    """Why an op with no symbolic rule cannot run on its symbolic inputs (it must not run on guessed
    data): the op and its symbolic inputs."""
    named = [*((f"arg{i}", value) for i, value in enumerate(args)), *kwargs.items()]
    session = current()
    described = ", ".join(f"{name} {_describe(value, session)}" for name, value in named if has_symbolic([value]))
    return (f"{func}: no symbolic rule for this op (no meta kernel, no decomposition), and its "
            f"input {described} is symbolic; register one with @fxprop.rule({func})")


def undecidable(func: Any, args: tuple, kwargs: dict, error: BaseException) -> DataDependentError:
    """A kernel branched on a size the bounds cannot decide: name the op, the condition and the inputs."""
    session = current()
    condition = getattr(error, "cond", None)
    if condition is None:
        needed = session.readable(str(error).splitlines()[0])
    elif isinstance(condition, sympy.logic.boolalg.Boolean):
        needed = f"whether {session.readable(str(_plain(condition)))}"
    else:
        needed = f"a concrete value for {session.readable(str(_plain(condition)))}"
    symbolic = [f"arg{i} {_describe(value, session)}" for i, value in enumerate(args) if has_symbolic([value])]
    return DataDependentError(f"{func}: no symbolic rule can decide {needed} for the symbolic input "
                            f"{', '.join(symbolic) or '(a symbolic size)'}; the op's meta kernel branches on it. "
                            f"Give the dims concrete values or register a rule with @fxprop.rule({func})")


def _describe(value: Any, session: SymbolicSession) -> str:
    if isinstance(value, torch.Tensor):
        return f"of shape {tuple(session.user(d) for d in value.shape)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(item, session) for item in value) + "]"
    return f"= {session.user(value)}"
