"""`SymbolicSession`: one propagation's symbols, the ShapeEnv they live in, and what was assumed."""
from __future__ import annotations

import contextlib
import re
import weakref
from typing import Any

import sympy
import torch

from .. import torch_compat
from ..errors import InputError, InternalError, UnsupportedError
from . import deciding
from .dims import SymbolInfo, _as_user_symbol, _parse

MAX_EXPR_OPS = 256
"""The largest expression (in sympy operations) fxprop keeps; a bigger one raises."""


_INTERNAL_NAME = re.compile(r"\b[us]\d+\b")


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
        self._held_apart: list = []  # decisions taken in a caller's ShapeEnv, kept out of it
        self._decided: dict = {}  # relation -> (facts then, what `decide` found)
        self.memos: dict[str, dict] = {}  # facts of sizes, by memo and key (`sizes.propagation_memo`)

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

    def decisions_kept_from_caller(self):
        """While propagating in a caller's ShapeEnv, keep every decision out of it: a backend's or a
        pass's propagation must leave the compiled program's guards as they were (each added guard
        would be a recompile, or a dynamic size specialized). The decisions become this run's
        assumptions. fxprop's own ShapeEnv keeps them as guards, which later decisions build on,
        also where the thread suppresses guards (a propagation nested in one in a caller's ShapeEnv)."""
        if self.env is None or self.env in _OWN_ENVS:
            return torch_compat.decisions_installed()
        return self._kept_from_caller()

    @contextlib.contextmanager
    def _kept_from_caller(self):
        """`decisions_kept_from_caller` in a caller's ShapeEnv, whose pending fresh symbols are also
        left as the run found them: each node claims the unbacked symbols its call created (`claim`),
        and a call that fails after creating one would leave it pending there, which torch's next
        trace in that ShapeEnv refuses (AOT autograd's, after a backend's propagation failed:
        PendingUnbackedSymbolNotFound, a symbol its first op did not return)."""
        pending = list(self.env.pending_fresh_unbacked_symbols)
        try:
            with torch_compat.decisions_held_apart(self.env, self._held_apart):
                yield
        finally:
            self.env.pending_fresh_unbacked_symbols[:] = pending

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
            from ..torch_compat import FakeTensorMode
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
        from ..torch_compat import _constrain_range_for_size
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

    def decide(self, relation: Any) -> bool | None:
        """Whether ``relation`` (in the ShapeEnv's symbols) holds for every value of its sizes
        within their ranges that satisfies what the ShapeEnv holds (its guards, its deferred
        runtime asserts, its replacements, and what this run decided apart from a caller's ShapeEnv):
        True, False, or None where it depends on the values. Asked where torch's static evaluation
        leaves a relation open (`deciding`).

        Where that depends on the values of data-dependent sizes (``nonzero``'s ``u0``), torch's
        size-oblivious rule decides: a data-dependent size is taken to be neither 0 nor 1, the
        generic path a real kernel takes for any larger size (``expand`` does not broadcast a
        ``u0``, ``select(0)`` of ``u0`` rows is in range). The decision is listed with the run's
        assumptions (in fxprop's own ShapeEnv also asserted, so that later decisions build on it):
        the result is right wherever it holds."""
        decided = self._over_the_integers(relation)
        if decided is None:
            decided = self._decide_size_obliviously(relation)
        return decided

    def refutes(self, fact: Any) -> bool:
        """Whether no value of the sizes that satisfies what the ShapeEnv holds can meet ``fact``
        (a runtime assert about to be deferred): the integer reasoning of `decide` alone, which
        assumes and asserts nothing."""
        return self._over_the_integers(fact) is False

    def _facts(self) -> list:
        env = self.env
        facts = [_plain(guard.expr) for guard in env.guards]
        facts += [_plain(entry.expr) for entries in env.deferred_runtime_asserts.values() for entry in entries]
        facts += [sympy.Eq(symbol, _plain(value)) for symbol, value in env.replacements.items()]
        return facts + [_plain(decision) for decision in self._held_apart]

    def _bounds(self, symbol: sympy.Symbol) -> tuple:
        found = self.env.var_to_range.get(symbol)
        return (found.lower, found.upper) if found is not None else (None, None)

    def _over_the_integers(self, relation: Any) -> bool | None:
        env = self.env
        facts_now = (len(env.guards), env.num_deferred_runtime_asserts, len(env.replacements), len(self._held_apart))
        known = self._decided.get(relation)
        if known is not None and (known[1] is not None or known[0] == facts_now):
            return known[1]  # a decision stays true as facts grow; an open relation may close
        decided = deciding.decide(_plain(env.simplify(relation)), self._bounds, self._facts())
        self._decided[relation] = (facts_now, decided)
        return decided

    def _decide_size_obliviously(self, relation: Any) -> bool | None:
        env = self.env
        oblivious = {symbol for symbol in relation.free_symbols  # an input's named dim is no data-dependent size
                     if symbol in env.size_like and torch_compat.is_unbacked_symbol(symbol)
                     and getattr(self.infos.get(symbol), "kind", None) != "input"}
        if not oblivious:
            return None

        def at_least_two(symbol: sympy.Symbol) -> tuple:
            lower, upper = self._bounds(symbol)
            if symbol in oblivious:
                lower = 2 if lower is None or lower < 2 else lower
            return lower, upper
        decided = deciding.decide(_plain(env.simplify(relation)), at_least_two, self._facts())
        if decided is None:
            return None
        assumed = relation if decided else sympy.Not(relation)
        if env in _OWN_ENVS:
            env.guard_or_defer_runtime_assert(assumed, "fxprop: size-oblivious, as torch decides a data-dependent size")
        else:  # the caller's compiled program must not assert what its kernels only took for granted
            self._held_apart.append(assumed)
        return decided

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
        for expr in [*raw, *(guard.expr for guard in self.env.guards[guards_before:]), *self._held_apart]:
            relation = _small(_plain(expr).xreplace(self.to_user))
            if relation is not sympy.true and relation not in found:
                found.append(relation)
        return found

    def symbols(self) -> dict:
        return {info.symbol: info for info in self.infos.values()}

    def check_size(self, value: Any) -> None:
        """Refuse results whose expressions grew past `MAX_EXPR_OPS`."""
        from ..torch_compat import pytree
        if isinstance(value, torch.SymInt):
            self.check_expr(torch_compat.size_expression(value))
        for tensor in pytree.tree_leaves(value):
            if isinstance(tensor, torch.Tensor):
                for dim in tensor.shape:
                    if isinstance(dim, torch.SymInt):
                        self.check_expr(torch_compat.size_expression(dim))

    def check_expr(self, expr: sympy.Expr) -> None:
        if expr in self._sizes_checked:
            return
        ops = sympy.count_ops(expr)
        if ops > MAX_EXPR_OPS:
            raise UnsupportedError(
                f"symbolic size expression too large: {ops} operations, over the cap of "
                f"fxprop.symbolic.session.MAX_EXPR_OPS = {MAX_EXPR_OPS} (expression starts {str(self.user(expr))[:120]}...)")
        self._sizes_checked.add(expr)

    def readable(self, text: str) -> str:
        """``text`` with internal symbol names (u0, s1) replaced by the user's."""
        names = {str(internal): str(user) for internal, user in self.to_user.items()}
        return _INTERNAL_NAME.sub(lambda match: names.get(match.group(0), match.group(0)), text)

    def adopt(self, staged: dict) -> None:
        """Make every FakeTensor of the run belong to the one FakeTensorMode that holds the ShapeEnv."""
        from ..torch_compat import FakeTensor, pytree
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
        pending = list(env.pending_fresh_unbacked_symbols)  # the caller's, left as they were
        for node, entry in staged.items():
            created = self._bound.get(node.name)
            bindings = None
            if created:
                env.pending_fresh_unbacked_symbols[:] = created
                try:
                    bindings = compute_unbacked_bindings(env, entry[0], peek=True)
                finally:
                    env.pending_fresh_unbacked_symbols[:] = pending
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


_INACTIVE = SymbolicSession()  # the session outside any propagation: it holds no symbols


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
    from ..torch_compat import sympy_functions as F
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


_SESSIONS: "weakref.WeakKeyDictionary[Any, SymbolicSession]" = weakref.WeakKeyDictionary()  # ShapeEnv -> session


_OWN_ENVS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the ShapeEnvs sessions made (not a caller's)


def is_callers_env(shape_env: Any) -> bool:
    """Whether ``shape_env`` is a caller's (dynamo's, export's) rather than one fxprop made."""
    return shape_env is not None and shape_env not in _OWN_ENVS


_DEFAULT_HINT = 8  # a new backed symbol's example value where the traced program has none
