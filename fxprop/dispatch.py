"""Running ops on meta tensors with fxprop's rules in charge of every aten op they reach.

`RuleDispatch` is a TorchDispatchMode: autograd runs above it (so ``requires_grad`` comes out
as torch computes it), and each aten overload that arrives is resolved by
`fxprop.rules.shape_rule` and run as a python rule, a meta kernel, a decomposition or the
host fallback. What each node needed is noted in a `NodeRecord`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._python_dispatch import TorchDispatchMode

from . import symbolic
from .context import Session, swap_session
from .devices import META
from .rules import elementwise_layout
from .rules.fallback import run_on_host
from .rules.registry import Kind, Rule, decomposition_for, shape_rule


class RuleDispatch(TorchDispatchMode):
    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self.symbols = symbolic.current()
        self._outer_sessions: list[Session | None] = []

    def __enter__(self):
        self._outer_sessions.append(swap_session(self.session))
        return super().__enter__()

    def __exit__(self, *exc):
        swap_session(self._outer_sessions.pop())
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args, kwargs = _onto_meta(args, kwargs or {})
        if self.symbols.active:
            return self.apply_symbolic(func, args, kwargs)
        return self.apply(func, shape_rule(func), args, kwargs)

    def apply_symbolic(self, func, args: tuple, kwargs: dict) -> Any:
        """Once sizes are symbolic: fxprop's broadcasting for pointwise ops, torch's python
        dispatcher (it holds the symbolic meta kernels), and a clear error where a kernel cannot
        decide a size condition."""
        if torch.Tag.pointwise in func.tags and not func._schema.is_mutable:
            args, kwargs = symbolic.broadcast_inputs(args, kwargs)
        try:
            with symbolic.python_dispatcher():
                return self.apply(func, shape_rule(func), args, kwargs)
        except GuardOnDataDependentSymNode as error:
            raise symbolic.undecidable(func, args, kwargs, error) from error

    def apply(self, func, rule: Rule, args: tuple, kwargs: dict) -> Any:
        record = self.session.record
        if rule.kind is Kind.META:
            try:
                result = func(*args, **kwargs)
            except NotImplementedError:
                decomposition = decomposition_for(func)
                rule = (Rule(Kind.DECOMPOSITION, rule.name, decomposition) if decomposition is not None
                        else Rule(Kind.FALLBACK, rule.name))
            else:
                record.note(Kind.META, rule.name)
                return elementwise_layout.relayout(func, args, kwargs, result)
        if rule.kind is Kind.PYTHON:
            record.note(Kind.PYTHON, rule.name)
            return elementwise_layout.relayout(func, args, kwargs, rule.fn(*args, **kwargs))
        if rule.kind is Kind.DECOMPOSITION:
            record.note(Kind.DECOMPOSITION, rule.name)
            with self:
                result = rule.fn(*args, **kwargs)
            return elementwise_layout.relayout(func, args, kwargs, result)
        if self.symbols.active:
            symbolic.refuse_fallback(func, args, kwargs)
        result, used = run_on_host(func, args, kwargs, limit_bytes=self.session.fallback_limit_bytes,
                                   real_values=self.session.real_values)
        record.note(Kind.FALLBACK, rule.name, used)
        return result


def _onto_meta(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Device arguments become "meta" and pinning is dropped: results are computed on meta."""
    if any(isinstance(a, torch.device) for a in args):
        args = tuple(META if isinstance(a, torch.device) else a for a in args)
    device = kwargs.get("device")
    if (device is not None and device != META) or kwargs.get("pin_memory"):
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = META
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
    return args, kwargs
