"""Control flow: ``cond``, ``while_loop``, ``map``, ``scan`` and ``associative_scan``."""
from __future__ import annotations

from typing import Any

import torch

from ... import symbolic
from ...devices import device_of
from ...errors import PropagationError
from ...resolve.registry import rule
from ...torch_compat import check, pytree
from .common import (check_fixed_point, describe, fill_order, fresh, fresh_int, fresh_like, is_zero, stacked,
                     step_slice, through_autograd_function, walk)

aten = torch.ops.aten
higher_order = torch.ops.higher_order


@rule(higher_order.cond)
def cond(pred, true_fn, false_fn, operands):
    """``true_fn(*operands) if pred else false_fn(*operands)``, for a predicate that may depend on the data.

    Both branches are propagated and must agree on the structure of their results and, per tensor,
    on dtype, device, layout, rank and storage offset (torch's fake kernel refuses otherwise, with a
    RuntimeError). A size the branches disagree on is a fresh symbol between the two; strides are
    dense in the branches' common stride order over the merged sizes, as torch's fake kernel lays
    them out."""
    check(isinstance(pred, (bool, torch.Tensor, torch.SymBool)),
          lambda: f"Expected pred to be bool or tensor, but got {pred}.")
    if isinstance(pred, torch.Tensor):
        check(pred.numel() == 1,
              lambda: f"Expected pred to be bool or single-element tensor, but got {describe(pred)}.")
    check(isinstance(operands, (tuple, list)),
          lambda: f"Expect operands to be a tuple of tensors, but got {type(operands).__name__}.")
    with torch.no_grad():
        true_out = walk(true_fn, operands)
        false_out = walk(false_fn, operands)
    true_flat, true_spec = pytree.tree_flatten(true_out)
    false_flat, false_spec = pytree.tree_flatten(false_out)
    check(true_spec == false_spec, lambda: f"Unmatched output spec from torch.cond branches: true branch tree_spec "
                                           f"{true_spec} vs false branch tree_spec {false_spec}.")
    if isinstance(pred, bool):  # a constant predicate: the branch it picks is the result
        merged = [fresh_like(value) for value in (true_flat if pred else false_flat)]
    else:
        merged = [_merge_branches(a, b) for a, b in zip(true_flat, false_flat)]
    return pytree.tree_unflatten(through_autograd_function(merged, (pred, operands)), true_spec)


def _merge_branches(a: Any, b: Any) -> Any:
    if a is None or b is None:
        check(a is None and b is None, lambda: f"cond: one branch returns None where the other returns {a or b}")
        return None
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        check(not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor),
              lambda: f"cond: one branch returns a tensor, the other "
                      f"{describe(a if isinstance(b, torch.Tensor) else b)}")
        return a if symbolic.definitely_equal(a, b) else fresh_int(a, b)
    prefix = "When merging two branches' output in torch.cond, "
    for name, left, right in (("dtype", a.dtype, b.dtype), ("device", device_of(a), device_of(b)),
                              ("layout", a.layout, b.layout), ("dim", a.dim(), b.dim()),
                              ("is_conj", a.is_conj(), b.is_conj())):
        check(left == right, lambda: f"{prefix}expected same {name} but got {left} and {right}.")
    check(symbolic.definitely_equal(a.storage_offset(), b.storage_offset()),
          lambda: f"{prefix}expected same storage_offset but got {a.storage_offset()} and {b.storage_offset()}.")
    sizes = [x if symbolic.definitely_equal(x, y) else _fresh_size_between(x, y) for x, y in zip(a.shape, b.shape)]
    same = all(symbolic.definitely_equal(x, y) for x, y in zip(a.shape, b.shape)) and all(
        symbolic.definitely_equal(x, y) for x, y in zip(a.stride(), b.stride()))
    strides = a.stride() if same else _merged_strides(a, b, sizes)
    return fresh(sizes, strides, a.dtype, device_of(a))


def _fresh_size_between(x: Any, y: Any) -> Any:
    session = symbolic.current()
    if isinstance(x, int) and isinstance(y, int):
        return session.fresh_size(max(x, y), lower=min(x, y))
    return session.fresh_size(torch.sym_max(x, y))


def _merged_strides(a: torch.Tensor, b: torch.Tensor, sizes: list) -> list:
    order = fill_order(a.stride())
    check(order == fill_order(b.stride()),
          lambda: f"The sorted order of strides of the two branches' output doesn't match. True branch has stride "
                  f"{tuple(a.stride())} but false branch has stride {tuple(b.stride())}. Consider using contiguous().")
    merged: list = [0] * a.dim()
    running, running_a, running_b = 1, 1, 1
    for dim in order:
        stride_a, stride_b = a.stride()[dim], b.stride()[dim]
        if symbolic.definitely_equal(stride_a, 0) and symbolic.definitely_equal(stride_b, 0):
            continue
        dense = all(symbolic.definitely_equal(size, 1) or symbolic.definitely_equal(stride, expected)
                    for size, stride, expected in ((a.shape[dim], stride_a, running_a),
                                                   (b.shape[dim], stride_b, running_b)))
        check(dense, lambda: f"It seems one of cond's output stride is not a simple accumulative multiplication of "
                             f"sizes. True branch has size {tuple(a.shape)}, stride {tuple(a.stride())} and false "
                             f"branch has size {tuple(b.shape)} stride {tuple(b.stride())}. Hint: can call "
                             f"t.contiguous().")
        merged[dim] = running
        running, running_a, running_b = running * sizes[dim], running_a * a.shape[dim], running_b * b.shape[dim]
    return merged


def _is_predicate(value: Any) -> bool:
    if isinstance(value, (bool, torch.SymBool)):
        return True
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() == 0


@rule(higher_order.while_loop)
def while_loop(cond_fn, body_fn, carried_inputs, additional_inputs, *, mutated_arg_indices=""):
    """``while cond_fn(*carried, *additional): carried = body_fn(*carried, *additional)``.

    The number of steps depends on the data, so the carried values' metadata must be a fixed point
    of the body (shape, dtype, device and strides, as torch's fake kernel checks): the results have
    it. Carried ints come out as fresh symbols."""
    check(isinstance(carried_inputs, (tuple, list)),
          lambda: f"carried_inputs must be a tuple or list but got {type(carried_inputs)}")
    check(isinstance(additional_inputs, (tuple, list)),
          lambda: f"additional_inputs must be a tuple or list, got {type(additional_inputs)}")
    outputs = _loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    results = [fresh_like(out) if isinstance(out, torch.Tensor) else fresh_int(out) for out in outputs]
    return tuple(through_autograd_function(results, (carried_inputs, additional_inputs)))


@rule(higher_order.while_loop_stack_output)
def while_loop_stack_output(cond_fn, body_fn, carried_inputs, additional_inputs, *, mutated_arg_indices=""):
    """`while_loop` returning every step's carried values stacked (at least one: with no step, the inputs)."""
    outputs = _loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    check(all(isinstance(out, torch.Tensor) for out in outputs),
          lambda: "while_loop with stacked outputs carries tensors only")
    steps = symbolic.current().fresh_size(None, lower=1)
    return tuple(through_autograd_function([stacked(out, steps) for out in outputs],
                                            (carried_inputs, additional_inputs)))


def _loop(cond_fn, body_fn, carried_inputs, additional_inputs) -> list:
    inputs = [*carried_inputs, *additional_inputs]
    with torch.no_grad():
        pred = walk(cond_fn, inputs)
        check(_is_predicate(pred),
              lambda: f"cond_fn must return a boolean scalar tensor or a boolean but got {describe(pred)}")
        outputs = walk(body_fn, inputs)
    check(isinstance(outputs, (tuple, list)), lambda: f"body_fn should return a tuple but got {type(outputs)}")
    check_fixed_point("while_loop", "carried_inputs", "body_output", list(carried_inputs), list(outputs))
    return list(outputs)


@rule(higher_order.map_impl)
def map_impl(f, xs, pos_args):
    """``torch.stack([f(*[x[i] for x in xs], *pos_args) for i in range(len(xs[0]))])``, per result."""
    check(isinstance(xs, (tuple, list)) and len(xs) > 0 and all(isinstance(x, torch.Tensor) for x in xs),
          lambda: f"Leaves of xs must be Tensor {xs}")
    length = xs[0].shape[0] if xs[0].dim() else None
    check(all(x.dim() > 0 and symbolic.definitely_equal(x.shape[0], length) for x in xs),
          lambda: f"Leaves of xs must have same leading dimension size {[tuple(x.shape) for x in xs]}")
    if is_zero(length):  # torch's kernel stacks the results of no call: it has no structure to give them
        raise PropagationError("map over a leading dim of size 0: out_spec cannot be None", error_type=AssertionError)
    with torch.no_grad():
        out = walk(f, [*(step_slice(x) for x in xs), *pos_args])
    flat, spec = pytree.tree_flatten(out)
    check(all(isinstance(value, torch.Tensor) or value is None for value in flat),
          lambda: f"map: cannot stack the body's results {[describe(v) for v in flat]}")
    results = [stacked(value, length) for value in flat]
    return pytree.tree_unflatten(through_autograd_function(results, (xs, pos_args)), spec)


@rule(higher_order.scan)
def scan(combine_fn, init, xs, additional_inputs):
    """``carry = init; for i: carry, y_i = combine_fn(*carry, *[x[i] for x in xs], *additional_inputs)``;
    returns ``(*carry, *ys)``, each y stacked over the steps. The carry's metadata must be a fixed
    point of combine_fn."""
    check(len(xs) > 0, lambda: "scan: xs must hold at least one tensor to iterate over")
    length = xs[0].shape[0]
    check(all(x.dim() > 0 and symbolic.definitely_equal(x.shape[0], length) for x in xs),
          lambda: f"scan: all xs must have the same leading dimension, got {[tuple(x.shape) for x in xs]}")
    if is_zero(length):  # torch's kernel selects the first step's slice to trace the body with
        raise PropagationError(f"select(): index 0 out of range for tensor of size {list(xs[0].shape)} at dimension 0",
                               error_type=IndexError)
    with torch.no_grad():
        out = pytree.tree_leaves(walk(combine_fn, [*init, *(step_slice(x) for x in xs), *additional_inputs]))
    carry, ys = out[:len(init)], out[len(init):]
    check_fixed_point("scan", "init", "carry", list(init), carry)
    results = [*(fresh_like(c) for c in carry), *(stacked(y, length) for y in ys)]
    return tuple(through_autograd_function(results, (init, xs, additional_inputs)))


@rule(higher_order.associative_scan)
def associative_scan(combine_fn, xs, additional_inputs):
    """The inclusive scan of ``xs`` along dim 0 with ``combine_fn(lhs, rhs)``; its results have the
    shapes of ``xs``. combine_fn is propagated on one element of each side."""
    check(len(xs) > 0, lambda: "associative_scan: xs must hold at least one tensor")
    slices = [step_slice(x) for x in xs]
    with torch.no_grad():
        out = pytree.tree_leaves(walk(combine_fn, [*slices, *slices, *additional_inputs]))
    check_fixed_point("associative_scan", "xs", "combine_fn's output", slices, out, strides=False)
    results = [fresh(x.shape, symbolic.contiguous_strides(x.shape), x.dtype, device_of(x)) for x in xs]
    return tuple(through_autograd_function(results, (xs, additional_inputs)))
