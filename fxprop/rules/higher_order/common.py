"""What every higher-order rule shares: walking a subgraph, fresh results, the autograd Function
convention of torch's eager kernels, and comparing a loop's carried values."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ...engine import session as context
from ... import symbolic
from ...devices import device_of, tag
from ...call import tensors_in
from ...devices.transfers import Placement
from ...torch_compat import check

aten = torch.ops.aten
higher_order = torch.ops.higher_order


def walk(subgraph: Any, inputs: Any, context_key: Any = None, around: Callable | None = None) -> Any:
    """Propagate ``subgraph`` on ``inputs``, annotating its nodes; its output as meta tensors."""
    check(isinstance(subgraph, torch.fx.GraphModule),
          lambda: f"expected a subgraph (a torch.fx.GraphModule), got {type(subgraph).__name__}")
    return context.current_session().walk_subgraph(subgraph, list(inputs), context_key, around)


def fresh(shape: Any, stride: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return tag(torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta"), device)


def fresh_like(value: Any) -> Any:
    """A new tensor with ``value``'s metadata (not an alias of it); python values are kept."""
    if isinstance(value, torch.Tensor):
        return fresh(value.shape, value.stride(), value.dtype, device_of(value))
    return value


def stacked(value: Any, length: Any) -> Any:
    """``length`` results of one step stacked along a new leading dim, as torch.stack lays them out."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = (length, *value.shape)
    return fresh(shape, symbolic.contiguous_strides(shape), value.dtype, device_of(value))


def is_zero(size: Any) -> bool:
    return isinstance(size, int) and size == 0


def step_slice(x: torch.Tensor) -> torch.Tensor:
    """What a step of map or scan sees of ``x``: ``x[i]``, laid out as ``x`` is without its leading dim."""
    check(isinstance(x, torch.Tensor) and x.dim() > 0,
          lambda: f"the scanned inputs must be tensors with a leading dim to iterate over, got {describe(x)}")
    return fresh(x.shape[1:], x.stride()[1:], x.dtype, device_of(x))


class ThroughFunction(torch.autograd.Function):
    """Stands for the autograd Function torch's kernel runs: the given results, made its outputs."""

    @staticmethod
    def forward(ctx, outputs, non_differentiable, *inputs):
        ctx.mark_non_differentiable(*(outputs[i] for i in non_differentiable))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - propagation never runs backward
        raise RuntimeError("fxprop's stand-in for a higher-order op has no backward")


def through_autograd_function(outputs: list, inputs: Any, non_differentiable: tuple[int, ...] = ()) -> list:
    """``outputs`` as an autograd Function returns them: with grad mode on and any input requiring
    grad, every floating-point output requires grad (integer ones cannot, nor those at the positions
    the Function marks ``non_differentiable``); otherwise none does."""
    differentiable = [t for t in tensors_in(inputs, {}) if t.requires_grad]
    if not (torch.is_grad_enabled() and differentiable):
        return list(outputs)
    positions = [i for i, value in enumerate(outputs) if isinstance(value, torch.Tensor)]
    devices = [device_of(outputs[i]) for i in positions]
    marked = tuple(positions.index(i) for i in non_differentiable if i in positions)
    wrapped = ThroughFunction.apply([outputs[i] for i in positions], marked, *differentiable)
    result = list(outputs)
    for i, tensor, device in zip(positions, wrapped, devices):
        result[i] = tag(tensor, device)
    return result


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"Tensor(shape={tuple(symbolic.user_shape(value))}, dtype={value.dtype}, device={device_of(value)}, "
                f"stride={tuple(value.stride())})")
    return f"{type(value).__name__} {value!r}"


def differences(expected: Any, got: Any, strides: bool = True) -> list[str]:
    """How ``got`` differs from ``expected`` in what must stay fixed from one step to the next:
    shape, dtype, device, and the strides of dims that address memory (torch compares the same)."""
    if isinstance(expected, torch.Tensor) != isinstance(got, torch.Tensor):
        return [f"type: {describe(expected)} vs {describe(got)}"]
    if not isinstance(expected, torch.Tensor):
        both_ints = all(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in (expected, got))
        return [] if both_ints or type(expected) is type(got) else [f"type: {describe(expected)} vs {describe(got)}"]
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


def check_fixed_point(op: str, before_name: str, after_name: str, before: list, after: list,
                       strides: bool = True) -> None:
    check(len(before) == len(after),
          lambda: f"{op}: expected {before_name} and {after_name} to have the same number of values, got "
                  f"{len(before)} and {len(after)}")
    diffs = [f"  [{i}] {diff}" for i, (a, b) in enumerate(zip(before, after))
             for diff in differences(a, b, strides)]
    check(not diffs, lambda: f"{op}: {after_name} must have the metadata of {before_name} (the same every step), "
                             f"but they differ:\n" + "\n".join(diffs))


def fresh_int(a: Any, b: Any = None) -> Any:
    """A fresh symbol for an int that depends on the data (between ``a`` and ``b`` when both are known)."""
    session = symbolic.current()
    if b is not None and isinstance(a, int) and isinstance(b, int) and min(a, b) >= 0:
        return session.fresh_size(max(a, b), lower=min(a, b))
    return session.fresh_value(torch.int64)


def placed_by_subgraphs(target: Any, args: tuple, kwargs: dict) -> Placement:
    return Placement(None, target, args, kwargs, "higher-order op: its subgraphs place its results")


def fill_order(strides: tuple) -> list[int]:
    """Dims from the innermost stride out; of equal strides the inner dim first (inductor's argsort)."""
    def compare(i: int, j: int) -> int:
        if symbolic.definitely_equal(strides[i], strides[j]):
            return j - i
        less = symbolic.resolve(strides[i] < strides[j])
        return -1 if less is True else 1 if less is False else j - i
    return sorted(range(len(strides)), key=functools.cmp_to_key(compare))
