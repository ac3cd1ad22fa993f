"""Autocast regions: which calls autocast casts, asked of torch's own autocast kernels on fake tensors."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...engine import session as context
from ... import symbolic
from ...devices import device_of, tag
from ...errors import UnsupportedError
from ...kinds import is_python_operator
from ...resolve.registry import rule, target_name
from ...torch_compat import (FakeTensor, FakeTensorMode, HigherOrderOperator, OpOverload, TorchDispatchMode,
                             autocast_region_calls, check, has_kernel_for_dispatch_key, is_composite_implicit, pytree,
                             without_ambient_modes)
from .common import walk

aten = torch.ops.aten
higher_order = torch.ops.higher_order


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
        return walk(wrapped_func, args, ("autocast", _autocast_regions()), _autocast_call)


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
    if not active or not _autocast_may_cast(target, args, kwargs, active):
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


def _autocast_may_cast(target: Any, args: tuple, kwargs: dict, active: dict) -> bool:
    """Whether autocast may change the call: an aten op with an autocast kernel for an active device,
    or a composite whose parts may have one; torch-level functions and methods are asked, and so
    are python's operators on tensors (``x @ y`` is ``matmul``'s)."""
    if isinstance(target, HigherOrderOperator):
        return False
    if is_python_operator(target):
        return any(isinstance(value, torch.Tensor) for value in (*args, *kwargs.values()))
    if not isinstance(target, OpOverload):
        return True
    name = target.name()
    for device in active:
        try:
            if has_kernel_for_dispatch_key(name, _AUTOCAST_KEYS.get(device, "")):
                return True
        except RuntimeError:  # a device type whose autocast key this torch does not know
            return True
    return is_composite_implicit(target)


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
        if isinstance(target, OpOverload) and not is_composite_implicit(target):
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
