"""Byte and FLOP counts as numbers: python ints, or sympy expressions in the user's symbols.

The largest of several symbolic counts is kept as the counts that can still be the largest
for some sizes (`largest`): a count that is provably no larger than another is dropped.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import sympy
import torch

from ..symbolic import user_shape


def number(value: Any) -> Any:
    """An int, or for a SymInt its sympy expression in the user's own symbols."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        value = user_shape(value)
    if isinstance(value, sympy.Integer):
        return int(value)
    if isinstance(value, sympy.Basic) and not isinstance(value, sympy.Expr):
        raise TypeError(f"expected a size, got {value!r}")
    return value


def is_symbolic(value: Any) -> bool:
    return isinstance(value, sympy.Basic) and bool(value.free_symbols)


def substitute(value: Any, values: Mapping[sympy.Symbol, int]) -> Any:
    """``value`` with symbols replaced; an int once no symbol is left."""
    if not isinstance(value, sympy.Basic):
        return value
    found = value.xreplace({symbol: sympy.Integer(size) for symbol, size in values.items()})
    if found.free_symbols:
        return found
    if not found.is_Number:
        found = sympy.simplify(found)
    return int(found) if found.is_Integer else found


def text(value: Any) -> Any:
    """A JSON-ready number: ints stay ints, expressions become their text."""
    return value if isinstance(value, (int, float)) else str(value)


class Comparer:
    """Decides ``a <= b`` for size expressions, knowing each symbol's lower bound."""

    def __init__(self, lower_bounds: Mapping[sympy.Symbol, Any]):
        self.lower_bounds = dict(lower_bounds)
        self._memo: dict[tuple, bool] = {}

    def provably_le(self, a: Any, b: Any) -> bool:
        if a == b:
            return True
        if not is_symbolic(a) and not is_symbolic(b):
            return bool(a <= b)
        key = (a, b)
        if key not in self._memo:
            self._memo[key] = self._nonnegative(sympy.sympify(b) - sympy.sympify(a))
        return self._memo[key]

    def _nonnegative(self, difference: sympy.Expr) -> bool:
        expanded = sympy.expand(difference)
        bounded = self._without_floors(expanded)
        if bounded is not None and self._shifted_nonnegative(bounded):
            return True
        return bool(expanded.is_nonnegative)

    def _shifted_nonnegative(self, expr: sympy.Expr) -> bool:
        """Each symbol as its lower bound plus a non-negative offset: all coefficients non-negative."""
        shifted, offsets = {}, []
        for symbol in expr.free_symbols:
            offset = sympy.Dummy(f"{symbol}_over", integer=True, nonnegative=True)
            lower = self.lower_bounds.get(symbol, 1 if symbol.is_positive else 0)
            shifted[symbol] = offset + (lower if lower not in (None, -sympy.oo) else 0)
            offsets.append(offset)
        expanded = sympy.expand(expr.xreplace(shifted))
        if expanded.is_number:
            return bool(expanded >= 0)
        if not expanded.is_polynomial(*offsets):
            return False
        return all(coefficient >= 0 for coefficient in sympy.Poly(expanded, *offsets).coeffs())

    def _without_floors(self, expr: sympy.Expr) -> sympy.Expr | None:
        """A lower bound of ``expr`` free of floor/ceiling (output sizes of convolutions and pools).

        Every floor must be of a non-negative argument, so that it is non-negative itself; where
        all its terms are subtracted it is replaced by its upper bound (its argument, plus one for
        a ceiling), where all are added by 0. None when a floor appears with both signs.
        """
        rounded = list(expr.atoms(sympy.floor, sympy.ceiling))
        if not rounded:
            return expr
        signs: dict[Any, set] = {item: set() for item in rounded}
        for term in sympy.Add.make_args(expr):
            coefficient = term.as_coeff_Mul()[0]
            for item in rounded:
                if term.has(item):
                    signs[item].add(bool(coefficient > 0))
        replacements = {}
        for item in rounded:
            argument = item.args[0]
            if argument.has(sympy.floor, sympy.ceiling) or not self._shifted_nonnegative(argument):
                return None
            if signs[item] == {False}:
                replacements[item] = argument + (1 if isinstance(item, sympy.ceiling) else 0)
            elif signs[item] == {True}:
                replacements[item] = sympy.Integer(0)
            else:
                return None
        return sympy.expand(expr.xreplace(replacements))


def largest(candidates: Iterable[tuple[str, Any]], comparer: Comparer) -> list[tuple[str, Any]]:
    """The (name, count) pairs that can be the largest for some sizes, in their first order.

    Concrete counts give the first largest one. Of symbolic counts, one that is provably no
    larger than a count kept before it is dropped, and a kept count provably no larger than a
    later one is dropped for it.

    >>> B, T = sympy.symbols("B T", integer=True, positive=True)
    >>> largest([("a", 4 * B * T), ("b", 8 * B * T), ("c", 64 * T)], Comparer({}))
    [('b', 8*B*T), ('c', 64*T)]
    >>> largest([("a", 3), ("b", 5), ("c", 5)], Comparer({}))
    [('b', 5)]
    """
    kept: list[tuple[str, Any]] = []
    for name, count in candidates:
        if any(comparer.provably_le(count, other) for _, other in kept):
            continue
        kept = [(other_name, other) for other_name, other in kept if not comparer.provably_le(other, count)]
        kept.append((name, count))
    return kept
