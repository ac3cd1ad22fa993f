"""Higher-order operators: ops that call graphs (cond's branches, a loop's body, a block under no_grad).

Each rule walks the op's subgraphs through the engine (`Session.walk_subgraph`), so that their own
nodes are annotated too, with the values they take when torch's eager kernel
(``torch/_higher_order_ops/``) calls them, and builds the op's result from theirs as that kernel
does. Two conventions come from those kernels:

- cond, while_loop, map, scan, associative_scan and flex_attention run their subgraphs inside an
  autograd Function: the subgraphs compute without grad, and every floating-point result requires
  grad as soon as one input does (`_through_autograd_function`). Ops that stand for a plain call
  (grad-mode and autocast regions, checkpointing, invoke_subgraph) run theirs as that call would.
- where a result's metadata would depend on the data (cond's branches disagreeing in a size, the
  ints a loop carries), it is a fresh symbol, as in torch's fake kernels.

Where a subgraph's results land (their devices) is decided by the subgraph, so these ops have a
device rule of their own that leaves the results as the rule built them (`_placed_by_subgraphs`).
"""
from __future__ import annotations

import _string
import contextlib
import functools
import string
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import context, symbolic
from ..devices import default_device, device_of, place, tag
from ..devices.transfers import Placement, tensors_in, transfer
from ..errors import PropagationError, UnsupportedError
from ..registry import python_rule, rule, target_name
from ..torch_compat import (FakeTensor, FakeTensorMode, HigherOrderOperator, OpOverload, TorchDispatchMode,
                            auto_functionalized_kernels, autocast_region_calls, check, flat_apply_kernel,
                            functionalized_hop_call, has_kernel_for_dispatch_key, pytree, schema_of, storage_key,
                            without_ambient_modes)

aten = torch.ops.aten
higher_order = torch.ops.higher_order


# --- helpers --------------------------------------------------------------------------------

def _walk(subgraph: Any, inputs: Any, context_key: Any = None, around: Callable | None = None) -> Any:
    """Propagate ``subgraph`` on ``inputs``, annotating its nodes; its output as meta tensors."""
    check(isinstance(subgraph, torch.fx.GraphModule),
          lambda: f"expected a subgraph (a torch.fx.GraphModule), got {type(subgraph).__name__}")
    return context.current_session().walk_subgraph(subgraph, list(inputs), context_key, around)


def _fresh(shape: Any, stride: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return tag(torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta"), device)


def _fresh_like(value: Any) -> Any:
    """A new tensor with ``value``'s metadata (not an alias of it); python values are kept."""
    if isinstance(value, torch.Tensor):
        return _fresh(value.shape, value.stride(), value.dtype, device_of(value))
    return value


def _stacked(value: Any, length: Any) -> Any:
    """``length`` results of one step stacked along a new leading dim, as torch.stack lays them out."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = (length, *value.shape)
    return _fresh(shape, symbolic.contiguous_strides(shape), value.dtype, device_of(value))


def _is_zero(size: Any) -> bool:
    return isinstance(size, int) and size == 0


def _step_slice(x: torch.Tensor) -> torch.Tensor:
    """What a step of map or scan sees of ``x``: ``x[i]``, laid out as ``x`` is without its leading dim."""
    check(isinstance(x, torch.Tensor) and x.dim() > 0,
          lambda: f"the scanned inputs must be tensors with a leading dim to iterate over, got {_describe(x)}")
    return _fresh(x.shape[1:], x.stride()[1:], x.dtype, device_of(x))


class _ThroughFunction(torch.autograd.Function):
    """Stands for the autograd Function torch's kernel runs: the given results, made its outputs."""

    @staticmethod
    def forward(ctx, outputs, non_differentiable, *inputs):
        ctx.mark_non_differentiable(*(outputs[i] for i in non_differentiable))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - propagation never runs backward
        raise RuntimeError("fxprop's stand-in for a higher-order op has no backward")


def _through_autograd_function(outputs: list, inputs: Any, non_differentiable: tuple[int, ...] = ()) -> list:
    """``outputs`` as an autograd Function returns them: with grad mode on and any input requiring
    grad, every floating-point output requires grad (integer ones cannot, nor those at the positions
    the Function marks ``non_differentiable``); otherwise none does."""
    differentiable = [t for t in tensors_in(inputs, {}) if t.requires_grad]
    if not (torch.is_grad_enabled() and differentiable):
        return list(outputs)
    positions = [i for i, value in enumerate(outputs) if isinstance(value, torch.Tensor)]
    devices = [device_of(outputs[i]) for i in positions]
    marked = tuple(positions.index(i) for i in non_differentiable if i in positions)
    wrapped = _ThroughFunction.apply([outputs[i] for i in positions], marked, *differentiable)
    result = list(outputs)
    for i, tensor, device in zip(positions, wrapped, devices):
        result[i] = tag(tensor, device)
    return result


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"Tensor(shape={tuple(symbolic.user_shape(value))}, dtype={value.dtype}, device={device_of(value)}, "
                f"stride={tuple(value.stride())})")
    return f"{type(value).__name__} {value!r}"


def _differences(expected: Any, got: Any, strides: bool = True) -> list[str]:
    """How ``got`` differs from ``expected`` in what must stay fixed from one step to the next:
    shape, dtype, device, and the strides of dims that address memory (torch compares the same)."""
    if isinstance(expected, torch.Tensor) != isinstance(got, torch.Tensor):
        return [f"type: {_describe(expected)} vs {_describe(got)}"]
    if not isinstance(expected, torch.Tensor):
        both_ints = all(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in (expected, got))
        return [] if both_ints or type(expected) is type(got) else [f"type: {_describe(expected)} vs {_describe(got)}"]
    found = []
    if expected.dim() != got.dim() or not all(symbolic.definitely_equal(a, b)
                                              for a, b in zip(expected.shape, got.shape)):
        found.append(f"shape: {tuple(symbolic.user_shape(expected))} vs {tuple(symbolic.user_shape(got))}")
    if expected.dtype != got.dtype:
        found.append(f"dtype: {expected.dtype} vs {got.dtype}")
    if device_of(expected) != device_of(got):
        found.append(f"device: {device_of(expected)} vs {device_of(got)}")
    if strides and not found and not all(symbolic.definitely_equal(size, 1) or symbolic.definitely_equal(a, b)
                                         for size, a, b in zip(expected.shape, expected.stride(), got.stride())):
        found.append(f"stride: {tuple(expected.stride())} vs {tuple(got.stride())}")
    return found


def _check_fixed_point(op: str, before_name: str, after_name: str, before: list, after: list,
                       strides: bool = True) -> None:
    check(len(before) == len(after),
          lambda: f"{op}: expected {before_name} and {after_name} to have the same number of values, got "
                  f"{len(before)} and {len(after)}")
    diffs = [f"  [{i}] {diff}" for i, (a, b) in enumerate(zip(before, after))
             for diff in _differences(a, b, strides)]
    check(not diffs, lambda: f"{op}: {after_name} must have the metadata of {before_name} (the same every step), "
                             f"but they differ:\n" + "\n".join(diffs))


def _fresh_int(a: Any, b: Any = None) -> Any:
    """A fresh symbol for an int that depends on the data (between ``a`` and ``b`` when both are known)."""
    session = symbolic.current()
    if b is not None and isinstance(a, int) and isinstance(b, int) and min(a, b) >= 0:
        return session.fresh_size(max(a, b), lower=min(a, b))
    return session.fresh_value(torch.int64)


def _placed_by_subgraphs(target: Any, args: tuple, kwargs: dict) -> Placement:
    return Placement(None, target, args, kwargs, "higher-order op: its subgraphs place its results")


# --- grad mode, autocast and plain calls ----------------------------------------------------------

@rule(higher_order.wrap_with_set_grad_enabled)
def wrap_with_set_grad_enabled(enable_grad, wrapped_func, *args):
    """``with torch.set_grad_enabled(enable_grad): wrapped_func(*args)``."""
    with torch.set_grad_enabled(bool(enable_grad)):
        return _walk(wrapped_func, args)


@rule(higher_order.wrap)
def wrap(func, *args):
    """``func(*args)``."""
    return _walk(func, args)


@rule(higher_order.tag_activation_checkpoint, higher_order.wrap_activation_checkpoint)
def activation_checkpoint(function, *args, **checkpoint_options):
    """``torch.utils.checkpoint.checkpoint(function, *args)``: the forward runs as a plain call (the
    options only decide what backward recomputes)."""
    return _walk(function, args)


@rule(higher_order.invoke_subgraph)
def invoke_subgraph(subgraph, identifier, *operands):
    """``subgraph(*operands)``: a region compiled once and called from several places."""
    return _walk(getattr(subgraph, "subgraph", subgraph), operands)


@rule(higher_order.hints_wrapper)
def hints_wrapper(body_fn, args, kwargs, hints):
    """``body_fn(*args, **kwargs)``; the hints are for the compiler."""
    check(not kwargs, lambda: f"hints_wrapper: a subgraph takes positional inputs, got keywords {sorted(kwargs)}")
    return _walk(body_fn, args)


@rule(higher_order.autograd_function_apply)
def autograd_function_apply(fwd, bwd, *fwd_args, **fwd_kwargs):
    """``Function.apply(*fwd_args)`` for a user's torch.autograd.Function, as dynamo keeps it when an
    input requires grad: ``fwd`` runs without grad and returns (outputs, values saved for backward);
    the outputs then require grad as the Function's would. ``bwd`` runs only in backward, so its
    nodes stay unannotated."""
    with torch.no_grad():
        returned = _walk(fwd, fwd_args)
    check(isinstance(returned, (tuple, list)) and len(returned) == 2,
          lambda: f"autograd_function_apply: the forward graph must return (outputs, saved values), got {_describe(returned)}")
    output = returned[0]
    outputs = list(output) if isinstance(output, (tuple, list)) else [output]
    dirty = set(fwd_kwargs.get("dirty_idx", ()))
    outputs = [value if i in dirty or not any(value is arg for arg in fwd_args) else _fresh_like(value)
               for i, value in enumerate(outputs)]
    results = _through_autograd_function(outputs, fwd_args, tuple(fwd_kwargs.get("non_differentiable_idx", ())))
    return type(output)(results) if isinstance(output, (tuple, list)) else results[0]


@rule(higher_order.flat_apply)
def flat_apply(func, in_spec, *flat_args, checked_output=True):
    """``func(*args, **kwargs)``, with ``args`` and ``kwargs`` rebuilt from ``flat_args`` by ``in_spec``: how
    an FX graph holds a call on values it cannot hold (flex_attention's score_mod indexing a buffer)."""
    return flat_apply_kernel()(func, in_spec, flat_args, checked_output)


@dataclass(frozen=True)
class _Autocast:
    device_type: str
    dtype: torch.dtype
    enabled: bool


_autocast = threading.local()
_AUTOCAST_DTYPES = {"cpu": (torch.bfloat16, torch.float16), "cuda": (torch.float16, torch.bfloat16)}
_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA", "xpu": "AutocastXPU", "mps": "AutocastMPS",
                  "hpu": "AutocastHPU", "xla": "AutocastXLA", "mtia": "AutocastMTIA",
                  "privateuseone": "AutocastPrivateUse1"}
_PLAIN_MODULES = ("_operator", "operator", "builtins", "math")


def _autocast_regions() -> tuple[_Autocast, ...]:
    """The autocast regions being propagated, innermost last."""
    return getattr(_autocast, "regions", ())


@contextlib.contextmanager
def _inside(region: _Autocast):
    outer = _autocast_regions()
    _autocast.regions = (*outer, region)
    try:
        yield
    finally:
        _autocast.regions = outer


def _region(device_type, dtype, enabled) -> _Autocast:
    dtype = dtype if dtype is not None else torch.get_autocast_dtype(device_type)
    enabled = bool(enabled) and dtype in _AUTOCAST_DTYPES.get(device_type, (dtype,))  # else torch disables it
    return _Autocast(str(device_type), dtype, enabled)


@rule(higher_order.wrap_with_autocast)
def wrap_with_autocast(device_type, dtype, enabled, cache_enabled, wrapped_func, *args):
    """``with torch.autocast(device_type, dtype, enabled, cache_enabled): wrapped_func(*args)``.

    Autocast acts in torch's dispatcher only on tensors of its device type, never on meta tensors,
    so each call in the region is cast here as autocast would cast it (`_autocast_call`)."""
    with _inside(_region(device_type, dtype, enabled)):
        return _walk(wrapped_func, args, ("autocast", _autocast_regions()), _autocast_call)


_enter_autocast, _exit_autocast = autocast_region_calls()


@rule(_enter_autocast)
def enter_autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
    """The opening of an autocast block as torch.export and dynamo spell it when they do not make it
    a `wrap_with_autocast` body: the nodes up to the matching ``_exit_autocast`` are cast as that
    body's would be. The value is the autocast object the exit node is given."""
    outer = _autocast_regions()
    _autocast.regions = (*outer, _region(device_type, dtype, enabled))

    def restore() -> None:
        _autocast.regions = outer
    context.current_session().open_region(("autocast", _autocast_regions()), _autocast_call, restore)
    return torch.autocast(str(device_type), dtype=dtype, enabled=bool(enabled), cache_enabled=cache_enabled)


@rule(_exit_autocast)
def exit_autocast(mode):
    """The end of the innermost autocast block opened by `enter_autocast`."""
    check(bool(_autocast_regions()), lambda: "_exit_autocast: no autocast region is open")
    context.current_session().close_region()


def _autocast_call(target: Any, args: tuple, kwargs: dict, compute: Callable) -> Any:
    """One call of an autocast region, as torch's autocast kernels run it.

    Which inputs autocast casts, and to what, is asked of those kernels themselves: the call runs
    once on FakeTensors of the same metadata (on their logical devices, which autocast acts on)
    under the region's autocast state, and the casts of its inputs are recorded. The call is then
    propagated on inputs cast the same way. Where autocast casts inside a call instead (a composite
    op with no autocast kernel of its own, such as einsum, whose matmuls are cast), the results are
    cast to the dtypes the FakeTensor run gave."""
    regions = {region.device_type: region for region in _autocast_regions()}
    active = {device: region for device, region in regions.items() if region.enabled}
    if not active or not _autocast_may_cast(target, active):
        return compute(args, kwargs)
    asked = _autocast_policy(target, args, kwargs, regions)
    if asked is None:
        return compute(args, kwargs)
    casts, result_dtypes = asked
    flat, spec = pytree.tree_flatten((args, kwargs))
    for position, dtype in casts.items():
        flat[position] = _cast(flat[position], dtype)
    args, kwargs = pytree.tree_unflatten(flat, spec)
    value, provenance = compute(args, kwargs)
    leaves, out_spec = pytree.tree_flatten(value)
    if len(leaves) == len(result_dtypes):
        leaves = [_cast(leaf, dtype) if isinstance(leaf, torch.Tensor) and dtype is not None and leaf.dtype != dtype
                  else leaf for leaf, dtype in zip(leaves, result_dtypes)]
        value = pytree.tree_unflatten(leaves, out_spec)
    return value, provenance


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor.to(dtype)``, as autocast casts (recorded by autograd)."""
    return tag(tensor.to(dtype), device_of(tensor))


def _autocast_may_cast(target: Any, active: dict) -> bool:
    """Whether autocast may change the call: an aten op with an autocast kernel for an active device,
    or a composite whose parts may have one; torch-level functions and methods are asked."""
    if isinstance(target, HigherOrderOperator) or getattr(target, "__module__", None) in _PLAIN_MODULES:
        return False
    if not isinstance(target, OpOverload):
        return True
    name = target.name()
    for device in active:
        try:
            if has_kernel_for_dispatch_key(name, _AUTOCAST_KEYS.get(device, "")):
                return True
        except RuntimeError:  # a device type whose autocast key this torch does not know
            return True
    return has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


class _CastRecorder(TorchDispatchMode):
    """Records each ``_to_copy`` of one of the call's own inputs: autocast's casts."""

    def __init__(self, positions: dict[int, int]):
        super().__init__()
        self.positions = positions
        self.casts: dict[int, torch.dtype] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default and args and id(args[0]) in self.positions and "dtype" in kwargs:
            self.casts.setdefault(self.positions[id(args[0])], kwargs["dtype"])
        return func(*args, **kwargs)


_fake_modes = threading.local()


def _fake_mode() -> FakeTensorMode:
    session = symbolic.current()
    if session.active:
        return session.fake_mode
    mode = getattr(_fake_modes, "mode", None)
    if mode is None:
        mode = _fake_modes.mode = FakeTensorMode(allow_non_fake_inputs=True)
    return mode


def _autocast_policy(target: Any, args: tuple, kwargs: dict, regions: dict) -> tuple[dict, list] | None:
    """(position of each input autocast casts -> its dtype, the dtypes of the results), from a run on
    FakeTensors under the regions' autocast state; None when that run fails for an op autocast has no
    kernel for (it then passes through autocast untouched)."""
    mode = _fake_mode()
    flat, spec = pytree.tree_flatten((args, kwargs))
    positions: dict[int, int] = {}
    for position, value in enumerate(flat):
        if isinstance(value, torch.Tensor):
            flat[position] = FakeTensor(mode, value.detach(), device_of(value))
            positions[id(flat[position])] = position
    fake_args, fake_kwargs = pytree.tree_unflatten(flat, spec)
    recorder = _CastRecorder(positions)
    try:
        with without_ambient_modes(), _autocast_state(regions), mode, recorder:
            out = _call(target, fake_args, fake_kwargs)
    except Exception as error:
        if isinstance(target, OpOverload) and not has_kernel_for_dispatch_key(target.name(),
                                                                              "CompositeImplicitAutograd"):
            raise UnsupportedError(f"autocast: cannot tell how autocast casts {target_name(target)} here "
                                   f"({type(error).__name__}: {error})") from error
        return None
    dtypes = [leaf.dtype if isinstance(leaf, torch.Tensor) else None for leaf in pytree.tree_leaves(out)]
    return recorder.casts, dtypes


def _call(target: Any, args: tuple, kwargs: dict) -> Any:
    if isinstance(target, str):
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


@contextlib.contextmanager
def _autocast_state(regions: dict):
    """torch's autocast state set to the regions' (and off for every other device type), restored after."""
    devices = {"cpu", "cuda", *regions}
    saved = [(device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in devices]
    cache = torch.is_autocast_cache_enabled()
    try:
        torch.set_autocast_cache_enabled(False)
        for device in devices:
            region = regions.get(device)
            torch.set_autocast_enabled(device, region is not None and region.enabled)
            if region is not None:
                torch.set_autocast_dtype(device, region.dtype)
        yield
    finally:
        for device, was_enabled, dtype in saved:
            torch.set_autocast_enabled(device, was_enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(cache)


# --- control flow ---------------------------------------------------------------------------

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
              lambda: f"Expected pred to be bool or single-element tensor, but got {_describe(pred)}.")
    check(isinstance(operands, (tuple, list)),
          lambda: f"Expect operands to be a tuple of tensors, but got {type(operands).__name__}.")
    with torch.no_grad():
        true_out = _walk(true_fn, operands)
        false_out = _walk(false_fn, operands)
    true_flat, true_spec = pytree.tree_flatten(true_out)
    false_flat, false_spec = pytree.tree_flatten(false_out)
    check(true_spec == false_spec, lambda: f"Unmatched output spec from torch.cond branches: true branch tree_spec "
                                           f"{true_spec} vs false branch tree_spec {false_spec}.")
    if isinstance(pred, bool):  # a constant predicate: the branch it picks is the result
        merged = [_fresh_like(value) for value in (true_flat if pred else false_flat)]
    else:
        merged = [_merge_branches(a, b) for a, b in zip(true_flat, false_flat)]
    return pytree.tree_unflatten(_through_autograd_function(merged, (pred, operands)), true_spec)


def _merge_branches(a: Any, b: Any) -> Any:
    if a is None or b is None:
        check(a is None and b is None, lambda: f"cond: one branch returns None where the other returns {a or b}")
        return None
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        check(not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor),
              lambda: f"cond: one branch returns a tensor, the other "
                      f"{_describe(a if isinstance(b, torch.Tensor) else b)}")
        return a if symbolic.definitely_equal(a, b) else _fresh_int(a, b)
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
    return _fresh(sizes, strides, a.dtype, device_of(a))


def _fresh_size_between(x: Any, y: Any) -> Any:
    session = symbolic.current()
    if isinstance(x, int) and isinstance(y, int):
        return session.fresh_size(max(x, y), lower=min(x, y))
    return session.fresh_size(torch.sym_max(x, y))


def _fill_order(strides: tuple) -> list[int]:
    """Dims from the innermost stride out; of equal strides the inner dim first (inductor's argsort)."""
    def compare(i: int, j: int) -> int:
        if symbolic.definitely_equal(strides[i], strides[j]):
            return j - i
        less = symbolic.resolve(strides[i] < strides[j])
        return -1 if less is True else 1 if less is False else j - i
    return sorted(range(len(strides)), key=functools.cmp_to_key(compare))


def _merged_strides(a: torch.Tensor, b: torch.Tensor, sizes: list) -> list:
    order = _fill_order(a.stride())
    check(order == _fill_order(b.stride()),
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
    results = [_fresh_like(out) if isinstance(out, torch.Tensor) else _fresh_int(out) for out in outputs]
    return tuple(_through_autograd_function(results, (carried_inputs, additional_inputs)))


@rule(higher_order.while_loop_stack_output)
def while_loop_stack_output(cond_fn, body_fn, carried_inputs, additional_inputs, *, mutated_arg_indices=""):
    """`while_loop` returning every step's carried values stacked (at least one: with no step, the inputs)."""
    outputs = _loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    check(all(isinstance(out, torch.Tensor) for out in outputs),
          lambda: "while_loop with stacked outputs carries tensors only")
    steps = symbolic.current().fresh_size(None, lower=1)
    return tuple(_through_autograd_function([_stacked(out, steps) for out in outputs],
                                            (carried_inputs, additional_inputs)))


def _loop(cond_fn, body_fn, carried_inputs, additional_inputs) -> list:
    inputs = [*carried_inputs, *additional_inputs]
    with torch.no_grad():
        pred = _walk(cond_fn, inputs)
        check(_is_predicate(pred),
              lambda: f"cond_fn must return a boolean scalar tensor or a boolean but got {_describe(pred)}")
        outputs = _walk(body_fn, inputs)
    check(isinstance(outputs, (tuple, list)), lambda: f"body_fn should return a tuple but got {type(outputs)}")
    _check_fixed_point("while_loop", "carried_inputs", "body_output", list(carried_inputs), list(outputs))
    return list(outputs)


@rule(higher_order.map_impl)
def map_impl(f, xs, pos_args):
    """``torch.stack([f(*[x[i] for x in xs], *pos_args) for i in range(len(xs[0]))])``, per result."""
    check(isinstance(xs, (tuple, list)) and len(xs) > 0 and all(isinstance(x, torch.Tensor) for x in xs),
          lambda: f"Leaves of xs must be Tensor {xs}")
    length = xs[0].shape[0] if xs[0].dim() else None
    check(all(x.dim() > 0 and symbolic.definitely_equal(x.shape[0], length) for x in xs),
          lambda: f"Leaves of xs must have same leading dimension size {[tuple(x.shape) for x in xs]}")
    if _is_zero(length):  # torch's kernel stacks the results of no call: it has no structure to give them
        raise PropagationError("map over a leading dim of size 0: out_spec cannot be None", error_type=AssertionError)
    with torch.no_grad():
        out = _walk(f, [*(_step_slice(x) for x in xs), *pos_args])
    flat, spec = pytree.tree_flatten(out)
    check(all(isinstance(value, torch.Tensor) or value is None for value in flat),
          lambda: f"map: cannot stack the body's results {[_describe(v) for v in flat]}")
    stacked = [_stacked(value, length) for value in flat]
    return pytree.tree_unflatten(_through_autograd_function(stacked, (xs, pos_args)), spec)


@rule(higher_order.scan)
def scan(combine_fn, init, xs, additional_inputs):
    """``carry = init; for i: carry, y_i = combine_fn(*carry, *[x[i] for x in xs], *additional_inputs)``;
    returns ``(*carry, *ys)``, each y stacked over the steps. The carry's metadata must be a fixed
    point of combine_fn."""
    check(len(xs) > 0, lambda: "scan: xs must hold at least one tensor to iterate over")
    length = xs[0].shape[0]
    check(all(x.dim() > 0 and symbolic.definitely_equal(x.shape[0], length) for x in xs),
          lambda: f"scan: all xs must have the same leading dimension, got {[tuple(x.shape) for x in xs]}")
    if _is_zero(length):  # torch's kernel selects the first step's slice to trace the body with
        raise PropagationError(f"select(): index 0 out of range for tensor of size {list(xs[0].shape)} at dimension 0",
                               error_type=IndexError)
    with torch.no_grad():
        out = pytree.tree_leaves(_walk(combine_fn, [*init, *(_step_slice(x) for x in xs), *additional_inputs]))
    carry, ys = out[:len(init)], out[len(init):]
    _check_fixed_point("scan", "init", "carry", list(init), carry)
    results = [*(_fresh_like(c) for c in carry), *(_stacked(y, length) for y in ys)]
    return tuple(_through_autograd_function(results, (init, xs, additional_inputs)))


@rule(higher_order.associative_scan)
def associative_scan(combine_fn, xs, additional_inputs):
    """The inclusive scan of ``xs`` along dim 0 with ``combine_fn(lhs, rhs)``; its results have the
    shapes of ``xs``. combine_fn is propagated on one element of each side."""
    check(len(xs) > 0, lambda: "associative_scan: xs must hold at least one tensor")
    slices = [_step_slice(x) for x in xs]
    with torch.no_grad():
        out = pytree.tree_leaves(_walk(combine_fn, [*slices, *slices, *additional_inputs]))
    _check_fixed_point("associative_scan", "xs", "combine_fn's output", slices, out, strides=False)
    results = [_fresh(x.shape, symbolic.contiguous_strides(x.shape), x.dtype, device_of(x)) for x in xs]
    return tuple(_through_autograd_function(results, (xs, additional_inputs)))


# --- attention with a score and a mask function ------------------------------------------------

@rule(higher_order.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                   mask_mod_other_buffers=()):
    """Attention whose scores pass through ``score_mod(score, b, h, m, n, *buffers)`` and whose mask is
    ``mask_mod(b, h, m, n, *buffers)`` (the last entry of ``block_mask``). Returns the output
    (query's batch, heads and length, value's head dim, in query's dtype, laid out in query's stride
    order), and the log-sum-exp and max of the scores per query, in the working precision
    (float64 for float64 queries, else float32; the max has no gradient). Both functions are propagated on one score (in
    the working precision) and int64 indices, as torch's eager kernel calls them."""
    check(query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
          lambda: f"flex_attention: query, key and value must be 4-D (batch, heads, length, head dim), got "
                  f"{_describe(query)}, {_describe(key)}, {_describe(value)}")
    batch, heads, length, _ = query.shape
    kv_batch, kv_heads = key.shape[0], key.shape[1]
    check(symbolic.definitely_equal(batch, kv_batch) or symbolic.definitely_equal(kv_batch, 1),
          lambda: f"Bq and Bkv must broadcast. Got Bq={batch} and Bkv={kv_batch}")
    check(symbolic.definitely_equal(heads % kv_heads, 0),
          lambda: f"flex_attention: the query's heads ({heads}) must be a multiple of the key's ({kv_heads})")
    working = torch.float64 if query.dtype == torch.float64 else torch.float32
    device = device_of(query)
    score = _fresh((), (), working, device)
    indices = [_fresh((), (), torch.int64, device) for _ in range(4)]
    with torch.no_grad():
        _walk(score_mod, [score, *indices, *score_mod_other_buffers])
        mask = _walk(block_mask[-1], [*indices, *mask_mod_other_buffers])
    check(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
          lambda: f"flex_attention: mask_mod must return a bool tensor, got {_describe(mask)}")
    shape = (batch, heads, length, value.shape[-1])
    out = _fresh(shape, _attention_strides(shape, query.stride()), query.dtype, device)
    stats = [_fresh(shape[:3], symbolic.contiguous_strides(shape[:3]), working, device) for _ in range(2)]
    return tuple(_through_autograd_function([out, *stats], (query, key, value, score_mod_other_buffers,
                                                            mask_mod_other_buffers), non_differentiable=(2,)))


def _attention_strides(shape: tuple, query_strides: tuple) -> list:
    """The output laid out in the query's fill order, its last dim kept innermost (torch's _permute_strides)."""
    order = _fill_order(query_strides)
    strides = _strides_in_order(shape, order)
    if not symbolic.definitely_equal(strides[-1], 1):
        last = len(shape) - 1
        strides = _strides_in_order(shape, [last, *(dim for dim in order if dim != last)])
    return strides


def _strides_in_order(shape: tuple, order: list) -> list:
    strides: list = [0] * len(shape)
    running = 1
    for dim in order:
        strides[dim] = running
        running = running * shape[dim]
    return strides


# --- functionalized mutation and effects ---------------------------------------------------------

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
        placement = place(op, args, kwargs)
        if placement.has_host_value:
            out = placement.host_value
        else:
            out = placement.target(*placement.args, **placement.kwargs)
            if placement.device is not None:
                out = pytree.tree_map_only(torch.Tensor, lambda t: tag(t, placement.device), out)
    new_token = _fresh((0,), (1,), torch.float32, default_device())
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
            value = torch.nn.Parameter(stand_in, value.requires_grad) if isinstance(value, torch.nn.Parameter) else stand_in
        elif any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in pytree.tree_leaves(value)):
            raise _TakenOnTrust
        return super().format_field(value, format_spec)


transfer(higher_order.wrap_with_set_grad_enabled, higher_order.wrap_with_autocast, higher_order.wrap,
         higher_order.tag_activation_checkpoint, higher_order.wrap_activation_checkpoint, higher_order.invoke_subgraph,
         higher_order.hints_wrapper, higher_order.cond, higher_order.while_loop, higher_order.while_loop_stack_output,
         higher_order.map_impl, higher_order.scan, higher_order.associative_scan, higher_order.flex_attention,
         higher_order.with_effects, name="higher-order op: its subgraphs place its results")(_placed_by_subgraphs)
