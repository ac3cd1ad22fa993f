"""Symbolic sizes: user symbols in, sympy expressions out, data-dependent sizes as bounded symbols.

fxprop computes symbolic shapes with torch's own machinery: one `ShapeEnv` per `propagate`
call, meta tensors whose sizes are `torch.SymInt`, and torch's meta kernels and
decompositions (run under the python dispatcher, which holds their symbolic versions).

Every symbol is *unbacked*: it has bounds but no example value, so no hint can leak into a
result. When a kernel must branch on a size it cannot decide from the bounds it either
takes the branch that is valid in general and records the condition with ``torch._check``
(these deferred runtime asserts are the *assumptions* fxprop returns), or raises; fxprop
then names the op and its symbolic inputs instead of guessing.

One exception to torch's choices: where a pointwise op's broadcast cannot be decided, torch
takes the non-broadcasting path and assumes ``B == C``; fxprop assumes only what broadcasting
needs, ``B == 1 | C == 1 | B == C``, and gives the exact size ``Max(B, C)`` (`broadcast_inputs`).

Programs from torch.export are the exception to "every symbol is unbacked": a TensorSpec given
for a placeholder that export traced (``meta["val"]``, a FakeTensor of export's ShapeEnv) is
computed in that ShapeEnv, with *backed* symbols as export makes them, so that the re-annotated
program still saves, loads and decomposes. A name at a dim export made dynamic is that dim's
symbol (``s0``); any other name is a new backed symbol whose example value is the traced size
(`SymbolicSession.bind_traced`). Data-dependent symbols get the ``unbacked_bindings`` export
writes (`SymbolicSession.adopt`).

Internally the symbols are torch's (``u0``, ``u1``, ...); at the boundary (`shape_of`,
``gm.meta["fxprop"]``, error messages) they are renamed to the user's own symbols, and
fresh data-dependent symbols are renumbered ``u0``, ``u1``, ... in the order they appear.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(16, 32))
    >>> _ = fxprop.propagate(gm, fxprop.TensorSpec(("B", 16)))
    >>> fxprop.shape_of(list(gm.graph.nodes)[-1])
    (B, 32)
"""
from __future__ import annotations

import ast
import contextlib
import math
import operator
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import sympy
import torch

from . import torch_compat
from .errors import DataDependentError, InputError, InternalError, PropagationError, UnsupportedError

MAX_EXPR_OPS = 256
"""The largest expression (in sympy operations) fxprop keeps; a bigger one raises."""

_INTERNAL_NAME = re.compile(r"\b[us]\d+\b")


# --- comparing sizes -----------------------------------------------------------------

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
        return resolve(a == b, default=False) is True
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


_DIM_ORDER = {torch.channels_last: (1, 3, 2, 0), torch.channels_last_3d: (1, 4, 3, 2, 0)}  # fastest first


def known_laid_out_in(shape: tuple, stride: tuple, memory_format: torch.memory_format) -> bool:
    """Whether sizes and strides are laid out in ``memory_format``, as far as the ShapeEnv knows
    without deciding anything: `statically_known_true` never adds a guard, where torch's own
    checks guard on a backed size's hint."""
    if memory_format is torch.contiguous_format:
        if torch_compat.statically_known_true(math.prod(shape) == 0):
            return True
        order = range(len(shape) - 1, -1, -1)
    else:
        order = _DIM_ORDER[memory_format]
        if len(order) != len(shape):
            return False
    expected = 1
    for dim in order:
        size = shape[dim]
        if _known_equal(size, 1):
            continue
        if not _known_equal(stride[dim], expected):
            return False
        expected = expected * size
    return True


def _known_equal(a: Any, b: Any) -> bool:
    """``a == b`` as the ShapeEnv knows it, without a guard; equal expressions are equal on sight."""
    if type(a) is int and type(b) is int:
        return a == b
    if _as_sympy(a) == _as_sympy(b):
        return True
    return torch_compat.statically_known_true(a == b)


def contiguous_strides(sizes: Iterable[Any]) -> tuple:
    strides, running = [], 1
    for size in reversed(list(sizes)):
        strides.append(running)
        running = running * (torch.sym_max(size, 1) if isinstance(size, torch.SymInt) else max(size, 1))
    return tuple(reversed(strides))


def _relation(kind, a: Any, b: Any):
    return kind(_as_sympy(a), _as_sympy(b))


def _as_sympy(value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, (bool, int)):
        return sympy.Integer(value)
    if isinstance(value, sympy.Basic):
        return value
    raise InternalError(f"not a size: {value!r}")


# --- the user's symbols ---------------------------------------------------------------

@dataclass(frozen=True)
class SymbolInfo:
    """One symbol of ``gm.meta["fxprop"]["symbols"]``: its bounds and, if data-dependent, where it was born."""
    symbol: sympy.Symbol
    lower: Any
    upper: Any
    node: str | None = None  # the defining node of a data-dependent symbol
    kind: str = "input"      # "input", "size" (data-dependent size) or "value" (.item())

    def relations(self) -> list:
        found = []
        if self.lower not in (None, -sympy.oo):
            found.append(sympy.Le(self.lower, self.symbol))
        if self.upper not in (None, sympy.oo):
            found.append(sympy.Le(self.symbol, self.upper))
        return found


def user_symbol(name: str) -> sympy.Symbol:
    """The symbol fxprop uses for a dim given as the string ``name``: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


def is_symbolic_dim(dim: Any) -> bool:
    return isinstance(dim, (str, sympy.Basic, torch.SymInt))


def check_dim(dim: Any, shape: tuple) -> None:
    """Refuse a TensorSpec dim that is not a size (called by `TensorSpec` for non-int dims)."""
    if isinstance(dim, str):
        if _parse(dim, shape).is_negative:
            raise InputError(f"TensorSpec dim {dim!r} is negative for every size, in shape {shape}")
        return
    if isinstance(dim, sympy.Basic):
        if not isinstance(dim, sympy.Expr) or not dim.free_symbols:
            if isinstance(dim, sympy.Integer) and int(dim) >= 0:
                return
            raise InputError(f"TensorSpec dims must be sizes, got {dim!r} in shape {shape}")
        for symbol in dim.free_symbols:
            # A symbol declared with no assumptions is a size like a name; one declared with some
            # (real=True, positive=True) must be declared an integer too, as sizes are.
            declared = symbol.assumptions0.keys() - {"commutative"}
            if (symbol.is_integer is False or symbol.is_nonnegative is False
                    or (declared and symbol.is_integer is not True)):
                raise InputError(f"TensorSpec dim {dim} uses {symbol}, declared as a non-integer or negative "
                                 f"symbol, in shape {shape}; a dim is an integer symbol or expression")
        return
    raise InputError(f"TensorSpec dims must be non-negative ints, strings or sympy expressions, got {dim!r} "
                     f"in shape {shape}")


_MAX_DIM_TEXT = 200
_MAX_EXPONENT = 8
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: lambda a, b: sympy.floor(a / b), ast.Mod: sympy.Mod}


def _parse(text: str, shape: tuple) -> sympy.Expr:
    """A dim string as a size expression. The grammar is names, integers, ``+ - * // %``, a
    small integer power and parentheses; the text is parsed, never evaluated."""
    def refuse(why: str) -> InputError:
        return InputError(f"TensorSpec dim {text!r} is not a size expression ({why}) in shape {shape}; "
                          "a dim string is made of names, integers, + - * // % ** and parentheses")

    if len(text) > _MAX_DIM_TEXT:
        raise refuse(f"longer than {_MAX_DIM_TEXT} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise refuse("not valid syntax") from None

    def build(node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sympy.Integer(node.value)
        if isinstance(node, ast.Name):
            return user_symbol(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = build(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
            if not (isinstance(exponent, ast.Constant) and type(exponent.value) is int
                    and 0 <= exponent.value <= _MAX_EXPONENT):
                raise refuse(f"an exponent must be an integer from 0 to {_MAX_EXPONENT}")
            return build(node.left) ** exponent.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](build(node.left), build(node.right))
        raise refuse(f"{type(node).__name__} is not allowed")

    return build(tree.body)


def _as_user_symbol(symbol: sympy.Symbol) -> sympy.Symbol:
    if symbol.is_integer is None and symbol.is_positive is None and symbol.is_nonnegative is None:
        return user_symbol(symbol.name)  # a plain Symbol("B"): sizes are positive integers
    return symbol


class SymbolicSession:
    """The symbols of one `propagate` call. Free until the first symbol is needed."""

    def __init__(self) -> None:
        self.active = False
        self.env = None
        self._fake_mode = None
        self.to_user: dict[sympy.Symbol, sympy.Symbol] = {}
        self.by_name: dict[str, tuple[sympy.Symbol, torch.SymInt]] = {}
        self.infos: dict[sympy.Symbol, SymbolInfo] = {}  # keyed by internal symbol
        self.fresh: list[sympy.Symbol] = []
        self._sizes_checked: set = set()
        self.backed = False  # user symbols are backed symbols of an exported program's ShapeEnv
        self._hints: dict[str, int] = {}  # a new backed symbol's example value, by user name
        self._bound: dict[str, list] = {}  # node name -> the unbacked symbols its call created
        self._made: set = set()  # the backed symbols `_backed_symint` made
        self._assumed_before: tuple[int, set] = (0, set())  # guards and asserts the ShapeEnv held before

    def start(self):
        if self is _INACTIVE:
            raise InternalError("symbolic sizes exist only inside fxprop.propagate / fxprop.repropagate")
        if self.env is None:
            from torch.fx.experimental.symbolic_shapes import ShapeEnv
            self.env = ShapeEnv(allow_dynamic_output_shape_ops=True, allow_scalar_outputs=True)
            _SESSIONS[self.env] = self
            _OWN_ENVS.add(self.env)
            self.active = True
        return self.env

    def adopt_env(self, shape_env: Any, fake_mode: Any = None) -> None:
        """Compute in the caller's own ShapeEnv (dynamo's, torch.export's): inputs carry its
        symbols, and results are expressions in them. Its symbols are the user's symbols."""
        if self.env is shape_env:
            return
        if self.env is not None:
            raise InputError("inputs carry symbols of two different ShapeEnvs; fxprop computes in one")
        self.env, self.active, self._fake_mode = shape_env, True, fake_mode
        # What the caller's ShapeEnv had assumed before: not this propagation's assumptions.
        self._assumed_before = (len(shape_env.guards), {id(a) for asserts in shape_env.deferred_runtime_asserts.values()
                                                        for a in asserts})
        _SESSIONS[shape_env] = self
        for symbol, bounds in shape_env.var_to_range.items():
            lower, upper = bounds.lower, bounds.upper
            if symbol.name.startswith("s") and symbol not in self.to_user:
                user = sympy.Symbol(symbol.name, integer=True, positive=True) if lower >= 1 else \
                    sympy.Symbol(symbol.name, integer=True, nonnegative=True) if lower >= 0 else \
                    sympy.Symbol(symbol.name, integer=True)
                self.to_user[symbol] = user
                self.infos[symbol] = SymbolInfo(user, lower if lower.is_finite else -sympy.oo,
                                                upper if upper.is_finite else sympy.oo)

    def bind_traced(self, shape: tuple, traced: Any) -> None:
        """Compute a TensorSpec given for a placeholder that torch.export traced as ``traced`` (a
        FakeTensor of export's ShapeEnv) in that ShapeEnv, with backed symbols as export makes them.

        A name at a dim export made dynamic becomes that dim's symbol (``x: (s0, 8)`` and
        ``TensorSpec(("B", 8))``: B is s0, in ``range_constraints`` already); any other name
        becomes a new backed symbol whose example value is the traced size (`_declare`).
        """
        self.adopt_env(traced.fake_mode.shape_env, traced.fake_mode)
        self.backed = True
        if len(shape) != traced.dim():
            return
        taken = {known.node.expr for _, known in self.by_name.values()}
        for dim, was in zip(shape, traced.shape):
            if type(dim) is int:
                continue
            expr = _parse(dim, shape) if isinstance(dim, str) else dim
            hint = was.node.hint if isinstance(was, torch.SymInt) else was
            if not isinstance(expr, sympy.Symbol):
                if len(expr.free_symbols) == 1 and isinstance(hint, int):  # "2*T" traced as 6: T's example is 3
                    name = next(iter(expr.free_symbols))
                    try:
                        solved = [v for v in sympy.solve(sympy.Eq(expr, hint), name) if v.is_Integer and v > 0]
                    except (NotImplementedError, ValueError, TypeError):
                        solved = []
                    if solved:
                        self._hints.setdefault(name.name, int(solved[0]))
                continue
            if expr.name in self.by_name:
                continue
            internal = was.node.expr if isinstance(was, torch.SymInt) else None
            if (isinstance(internal, sympy.Symbol) and internal in self.env.backed_var_to_val
                    and internal not in taken):
                symbol = _as_user_symbol(expr)
                self.by_name[symbol.name] = (symbol, was)
                self.to_user[internal] = symbol
                info = self.infos.get(internal)
                self.infos[internal] = SymbolInfo(symbol, info.lower if info else 1, info.upper if info else sympy.oo)
                taken.add(internal)
            elif isinstance(hint, int):
                self._hints.setdefault(expr.name, hint)

    @property
    def fake_mode(self):
        if self._fake_mode is None:
            from .torch_compat import FakeTensorMode
            self._fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.start())
        return self._fake_mode

    # user symbols
    def size(self, dim: Any, shape: tuple) -> Any:
        """A TensorSpec dim as what a meta tensor takes: an int or a SymInt."""
        if isinstance(dim, int):
            return dim
        expr = _parse(dim, shape) if isinstance(dim, str) else dim
        if isinstance(expr, sympy.Integer):
            return int(expr)
        internal = {}
        for symbol in expr.free_symbols:
            internal[symbol] = self._declare(symbol).node.expr
        env = self.start()
        return env.create_symintnode(expr.xreplace(internal), hint=None)

    def _declare(self, symbol: sympy.Symbol) -> torch.SymInt:
        known = self.by_name.get(symbol.name)
        if known is not None:
            return known[1]
        lower = 0 if (symbol.is_nonnegative and not symbol.is_positive) else 1
        symbol = _as_user_symbol(symbol)
        env = self.start()
        if self.backed:
            symint = self._backed_symint(self._hints.get(symbol.name, _DEFAULT_HINT))
        else:
            symint = env.create_unbacked_symint()
            torch_compat.constrain_size(env, symint.node.expr, lower)
        self.by_name[symbol.name] = (symbol, symint)
        self.to_user[symint.node.expr] = symbol
        self.infos[symint.node.expr] = SymbolInfo(symbol, lower, sympy.oo)
        return symint

    def _backed_symint(self, hint: int) -> torch.SymInt:
        """A new backed symbol of the adopted ShapeEnv, made the way torch.export makes an input's
        dynamic dim (``s0``, example value ``hint``). As in export, a size of 0 or 1 is
        specialized: the ShapeEnv ranges it from 2, ``range_constraints`` from the declared
        lower bound (`program_range`)."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
        probe = torch.empty(max(hint, 2), device="meta")
        fake = self.fake_mode.from_tensor(probe, symbolic_context=StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC], constraint_sizes=[None]))
        symint = fake.shape[0]
        expr = symint.node.expr
        # Its source is a constant of fxprop's, not an input path of the program: export leaves
        # guards on such symbols out of the program's input guards (the placeholders' values and
        # range_constraints state what the program takes).
        self.env.var_to_sources[expr] = [getattr(source, "base", source) for source in self.env.var_to_sources[expr]]
        self._made.add(expr)
        return symint

    # data-dependent symbols
    def fresh_size(self, upper: Any, lower: int = 0) -> torch.SymInt:
        """A new size no static pass can know: lower <= u <= upper (an int, a SymInt, or None: unbounded)."""
        from .torch_compat import _constrain_range_for_size
        env = self.start()
        symint = env.create_unbacked_symint()
        if upper is None:
            maxval, upper_expr = None, sympy.oo
        elif isinstance(upper, torch.SymInt):
            bound = env.bound_sympy(upper.node.expr).upper
            maxval = int(bound) if isinstance(bound, sympy.Integer) else None
            upper_expr = upper.node.expr
        else:
            maxval = upper_expr = int(upper)
        _constrain_range_for_size(symint, min=lower, max=maxval)
        self._born(symint.node.expr, lower, upper_expr, "size")
        return symint

    def fresh_value(self, dtype: torch.dtype) -> Any:
        """A new scalar read from a tensor's data (``.item()``)."""
        env = self.start()
        if dtype.is_floating_point or dtype.is_complex:
            value = env.create_unbacked_symfloat()
        elif dtype is torch.bool:
            value = env.create_unbacked_symbool()
        else:
            value = env.create_unbacked_symint()
        self._born(value.node.expr, -sympy.oo, sympy.oo, "value")
        return value

    def _born(self, internal: sympy.Symbol, lower: Any, upper: Any, kind: str) -> None:
        taken = {info.symbol.name for info in self.infos.values()}
        number = sum(1 for info in self.infos.values() if info.kind != "input")
        while f"u{number}" in taken:
            number += 1
        symbol = sympy.Symbol(f"u{number}", integer=True) if kind != "value" or internal.is_integer else \
            sympy.Symbol(f"u{number}")
        self.to_user[internal] = symbol
        self.infos[internal] = SymbolInfo(symbol, lower, upper, None, kind)
        self.fresh.append(internal)

    def symbol_count(self) -> int:
        """How many symbols the ShapeEnv holds (a call that changes it created some)."""
        return len(self.env.var_to_range) if self.env is not None else 0

    def claim(self, node_name: str) -> bool:
        """Record ``node_name`` as the defining node of the symbols created since the last claim;
        whether there were any."""
        created = bool(self.fresh)
        if self.env is not None and self.env.pending_fresh_unbacked_symbols and self.env not in _OWN_ENVS:
            # every unbacked symbol the call created (fxprop's rules' and torch's kernels' own),
            # bound to the node in `adopt`, as torch.export binds them
            created = True
            self._bound.setdefault(node_name, []).extend(self.env.pending_fresh_unbacked_symbols)
            self.env.pending_fresh_unbacked_symbols.clear()
        for internal in self.fresh:
            info = self.infos[internal]
            self.infos[internal] = SymbolInfo(info.symbol, self.user(info.lower), self.user(info.upper),
                                              node_name, info.kind)
        self.fresh.clear()
        return created

    # reading results
    def user(self, expr: Any) -> Any:
        """An internal expression (or SymInt) in the user's symbols, simplified, in plain sympy."""
        if isinstance(expr, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            expr = expr.node.expr
        if not isinstance(expr, sympy.Basic):
            return expr
        if self.env is not None:
            expr = self.env.simplify(expr)
        expr = _plain(expr).xreplace(self.to_user)
        if isinstance(expr, sympy.Integer):
            return int(expr)
        return expr

    def assumptions(self) -> list:
        """What propagation had to assume, as sympy relations in the user's symbols."""
        if self.env is None:
            return []
        found: list = []
        guards_before, asserts_before = self._assumed_before
        raw = [a.expr for asserts in self.env.deferred_runtime_asserts.values() for a in asserts
               if id(a) not in asserts_before]
        for expr in [*raw, *(guard.expr for guard in self.env.guards[guards_before:])]:
            relation = _small(_plain(expr).xreplace(self.to_user))
            if relation is not sympy.true and relation not in found:
                found.append(relation)
        return found

    def symbols(self) -> dict:
        return {info.symbol: info for info in self.infos.values()}

    def check_size(self, value: Any) -> None:
        """Refuse results whose expressions grew past `MAX_EXPR_OPS`."""
        from .containers import map_structure

        def check(tensor: torch.Tensor) -> None:
            for dim in tensor.shape:
                if isinstance(dim, torch.SymInt):
                    self.check_expr(dim.node.expr)
        if isinstance(value, torch.SymInt):
            self.check_expr(value.node.expr)
        map_structure(check, value)

    def check_expr(self, expr: sympy.Expr) -> None:
        if expr in self._sizes_checked:
            return
        ops = sympy.count_ops(expr)
        if ops > MAX_EXPR_OPS:
            raise UnsupportedError(
                f"symbolic size expression too large: {ops} operations, over the cap of "
                f"fxprop.symbolic.MAX_EXPR_OPS = {MAX_EXPR_OPS} (expression starts {str(self.user(expr))[:120]}...)")
        self._sizes_checked.add(expr)

    def readable(self, text: str) -> str:
        """``text`` with internal symbol names (u0, s1) replaced by the user's."""
        names = {str(internal): str(user) for internal, user in self.to_user.items()}
        return _INTERNAL_NAME.sub(lambda match: names.get(match.group(0), match.group(0)), text)

    def adopt(self, staged: dict) -> None:
        """Make every FakeTensor of the run belong to the one FakeTensorMode that holds the ShapeEnv."""
        from .torch_compat import FakeTensor, pytree
        tree_leaves = pytree.tree_leaves
        mode = self.fake_mode
        for entry in staged.values():
            for leaf in tree_leaves(entry[0]):
                if isinstance(leaf, FakeTensor):
                    leaf.fake_mode = mode
        if self.env not in _OWN_ENVS:
            self._bind_unbacked(staged)

    def _bind_unbacked(self, staged: dict) -> None:
        """In a caller's ShapeEnv (torch.export's, dynamo's), write each node's
        ``meta["unbacked_bindings"]`` as export does: the unbacked symbols its call created, and
        where in its value they are (``{u0: (CallMethodKey('size'), SequenceKey(0))}``). Its
        re-traces (``run_decompositions``) and serializer read them."""
        from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings
        env = self.env
        for node, entry in staged.items():
            created = self._bound.get(node.name)
            bindings = None
            if created:
                env.pending_fresh_unbacked_symbols[:] = created
                try:
                    bindings = compute_unbacked_bindings(env, entry[0], peek=True)
                finally:
                    env.pending_fresh_unbacked_symbols.clear()
            if bindings:
                node.meta["unbacked_bindings"] = bindings
            else:
                node.meta.pop("unbacked_bindings", None)
        self._bound.clear()

    def program_range(self, symbol: sympy.Symbol) -> tuple:
        """The ``(lower, upper)`` an ExportedProgram's ``range_constraints`` gives ``symbol``:
        for a user symbol fxprop made backed, its declared bounds (export's own convention: its
        ShapeEnv starts sizes at 2); for any other, its ShapeEnv's range."""
        bounds = self.env.var_to_range[symbol]
        if symbol in self._made and bounds.lower <= 2:  # 2: 0/1 specialization, not a bound it needed
            return self.infos[symbol].lower, bounds.upper
        return bounds.lower, bounds.upper

    def summary(self) -> dict:
        return {"symbols": self.symbols(), "assumptions": self.assumptions()}


def _small(relation: sympy.Basic) -> sympy.Basic:
    """One canonical, small form per relation: ``Eq(N, 4*floor(N/4))`` as ``Eq(Mod(N, 4), 0)``,
    ``3 <= H`` as ``H >= 3`` (numbers on the right)."""
    if isinstance(relation, (sympy.And, sympy.Or)):
        return relation.func(*(_small(arg) for arg in relation.args))
    if isinstance(relation, sympy.core.relational.Relational) and relation.lhs.is_number and not relation.rhs.is_number:
        relation = relation.reversed
    if isinstance(relation, sympy.Eq):
        for whole, part in ((relation.lhs, relation.rhs), (relation.rhs, relation.lhs)):
            factor, rest = part.as_coeff_Mul()
            if (isinstance(factor, sympy.Integer) and factor > 1 and isinstance(rest, sympy.floor)
                    and sympy.expand(rest.args[0] * factor - whole) == 0):
                return sympy.Eq(sympy.Mod(whole, factor), 0)
    return relation


def _plain(expr: sympy.Basic) -> sympy.Basic:
    """torch's integer functions (FloorDiv, PythonMod, ...) as plain sympy."""
    from .torch_compat import sympy_functions as F
    replacements = {
        "FloorDiv": lambda a, b: sympy.floor(a / b),
        "CleanDiv": lambda a, b: a / b,
        "CeilDiv": lambda a, b: sympy.ceiling(a / b),
        "PythonMod": sympy.Mod,
        "Mod": sympy.Mod,
        "IntTrueDiv": lambda a, b: a / b,
        "FloatTrueDiv": lambda a, b: a / b,
        "TruncToInt": lambda a: sympy.sign(a) * sympy.floor(abs(a)),
        "FloorToInt": sympy.floor,
        "CeilToInt": sympy.ceiling,
        "Max": sympy.Max,
        "Min": sympy.Min,
        "ToFloat": lambda a: a,
        "Identity": lambda a: a,
    }
    for name, fn in replacements.items():
        cls = getattr(F, name, None)
        if cls is not None and expr.has(cls):
            expr = expr.replace(lambda e, cls=cls: isinstance(e, cls), lambda e, fn=fn: fn(*e.args))
    return expr


# --- the session in progress ------------------------------------------------------------

_local = threading.local()
_SESSIONS: "weakref.WeakKeyDictionary[Any, SymbolicSession]" = weakref.WeakKeyDictionary()  # ShapeEnv -> session
_OWN_ENVS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the ShapeEnvs sessions made (not a caller's)
_DEFAULT_HINT = 8  # a new backed symbol's example value where the traced program has none
_INACTIVE = SymbolicSession()
_NO_DISPATCHER = contextlib.nullcontext()


def current() -> SymbolicSession:
    """The symbolic session of the `propagate` call in progress (an inactive one outside any)."""
    return getattr(_local, "session", None) or _INACTIVE


@contextlib.contextmanager
def scope(session: SymbolicSession):
    outer = getattr(_local, "session", None)
    _local.session = session
    try:
        yield session
    finally:
        _local.session = outer


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
        from .torch_compat import pytree
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
    from .torch_compat import enable_python_dispatcher
    return enable_python_dispatcher()


def dispatcher(session: SymbolicSession):
    """torch's python dispatcher while symbols are live: it holds the symbolic meta kernels."""
    if not session.active:
        return _NO_DISPATCHER
    from .torch_compat import enable_python_dispatcher
    return enable_python_dispatcher()


def traced_example(placeholder: torch.fx.Node, value: Any) -> Any:
    """The input a placeholder stands for. A graph from torch.compile with ``dynamic=True`` is
    handed real tensors whose placeholders were traced with symbolic sizes (``example_value``,
    FakeTensors of dynamo's ShapeEnv): the traced sizes are the ones the graph is valid for,
    so they are propagated, as long as the real tensor is one of their instances.

    A TensorSpec with symbolic dims for a placeholder torch.export traced (``meta["val"]``, a
    FakeTensor of export's ShapeEnv, not one of fxprop's own) is computed in that ShapeEnv, its
    names bound to the traced symbols (`SymbolicSession.bind_traced`)."""
    from .torch_compat import FakeTensor
    if _is_symbolic_spec(value):
        exported = placeholder.meta.get("val")
        if (isinstance(exported, FakeTensor) and exported.fake_mode.shape_env is not None
                and exported.fake_mode.shape_env not in _OWN_ENVS):
            current().bind_traced(tuple(value.shape), exported)
        return value
    traced = placeholder.meta.get("example_value")
    if not (isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and isinstance(traced, FakeTensor)):
        return value
    sizes = (*traced.shape, *traced.stride())
    if not any(isinstance(size, torch.SymInt) for size in sizes) or traced.dtype != value.dtype:
        return value
    hints = tuple(size.node.hint if isinstance(size, torch.SymInt) else size for size in sizes)
    if hints != (*value.shape, *value.stride()):
        return value
    return traced


def _is_symbolic_spec(value: Any) -> bool:
    from .specs import TensorSpec
    return isinstance(value, TensorSpec) and any(type(dim) is not int for dim in value.shape)


def spec_to_meta(shape: tuple, stride: tuple | None, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor for a TensorSpec with symbolic dims, in the session in progress."""
    session = current()
    if session is _INACTIVE:
        raise InputError(f"a TensorSpec with symbolic dims {shape} can only be used as a propagate input")
    sizes = [session.size(dim, shape) for dim in shape]
    if stride is None:
        stride = contiguous_strides(sizes)
    return torch.empty_strided(sizes, stride, dtype=dtype, device="meta")


def has_symbolic(values: Iterable[Any]) -> bool:
    for value in values:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
        if isinstance(value, (list, tuple)) and has_symbolic(value):
            return True
    return False


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


# --- reading results --------------------------------------------------------------------

def shape_of(node: Any) -> Any:
    """A node's shape as a tuple of ints and sympy expressions in the user's own symbols.

    Multi-output nodes give a tuple of such tuples; a node holding a python size (``x.size(0)``,
    ``operator.mul``) gives its expression; a torch.Size gives a tuple.
    """
    if "val" not in node.meta:
        raise InputError(f"node %{node.name} has no propagated value; run fxprop.propagate first")
    return user_shape(node.meta["val"])


def user_shape(value: Any) -> Any:
    """`shape_of` for a value rather than a node: sizes in the user's own symbols."""
    return _shape(value)


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(_user(dim) for dim in value.shape)
    if isinstance(value, torch.Size):
        return tuple(_user(dim) for dim in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _user(value)
    if isinstance(value, (list, tuple)):
        return tuple(_shape(item) for item in value)
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return value


def _user(dim: Any) -> Any:
    if isinstance(dim, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        session = _SESSIONS.get(dim.node.shape_env)
        if session is not None:
            return session.user(dim.node.expr)
        return _plain(dim.node.expr)
    return dim


__all__ = ["MAX_EXPR_OPS", "SymbolInfo", "broadcast_shapes", "definitely_equal", "resolve", "shape_of",
           "user_symbol"]


def _example_size(size: Any) -> int:
    if not isinstance(size, torch.SymInt):
        return size
    hint = size.node.hint
    return hint if isinstance(hint, int) else 2


def host_sample(tensor: torch.Tensor) -> torch.Tensor:
    """A small CPU tensor standing in for a symbolic one where a host check needs a real tensor.

    A symbolic dim takes its symbol's example value where it has one (dynamo's and export's
    backed symbols), so that it compares with other tensors' dims as the real ones do (an SDPA
    mask's sequence length against the query's); an unbacked one becomes 2. Over 2**24 elements,
    every dim is at most 2. The last dim keeps whether its stride is 1.
    """
    sizes = [_example_size(size) for size in tensor.shape]
    if math.prod(sizes) > 1 << 24:
        sizes = [min(size, 2) for size in sizes]
    sample = torch.empty(sizes, dtype=tensor.dtype, device="cpu")
    if tensor.dim() >= 2 and not definitely_equal(tensor.stride()[-1], 1):
        sample = torch.empty([*sizes[:-2], sizes[-1], sizes[-2]], dtype=tensor.dtype, device="cpu").transpose(-1, -2)
    return sample
