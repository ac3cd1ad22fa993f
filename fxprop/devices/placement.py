"""Where a value lives: normalizing device names and merging the devices of an op's inputs.

Internally every tensor is a meta tensor; its logical device rides along as an attribute
set by the engine (`tag` / `device_of`), because a meta tensor's own `.device` is "meta".
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterable

import torch

from ..errors import DeviceMismatchError, InputError

META = torch.device("meta")
CPU = torch.device("cpu")
_ATTR = "_fxprop_device"
_INDEXED_TYPES = frozenset({"cuda", "xpu", "mps", "hpu", "mtia", "xla", "privateuseone"})


def normalize_device(device: torch.device | str | int | None) -> torch.device:
    """`torch.device` as torch stores it on a tensor: "cuda" becomes "cuda:0", ints mean cuda."""
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise InputError(f"a device index must be non-negative, got {device}")
        parsed = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError as error:
            raise InputError(f"unknown device {device!r}: {error}") from None
    else:
        raise InputError(f"expected a device (torch.device, str or int), got {type(device).__name__}: {device!r}")
    if parsed.index is None and parsed.type in _INDEXED_TYPES:
        return torch.device(parsed.type, _current_index(parsed.type))
    return parsed


def _current_index(device_type: str) -> int:
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def tag(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    setattr(tensor, _ATTR, device)
    return tensor


def device_of(tensor: torch.Tensor) -> torch.device:
    """The logical device of an internal meta tensor (its own device for any other tensor)."""
    return getattr(tensor, _ATTR, None) or tensor.device


_logical_default = threading.local()


def configured_default_device() -> torch.device | None:
    """The device torch's factory functions default to, or None when none is set (the CPU).

    Read from ``with torch.device(...)`` and `torch.set_default_device` as
    `torch.get_default_device` reads them, but without allocating: on a CPU-only build,
    asking torch for the index of a bare "cuda" would fail, here it normalizes to "cuda:0".
    """
    from ..torch_compat import DeviceContext, function_mode_stack, global_device_context

    modes = [mode for mode in function_mode_stack() if isinstance(mode, DeviceContext)]
    if modes:
        return normalize_device(modes[-1].device)
    context = global_device_context()
    if context is not None:
        return normalize_device(context.device)
    return None


def default_device() -> torch.device:
    """torch's default device when `propagate` was called (`torch.set_default_device`, `with torch.device`).

    The engine computes on meta under its own ``with torch.device("meta")``, so it pins the
    caller's default here first with `logical_default_device`.
    """
    return default_device_if_set() or CPU


def default_device_if_set() -> torch.device | None:
    """The pinned default device, or None when the caller had set none."""
    if getattr(_logical_default, "pinned", False):
        return _logical_default.device
    return configured_default_device()


@contextlib.contextmanager
def logical_default_device():
    outer = (getattr(_logical_default, "pinned", False), getattr(_logical_default, "device", None))
    if not outer[0]:
        _logical_default.pinned, _logical_default.device = True, configured_default_device()
    try:
        yield default_device()
    finally:
        _logical_default.pinned, _logical_default.device = outer


def merge_devices(tensors: Iterable[torch.Tensor], *, cpu_scalars_follow: bool = True) -> torch.device | None:
    """The device an op's result lives on: the common device of its tensor inputs.

    As in torch, a 0-dim CPU tensor may join tensors on another device and defers to it
    (unless ``cpu_scalars_follow`` is False: ops whose generated wrapper checks devices
    make no such exception). Two other tensors on different devices are refused, as the
    real kernel would refuse them. Returns None when there are no tensors.
    """
    common: torch.device | None = None
    common_is_cpu_scalar = False
    for tensor in tensors:
        device = device_of(tensor)
        is_cpu_scalar = cpu_scalars_follow and device.type == "cpu" and tensor.dim() == 0
        if common is None or (common_is_cpu_scalar and not is_cpu_scalar):
            common, common_is_cpu_scalar = device, is_cpu_scalar
        elif device != common and not is_cpu_scalar:
            raise DeviceMismatchError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{common} and {device}")
    return common
