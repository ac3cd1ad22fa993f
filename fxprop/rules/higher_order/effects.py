"""Functionalized mutation and effects: ``auto_functionalized``, ``with_effects`` and ``print``."""
from __future__ import annotations

import _string
import string
from typing import Any, Callable

import torch

from ...engine import session as context
from ... import symbolic
from ...devices import default_device, device_of, place, tag
from ...call import Call, tensors_in
from ...errors import PropagationError, UnsupportedError
from ...resolve.registry import python_rule, rule, target_name
from ...torch_compat import (HigherOrderOperator, OpOverload, auto_functionalized_kernels, check,
                             functionalized_hop_call, pytree, schema_of, storage_key)
from .common import fresh

aten = torch.ops.aten
higher_order = torch.ops.higher_order


@rule(higher_order.auto_functionalized)
def auto_functionalized(_mutable_op, /, **kwargs):
    """``_mutable_op`` on clones of the arguments it mutates: returns its results, then the clones."""
    check(isinstance(_mutable_op, OpOverload), lambda: f"auto_functionalized: expected an op, got {_mutable_op!r}")
    dense, _ = auto_functionalized_kernels()
    return dense(_mutable_op, _only_clone_these_tensors=None, **kwargs)


@rule(higher_order.auto_functionalized_v2)
def auto_functionalized_v2(_mutable_op, /, **kwargs):
    """``_mutable_op`` on views regenerated from clones of the mutated arguments' bases
    (``_all_bases``): returns its results, then the cloned bases. A higher-order op that mutates
    its inputs refuses to run where autograd records it (an input requiring grad, grad enabled)."""
    if isinstance(_mutable_op, OpOverload):
        _, dense = auto_functionalized_kernels()
        return dense(_mutable_op, _only_clone_these_bases=None, **kwargs)
    check(not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors_in((), kwargs))),
          lambda: f"auto_functionalized_v2 of {target_name(_mutable_op)}: the higher-order op does not support "
                  "training with in-place input or buffer mutations")
    args, keywords, cloned_bases = functionalized_hop_call(kwargs)
    devices = {storage_key(clone): device_of(base) for clone, base in zip(cloned_bases, kwargs.get("_all_bases", []))}
    for tensor in [*cloned_bases, *tensors_in(args, keywords)]:  # the clones and the views regenerated from them
        if storage_key(tensor) in devices:
            tag(tensor, devices[storage_key(tensor)])
    out = _higher_order_rule(_mutable_op, "auto_functionalized_v2")(*args, **keywords)
    return (*out, *cloned_bases) if isinstance(out, (tuple, list)) else (out, *cloned_bases)


def _higher_order_rule(op: Any, wrapper: str) -> Callable:
    """The python rule of a higher-order op that another one (``wrapper``) calls."""
    own = python_rule(op) if isinstance(op, HigherOrderOperator) else None
    if own is None:
        raise UnsupportedError(f"{wrapper} of {target_name(op)}: no rule for it")
    return own.fn


@rule(higher_order.with_effects)
def with_effects(token, op, *args, **kwargs):
    """``(new_token, *op(*args, **kwargs))``: an op with side effects, ordered by a token (an empty
    float tensor on the default device). An op that returns nothing is not run."""
    out = None
    if isinstance(op, HigherOrderOperator):
        out = _higher_order_rule(op, "with_effects")(*args, **kwargs)
    elif not isinstance(op, OpOverload):
        raise UnsupportedError(f"with_effects of {op!r}: only ops are supported")
    elif schema_of(op).returns:
        placement = place(Call(op, args, kwargs))
        if placement.has_host_value:
            out = placement.host_value
        else:
            out = placement.target(*placement.args, **placement.kwargs)
            if placement.device is not None:
                out = pytree.tree_map_only(torch.Tensor, lambda t: tag(t, placement.device), out)
    new_token = fresh((0,), (1,), torch.float32, default_device())
    return (new_token, *out) if isinstance(out, tuple) else (new_token, out)


@rule(higher_order.print)
def print_(format_str, *args, **kwargs):
    """``print(format_str.format(*args, **kwargs))``: returns None. Nothing is printed: the string is
    formatted once, fields resolved on the propagated values and each tensor formatted as a host
    stand-in (zeros of its size and dtype), so that a field, attribute, index or format spec that
    real formatting refuses is refused with its error. Attributes a propagated value need not share
    with the real one (``{x.grad_fn}``, ``{x.device.index}``), tensors of symbolic sizes or too many
    elements to stand in for, symbolic numbers, and values the format reads (``{x:c}`` of a large
    number) are taken on trust."""
    if not isinstance(format_str, str):
        raise PropagationError(f"print: the format must be a string, got {type(format_str).__name__}",
                               error_type=AssertionError)
    with context.on_host():
        try:
            _StandInFormatter().vformat(format_str, args, kwargs)
        except _TakenOnTrust:
            pass
        except Exception as error:  # noqa: BLE001 - whatever str.format raises is the real print's refusal
            raise PropagationError(f"print: {error}", error_type=type(error)) from None
    return None


class _TakenOnTrust(Exception):
    """A field whose real formatting the propagated values cannot tell."""


class _StandInFormatter(string.Formatter):
    STAND_IN_LIMIT = 1 << 16  # elements
    # what a propagated tensor shares with the real one; anything else Tensor has is taken on trust
    FAITHFUL_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "layout", "requires_grad", "is_sparse", "is_quantized",
                                     "T", "mT", "H", "mH", "real", "imag"})

    def get_field(self, field_name, args, kwargs):
        first, rest = _string.formatter_field_name_split(field_name)  # as str.format splits it
        value = self.get_value(first, args, kwargs)
        for is_attribute, key in rest:
            if not is_attribute:
                value = value[key]
            elif isinstance(value, torch.Tensor) and key.startswith("_fxprop"):
                raise AttributeError(f"'Tensor' object has no attribute '{key}'")  # fxprop's own tag
            elif isinstance(value, torch.Tensor) and hasattr(torch.Tensor, key) and key not in self.FAITHFUL_ATTRIBUTES:
                raise _TakenOnTrust
            else:
                value = getattr(value, key)
        return value, first

    def format_field(self, value, format_spec):
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _TakenOnTrust
        if isinstance(value, torch.Tensor):
            if symbolic.has_symbolic([value]) or value.numel() > self.STAND_IN_LIMIT:
                raise _TakenOnTrust
            on = "meta" if device_of(value).type == "meta" else "cpu"  # a meta tensor formats as itself
            stand_in = torch.zeros(value.shape, dtype=value.dtype, device=on)
            # Tensor.__format__ formats only a plain tensor as a number
            if isinstance(value, torch.nn.Parameter):
                stand_in = torch.nn.Parameter(stand_in, value.requires_grad)
            value = stand_in
        elif any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in pytree.tree_leaves(value)):
            raise _TakenOnTrust
        return super().format_field(value, format_spec)
