"""The user's symbols: dims given as names, strings of a strict grammar, or sympy expressions."""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ..errors import InputError


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
            left, right = build(node.left), build(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right.is_zero:
                raise refuse("it divides by zero")
            return _OPERATORS[type(node.op)](left, right)
        raise refuse(f"{type(node).__name__} is not allowed")

    expression = build(tree.body)
    if expression.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        raise refuse("it divides by zero")
    return expression


def _as_user_symbol(symbol: sympy.Symbol) -> sympy.Symbol:
    if symbol.is_integer is None and symbol.is_positive is None and symbol.is_nonnegative is None:
        return user_symbol(symbol.name)  # a plain Symbol("B"): sizes are positive integers
    return symbol
