"""Ops that stand for a plain call of their subgraph: grad-mode regions, ``wrap``, activation
checkpointing, ``invoke_subgraph``, hints, autograd Functions and ``flat_apply``."""
from __future__ import annotations


import torch

from ...resolve.registry import rule
from ...torch_compat import check, flat_apply_kernel
from .common import describe, fresh_like, through_autograd_function, walk

aten = torch.ops.aten
higher_order = torch.ops.higher_order


@rule(higher_order.wrap_with_set_grad_enabled)
def wrap_with_set_grad_enabled(enable_grad, wrapped_func, *args):
    """``with torch.set_grad_enabled(enable_grad): wrapped_func(*args)``."""
    with torch.set_grad_enabled(bool(enable_grad)):
        return walk(wrapped_func, args)


@rule(higher_order.wrap)
def wrap(func, *args):
    """``func(*args)``."""
    return walk(func, args)


@rule(higher_order.tag_activation_checkpoint, higher_order.wrap_activation_checkpoint)
def activation_checkpoint(function, *args, **checkpoint_options):
    """``torch.utils.checkpoint.checkpoint(function, *args)``: the forward runs as a plain call (the
    options only decide what backward recomputes)."""
    return walk(function, args)


@rule(higher_order.invoke_subgraph)
def invoke_subgraph(subgraph, identifier, *operands):
    """``subgraph(*operands)``: a region compiled once and called from several places."""
    return walk(getattr(subgraph, "subgraph", subgraph), operands)


@rule(higher_order.hints_wrapper)
def hints_wrapper(body_fn, args, kwargs, hints):
    """``body_fn(*args, **kwargs)``; the hints are for the compiler."""
    check(not kwargs, lambda: f"hints_wrapper: a subgraph takes positional inputs, got keywords {sorted(kwargs)}")
    return walk(body_fn, args)


@rule(higher_order.autograd_function_apply)
def autograd_function_apply(fwd, bwd, *fwd_args, **fwd_kwargs):
    """``Function.apply(*fwd_args)`` for a user's torch.autograd.Function, as dynamo keeps it when an
    input requires grad: ``fwd`` runs without grad and returns (outputs, values saved for backward);
    the outputs then require grad as the Function's would. ``bwd`` runs only in backward, so its
    nodes stay unannotated."""
    with torch.no_grad():
        returned = walk(fwd, fwd_args)
    check(isinstance(returned, (tuple, list)) and len(returned) == 2,
          lambda: f"autograd_function_apply: the forward graph must return (outputs, saved values), got {describe(returned)}")
    output = returned[0]
    outputs = list(output) if isinstance(output, (tuple, list)) else [output]
    dirty = set(fwd_kwargs.get("dirty_idx", ()))
    outputs = [value if i in dirty or not any(value is arg for arg in fwd_args) else fresh_like(value)
               for i, value in enumerate(outputs)]
    results = through_autograd_function(outputs, fwd_args, tuple(fwd_kwargs.get("non_differentiable_idx", ())))
    return type(output)(results) if isinstance(output, (tuple, list)) else results[0]


@rule(higher_order.flat_apply)
def flat_apply(func, in_spec, *flat_args, checked_output=True):
    """``func(*args, **kwargs)``, with ``args`` and ``kwargs`` rebuilt from ``flat_args`` by ``in_spec``: how
    an FX graph holds a call on values it cannot hold (flex_attention's score_mod indexing a buffer)."""
    return flat_apply_kernel()(func, in_spec, flat_args, checked_output)