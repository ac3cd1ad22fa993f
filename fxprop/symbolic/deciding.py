"""Deciding what torch's static evaluation leaves open: size relations over the integers.

torch decides a relation between sizes from its symbols' ranges, and by matching what was
assumed before word for word. ``2*floor(H/2) - 2 >= H`` (max pooling's ceil_mode check) it
leaves open, though no integer H makes it true. `decide` settles such relations as one would by
hand: every ``floor(a)`` becomes an integer ``f`` with ``a - 1 < f <= a`` (``ceiling`` and ``Mod``
likewise, ``Max`` and ``Min`` by the bound each gives), any other non-linear term an integer
within the bounds of its factors; the relation, then its negation, joins the symbols' ranges and
the facts the run holds (what it assumed) as linear inequalities. Fourier-Motzkin elimination
over them, each derived inequality rounded as integers allow, is sound: a system it refutes has
no integer solution, so the relation (or its negation) is false for every value of the sizes.
Whatever it cannot refute stays undecided (None), and the caller refuses as before; nothing is
ever guessed.

    >>> import sympy
    >>> H = sympy.Symbol("H", integer=True, positive=True)
    >>> decide(2 * sympy.floor(H / 2) - 2 >= H, lambda symbol: (1, None))
    False
    >>> decide(sympy.floor(H / 2) >= 2, lambda symbol: (1, None), [H >= 4]), decide(H >= 4, lambda symbol: (1, None))
    (True, None)
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Iterable

import sympy

MAX_INEQUALITIES = 400
"""The most inequalities elimination holds at once; a larger system stays undecided."""

MAX_CASES = 16
"""The most alternatives a relation's disjunctions expand to; more stay undecided."""

Bounds = Callable[[sympy.Symbol], tuple]  # a symbol -> (lower, upper), None (or an infinity) where unbounded
_Row = tuple[tuple, int]  # ((variable, coefficient), ...), constant: sum(coefficient * variable) + constant >= 0
_NEGATED = {">=": "<", ">": "<=", "<=": ">", "<": ">=", "==": "!=", "!=": "=="}


class _Open(Exception):
    """The relation leaves what this reasoning covers (a non-integer term, too large a system)."""


def decide(relation: Any, bounds: Bounds, facts: Iterable[Any] = ()) -> bool | None:
    """Whether ``relation`` holds for every integer value of its symbols within ``bounds`` that
    satisfies ``facts`` (True), for none (False), or depends on the values (None). Facts that are
    not conjunctions of relations are left out, which only weakens what can be shown."""
    relation = sympy.sympify(relation)
    if relation in (sympy.true, sympy.false):
        return bool(relation)
    try:
        system = _System(bounds)
        holding, failing = system.cases(relation, False), system.cases(relation, True)
        known = system.facts(facts, relation.free_symbols)
        never_holds = all(system.refuted(known + rows) for rows in holding)
        never_fails = all(system.refuted(known + rows) for rows in failing)
    except _Open:
        return None
    if never_holds == never_fails:  # neither shown, or the facts contradict each other
        return None
    return never_fails


class _System:
    """Linear inequalities over integer variables: the symbols, and one per non-linear term."""

    def __init__(self, bounds: Bounds):
        self.bounds = bounds
        self.variables: dict[sympy.Basic, int] = {}
        self.definitions: list[_Row] = []  # the variables' bounds, and what defines each term's variable

    def refuted(self, rows: list[_Row]) -> bool:
        return _refuted([*self.definitions, *rows])

    def facts(self, facts: Iterable[Any], symbols: set) -> list[_Row]:
        """The rows of the facts that reach ``symbols``, through shared symbols."""
        pending = [fact for fact in facts if isinstance(fact, sympy.Basic) and fact.free_symbols]
        reached, rows, grew = set(symbols), [], True
        while grew:
            grew = False
            for fact in list(pending):
                if fact.free_symbols & reached:
                    pending.remove(fact)
                    reached |= fact.free_symbols
                    grew = True
                    try:
                        cases = self.cases(fact, False)
                    except _Open:
                        continue
                    if len(cases) == 1:
                        rows.extend(cases[0])
        return rows

    def cases(self, relation: Any, negated: bool) -> list[list[_Row]]:
        """``relation`` (or its negation) as alternatives, each a conjunction of rows."""
        if isinstance(relation, sympy.Not):
            return self.cases(relation.args[0], not negated)
        if isinstance(relation, (sympy.And, sympy.Or)):
            parts = [self.cases(arg, negated) for arg in relation.args]
            if isinstance(relation, sympy.And) == negated:  # a disjunction
                return _capped([case for part in parts for case in part])
            combined: list[list[_Row]] = [[]]
            for part in parts:
                combined = _capped([[*first, *second] for first in combined for second in part])
            return combined
        if relation in (sympy.true, sympy.false):
            return [[]] if bool(relation) != negated else []
        if not isinstance(relation, sympy.core.relational.Relational):
            raise _Open
        op = _NEGATED[relation.rel_op] if negated else relation.rel_op
        difference = relation.lhs - relation.rhs
        if op == "==":
            return [[self.row(difference, False), self.row(-difference, False)]]
        if op == "!=":
            return [[self.row(difference, True)], [self.row(-difference, True)]]
        if op in (">=", ">"):
            return [[self.row(difference, op == ">")]]
        return [[self.row(-difference, op == "<")]]

    def row(self, expr: Any, strict: bool) -> _Row:
        """``expr >= 0`` (``> 0`` if ``strict``) as an integer row: integer-valued, so ``> 0`` is ``>= 1``."""
        coefficients, constant = self.linear(expr)
        scale = math.lcm(constant.denominator, *(c.denominator for c in coefficients.values()))
        return _normal({v: int(c * scale) for v, c in coefficients.items()}, int(constant * scale) - strict)

    def linear(self, expr: Any) -> tuple[dict[int, Fraction], Fraction]:
        coefficients: dict[int, Fraction] = {}
        constant = Fraction(0)
        for term in sympy.Add.make_args(sympy.expand(expr)):
            factor, rest = term.as_coeff_Mul()
            if not factor.is_Rational:
                raise _Open
            factor = Fraction(int(factor.p), int(factor.q))
            if rest == 1:
                constant += factor
                continue
            if isinstance(rest, sympy.Mod) and rest.args[1].is_Integer and rest.args[1] > 0:
                whole, modulus = rest.args
                inner, inner_constant = self.linear(whole - modulus * sympy.floor(whole / modulus))
                for variable, coefficient in inner.items():
                    coefficients[variable] = coefficients.get(variable, 0) + factor * coefficient
                constant += factor * inner_constant
                continue
            variable = self.variable(rest)
            coefficients[variable] = coefficients.get(variable, 0) + factor
        return coefficients, constant

    def variable(self, term: sympy.Basic) -> int:
        found = self.variables.get(term)
        if found is not None:
            return found
        if isinstance(term, (sympy.floor, sympy.ceiling)):
            inner = term.args[0]
        elif isinstance(term, (sympy.Max, sympy.Min)) or term.is_Symbol or term.is_Mul or term.is_Pow:
            if term.is_integer is not True:
                raise _Open
            inner = None
        else:
            raise _Open
        index = self.variables[term] = len(self.variables)
        own = sympy.Dummy()  # the term as a variable, in the rows that define it
        self.variables[own] = index
        if isinstance(term, sympy.floor):  # a - 1 < f <= a
            self.definitions += [self.row(inner - own, False), self.row(own - inner + 1, True)]
        elif isinstance(term, sympy.ceiling):  # a <= c < a + 1
            self.definitions += [self.row(own - inner, False), self.row(inner + 1 - own, True)]
        elif isinstance(term, sympy.Max):
            self.definitions += [self.row(own - arg, False) for arg in term.args]
        elif isinstance(term, sympy.Min):
            self.definitions += [self.row(arg - own, False) for arg in term.args]
        else:
            lower, upper = self.bounds(term) if term.is_Symbol else _product_bounds(term, self.bounds)
            if _finite(lower):
                self.definitions.append(_normal({index: 1}, -int(lower)))
            if _finite(upper):
                self.definitions.append(_normal({index: -1}, int(upper)))
        return index


def _product_bounds(term: sympy.Basic, bounds: Bounds) -> tuple:
    """Bounds of a product or power of non-negative symbols (``B*T``, ``H**2``); none otherwise."""
    factors = [(term.base, term.exp)] if term.is_Pow else [factor.as_base_exp() for factor in term.args]
    lower, upper = 1, 1
    for base, exponent in factors:
        if not (base.is_Symbol and exponent.is_Integer and exponent > 0):
            return None, None
        low, high = bounds(base)
        if not _finite(low) or low < 0:
            return None, None
        lower = lower * int(low) ** int(exponent)
        upper = upper * int(high) ** int(exponent) if upper is not None and _finite(high) else None
    return lower, upper


def _finite(bound: Any) -> bool:
    """Whether ``bound`` is a number rather than None or an infinity (sympy's or torch's ``int_oo``)."""
    return isinstance(bound, int) or bool(getattr(bound, "is_Integer", False))


def _capped(cases: list) -> list:
    if len(cases) > MAX_CASES:
        raise _Open
    return cases


def _normal(coefficients: dict[int, int], constant: int) -> _Row:
    """A row divided by its coefficients' common divisor, the constant rounded down: over the
    integers ``2x - 3 >= 0`` is ``x - 2 >= 0``."""
    coefficients = {v: c for v, c in coefficients.items() if c}
    divisor = math.gcd(*coefficients.values()) if coefficients else 1
    if divisor > 1:
        coefficients = {v: c // divisor for v, c in coefficients.items()}
        constant = constant // divisor
    return tuple(sorted(coefficients.items())), constant


def _refuted(rows: list[_Row]) -> bool:
    """Whether Fourier-Motzkin elimination shows the rows have no integer solution, after each
    equality with a unit coefficient is solved for that variable and substituted (`_substituted`)."""
    table: dict[tuple, int] = {}
    if _kept(table, _substituted(rows)):
        return True
    while table:
        variables = {v for key in table for v, _ in key}
        counts = {v: [0, 0] for v in variables}
        for key in table:
            for v, c in key:
                counts[v][c < 0] += 1
        chosen = min(variables, key=lambda v: counts[v][0] * counts[v][1])
        upper, lower, rest = [], [], []
        for key, constant in table.items():
            coefficient = dict(key).get(chosen, 0)
            (lower if coefficient > 0 else upper if coefficient < 0 else rest).append((dict(key), constant))
        table = {}
        _kept(table, [(tuple(sorted(key.items())), constant) for key, constant in rest])
        for low, low_constant in lower:
            for high, high_constant in upper:
                a, b = low[chosen], -high[chosen]
                combined = {v: b * low.get(v, 0) + a * high.get(v, 0) for v in {*low, *high} if v != chosen}
                if _kept(table, [_normal(combined, b * low_constant + a * high_constant)]):
                    return True
        if len(table) > MAX_INEQUALITIES:
            raise _Open
    return False


def _substituted(rows: list[_Row]) -> list[_Row]:
    """The rows with every equality that has a variable of coefficient 1 or -1 solved for it, and
    the variable replaced by that integer expression in every row, each row rounded again.
    Elimination alone may combine away the rows that carry parity (``B == 2*f`` and
    ``B + 1 == 2*g`` have no integer solution, which ``g - f == 1/2`` shows only once ``B`` is
    gone); over the integers the substitution is exact, so the rounding after it stays sound."""
    rows = list(dict.fromkeys(rows))
    while True:
        constants: dict[tuple, set] = {}
        for key, constant in rows:
            constants.setdefault(key, set()).add(constant)
        found = None
        for key, constant in rows:
            negated = tuple((variable, -coefficient) for variable, coefficient in key)
            if key and -constant in constants.get(negated, ()):
                unit = next((variable for variable, coefficient in key if abs(coefficient) == 1), None)
                if unit is not None:
                    found = dict(key), constant, unit
                    break
        if found is None:
            return rows
        equality, constant, unit = found  # sum(equality[v] * v) + constant == 0
        substituted = []
        for key, row_constant in rows:
            coefficients = dict(key)
            multiple = coefficients.get(unit, 0) * equality[unit]  # unit = -(rest + constant) * equality[unit]
            if not multiple:
                substituted.append((key, row_constant))
                continue
            combined = {v: coefficients.get(v, 0) - multiple * equality.get(v, 0)
                        for v in {*coefficients, *equality} if v != unit}
            substituted.append(_normal(combined, row_constant - multiple * constant))
        rows = list(dict.fromkeys(substituted))


def _kept(table: dict, rows: list[_Row]) -> bool:
    """Add rows to ``table`` (the tightest constant per left side); whether one is a contradiction."""
    for key, constant in rows:
        if not key:
            if constant < 0:
                return True
            continue
        known = table.get(key)
        if known is None or constant < known:
            table[key] = constant
    return False
