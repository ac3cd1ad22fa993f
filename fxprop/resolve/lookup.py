"""`fxprop.lookup`: which rule handles a target, or exactly which one handles a call."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import ambient, symbolic
from ..call import Call
from .call_graphs import call_graph
from ..engine.session import Session
from ..engine.propagation import propagate
from ..kinds import Rule
from .order import resolve_call, static_rule
from ..engine.inputs import to_internal
from ..torch_compat import HigherOrderOperator, without_ambient_modes


def lookup(target: Any, *args: Any, **kwargs: Any) -> Rule:
    """The rule that handles ``target``; with the call's values, exactly the rule `propagate` applies.

    ``target`` is what an FX node holds: an aten or custom op (overload or packet), a
    higher-order operator, a torch callable, a Tensor method name, or a module (or module type)
    for call_module nodes. Without arguments, `Rule.kinds` lists every kind the target may
    resolve to when that depends on the call (e.g. a symbolic input refuses the fallback).
    With arguments (tensors real, meta or fake, `TensorSpec`s, python values), the rule is the
    one the engine applies to that call. A composite (a torch-level function, a module with no
    rule of its own) runs torch's own code; its kind is the costliest kind of the ops it reaches,
    which only running it on meta tensors tells, so a composite's lookup with arguments
    propagates the one call.

    >>> import torch, fxprop
    >>> fxprop.lookup(torch.ops.aten.mm.default).kind
    <Kind.PYTHON: 'python'>
    >>> x = fxprop.TensorSpec((2, 3), device="cuda:0")
    >>> fxprop.lookup("get_device", x).kind
    <Kind.DEVICE: 'device'>
    """
    if not args and not kwargs or isinstance(target, HigherOrderOperator):
        return static_rule(target)  # a higher-order op's rule takes its subgraphs whatever the values
    if static_rule(target).composite or isinstance(target, torch.nn.Module):
        return _propagated(target, args, kwargs)
    session = Session(fallback_limit_bytes=0)  # resolution reads the known values of the call's session
    with without_ambient_modes(), ambient.entered(session=session, symbols=symbolic.SymbolicSession()):
        internal_args = tuple(to_internal(a, f"argument {i}", session.real_values) for i, a in enumerate(args))
        internal_kwargs = {k: to_internal(v, f"argument {k!r}", session.real_values) for k, v in kwargs.items()}
        return resolve_call(Call(target, internal_args, internal_kwargs)).rule


def _propagated(target: Any, args: tuple, kwargs: dict) -> Rule:
    gm, tensors = call_graph(target, args, kwargs)
    propagate(gm, *tensors, cache=False)
    node = next(node for node in gm.graph.nodes if node.op.startswith("call"))
    provenance = node.meta["fxprop"]
    rule = static_rule(target)
    return Rule(provenance.kind, provenance.rule, rule.fn, device_rule=provenance.device_rule,
                composite=rule.composite)
