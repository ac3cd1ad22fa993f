"""Comparing sizes without a guard: three-valued truth, equality, broadcasting, layouts.

Sizes are ints, SymInts or sympy expressions; nothing here installs a guard in a ShapeEnv.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import sympy
import torch

from .. import ambient, torch_compat
from ..call import has_symbolic  # noqa: F401  (a call's fact, named here too)
from ..errors import InternalError, PropagationError


def resolve(condition: Any, default: bool | None = None) -> bool | None:
    """Three-valued truth of a size condition: True, False, or ``default`` when undecided.

    ``condition`` is a python bool, a `torch.SymBool` or a sympy relation. Never guards:
    an undecided condition records nothing.

    >>> B = sympy.Symbol("B", integer=True, positive=True)
    >>> resolve(sympy.Gt(B, 0)), resolve(sympy.Eq(B, 1)), resolve(sympy.Eq(B, 1), default=False)
    (True, None, False)
    """
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, torch.SymBool):
        node = condition.node
        if node.expr.is_Boolean and node.expr in (sympy.true, sympy.false):
            return bool(node.expr)
        found = torch_compat.evaluate_statically(node.shape_env, node.expr)
        return bool(found) if found is not None else default
    if isinstance(condition, sympy.Basic):
        simplified = sympy.simplify(condition)
        if simplified in (sympy.true, sympy.false):
            return bool(simplified)
        return default
    return bool(condition)


def definitely_equal(a: Any, b: Any) -> bool:
    """Whether two sizes (ints, SymInts or sympy expressions) are equal for every value of their symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        # as `resolve` decides ``a == b``, without the SymInt comparison's traced node
        return _known_equal(_shape_env_of((a, b)), _as_sympy(a), _as_sympy(b))
    return resolve(_relation(sympy.Eq, a, b), default=False) is True


def broadcast_shapes(*shapes: Iterable[Any]) -> tuple:
    """The broadcast of shapes of ints, SymInts or sympy expressions, and the assumptions it needs.

    Returns ``(shape, assumptions)``. Where two sizes ``a`` and ``b`` are not known to be equal
    and neither is known to be 1, the broadcast is valid only if ``a == 1 | b == 1 | a == b``
    (an assumption), and its size is ``Max(a, b)``, or the literal when one of them is one.

    >>> B, C = sympy.symbols("B C", integer=True, positive=True)
    >>> broadcast_shapes((B, 16), (1, 16))
    ((B, 16), [])
    >>> broadcast_shapes((B,), (C,))
    ((Max(B, C),), [Eq(B, 1) | Eq(B, C) | Eq(C, 1)])
    >>> broadcast_shapes((B,), (3,))
    ((3,), [Eq(B, 1) | Eq(B, 3)])
    """
    shapes = [tuple(shape) for shape in shapes]
    rank = max((len(shape) for shape in shapes), default=0)
    out: list[Any] = []
    assumptions: list[Any] = []
    for position in range(rank):
        sizes = [shape[position - rank + len(shape)] for shape in shapes if position - rank + len(shape) >= 0]
        current: Any = 1
        for size in sizes:
            if definitely_equal(size, 1) or definitely_equal(size, current):
                continue
            if definitely_equal(current, 1):
                current = size
                continue
            if isinstance(current, int) and isinstance(size, int):
                raise PropagationError(f"broadcast_shapes: sizes {current} and {size} do not broadcast, "
                                       f"got shapes {shapes}")
            first, second = _as_sympy(current), _as_sympy(size)
            assumptions.append(sympy.Or(sympy.Eq(first, 1), sympy.Eq(second, 1), sympy.Eq(first, second)))
            if isinstance(size, int):
                current = size
            elif not isinstance(current, int):
                current = (torch.sym_max(current, size) if isinstance(current, torch.SymInt)
                           or isinstance(size, torch.SymInt) else sympy.Max(current, size))
        out.append(current)
    return tuple(out), assumptions


_DIM_ORDER = {torch.channels_last: (1, 3, 2, 0), torch.channels_last_3d: (1, 4, 3, 2, 0)}  # fastest first


def known_laid_out_in(shape: tuple, stride: tuple, memory_format: torch.memory_format) -> bool:
    """Whether sizes and strides are laid out in ``memory_format``, as far as the ShapeEnv knows
    without deciding anything: what its ranges decide statically never adds a guard, where torch's
    own checks guard on a backed size's hint. Worked on the sizes' expressions: SymInt arithmetic
    would build a traced node for every product."""
    env = _shape_env_of((*shape, *stride))
    sizes, strides = [_as_sympy(size) for size in shape], [_as_sympy(size) for size in stride]
    if memory_format is torch.contiguous_format:
        if _known(env, sympy.Eq, sympy.Mul(*sizes), 0):
            return True
        order = range(len(shape) - 1, -1, -1)
    else:
        order = _DIM_ORDER[memory_format]
        if len(order) != len(shape):
            return False
    expected = sympy.Integer(1)
    for dim in order:
        size = sizes[dim]
        if _known_equal(env, size, 1):
            continue
        if not _known_equal(env, strides[dim], expected):
            return False
        expected = expected * size
    return True


class Undecided(Exception):
    """A relation of sizes that has different answers for different values in the ShapeEnv's ranges."""


class DecidedSizes:
    """Relations of sizes (ints or SymInts) answered as every value in the ShapeEnv's ranges answers
    them, without a guard; `Undecided` where the values disagree or the ranges cannot tell.

    >>> sizes = DecidedSizes(())
    >>> sizes.eq(3, 3), sizes.lt(4, 3)
    (True, False)
    """

    def __init__(self, sizes: Iterable[Any]):
        self.env = _shape_env_of(tuple(sizes))
        self._truths = propagation_memo(self.env, "static truths")
        self._products = propagation_memo(self.env, "products")

    def eq(self, a: Any, b: Any) -> bool:
        if type(a) is int and type(b) is int:
            return a == b
        a, b = _as_sympy(a), _as_sympy(b)
        return a == b or self._decide(sympy.Eq, sympy.Ne, a, b)

    def lt(self, a: Any, b: Any) -> bool:
        if type(a) is int and type(b) is int:
            return a < b
        a, b = _as_sympy(a), _as_sympy(b)
        return self._decide(sympy.Lt, sympy.Ge, a, b)

    def times(self, a: Any, b: Any) -> Any:
        """``a * b`` in SymInt arithmetic, kept for the propagation by the expressions: the strides
        of one layout are the same products, layer after layer."""
        if (type(a) is int and type(b) is int) or self.env is None:
            return a * b
        return kept(self._products, self.env, (_as_sympy(a), _as_sympy(b)), lambda: a * b)

    def _decide(self, relation: type, negation: type, a: Any, b: Any) -> bool:
        env, truths = self.env, self._truths
        if kept(truths, env, (relation, a, b), lambda: _evaluated(env, relation(a, b))) is True:
            return True
        if kept(truths, env, (negation, a, b), lambda: _evaluated(env, negation(a, b))) is True:
            return False
        raise Undecided(relation(a, b))


def _known_equal(env: Any, a: sympy.Expr, b: Any) -> bool:
    """``a == b`` as the ShapeEnv knows it, without a guard; equal expressions are equal on sight."""
    return a == b or _known(env, sympy.Eq, a, b)


def _known(env: Any, relation: type, a: Any, b: Any) -> bool:
    return static_truth(env, relation, a, b) is True


def static_truth(env: Any, relation: type, a: Any, b: Any) -> bool | None:
    """``relation(a, b)`` (``sympy.Eq``, ``Ne``, ``Lt``, ...; sympy expressions) as the ShapeEnv's
    ranges decide it without a guard: True, False, or None where they do not (or cannot simplify it,
    as torch's ``statically_known_true`` reads that). A model asks the same few relations of every
    layer (``Eq(s1, 1)`` of every view), and building a sympy relation costs more than looking the
    answer up: the propagation keeps them (`propagation_memo`)."""
    if env is None:
        return None
    return kept(propagation_memo(env, "static truths"), env, (relation, a, b), lambda: _evaluated(env, relation(a, b)))


def propagation_memo(env: Any, memo: str) -> dict | None:
    """The propagation in progress's ``memo`` of facts of sizes in ``env``; None outside a propagation
    or for another ShapeEnv. Never kept across propagations: what one learned is not another's first sight."""
    session = ambient.symbols()
    return session.memos.setdefault(memo, {}) if env is not None and session is not None and session.env is env else None


def kept(memo: dict | None, env: Any, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` kept in ``memo`` by ``key``. A decided answer (not None) stays decided as the
    ShapeEnv learns more; an open one is computed again once it has learned something."""
    if memo is None:
        return compute()
    found = memo.get(key)
    if found is not None and (found[1] is not None or found[0] == torch_compat.shape_env_version(env)):
        return found[1]
    answer = compute()
    memo[key] = (torch_compat.shape_env_version(env), answer)
    return answer


def _evaluated(env: Any, relation: Any) -> bool | None:
    if relation is sympy.true or relation is sympy.false:
        return bool(relation)
    try:
        found = torch_compat.evaluate_statically(env, relation)
    except Exception:  # as torch's statically_known_true: what it cannot simplify is not known
        return None
    return None if found is None else bool(found)


def _shape_env_of(sizes: tuple) -> Any:
    return next((size.node.shape_env for size in sizes if isinstance(size, torch.SymInt)), None)


def contiguous_strides(sizes: Iterable[Any], inner: Any = 1) -> tuple:
    """Row-major strides of ``sizes`` (ints or SymInts, without a guard), over blocks of ``inner`` elements."""
    strides, running = [], inner
    for size in reversed(list(sizes)):
        strides.append(running)
        running = running * (torch.sym_max(size, 1) if isinstance(size, torch.SymInt) else max(size, 1))
    return tuple(reversed(strides))


def _relation(kind, a: Any, b: Any):
    return kind(_as_sympy(a), _as_sympy(b))


def _as_sympy(value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        return torch_compat.size_expression(value)
    if isinstance(value, (bool, int)):
        return sympy.Integer(value)
    if isinstance(value, sympy.Basic):
        return value
    raise InternalError(f"not a size: {value!r}")


