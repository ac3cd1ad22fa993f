"""The table of ops that choose or change where their result lives.

Each entry maps a target (a Tensor method name, a torch callable or an aten overload) to a
rule. A rule reads the call and returns a `Placement`: the device of the result, and the
call rewritten so that it computes on meta tensors (device arguments become "meta").
Ops with no entry follow `default_placement`: an explicit ``device=`` argument, else the
common device of the tensor inputs, else torch's default device.
"""
from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .placement import META, default_device, device_of, merge_devices, normalize_device

aten = torch.ops.aten


@dataclass(frozen=True)
class Placement:
    """Where the result of one call lives, and the call to run on meta tensors to shape it.

    ``device`` is None for a call that produces no tensor. ``host_value`` short-cuts the
    meta computation for calls whose result is a plain python value derived from devices.
    """
    device: torch.device | None
    target: Any
    args: tuple
    kwargs: dict
    rule: str
    host_value: Any = None
    has_host_value: bool = False
    transfer: bool = True  # False when the default rule (the inputs' common device) decided


DeviceRule = Callable[[Any, tuple, dict], Placement]
TRANSFERS: dict[Any, tuple[str, DeviceRule]] = {}


def transfer(*targets: Any, name: str) -> Callable[[DeviceRule], DeviceRule]:
    """Register a device rule for targets; a target may have only one."""
    def register(fn: DeviceRule) -> DeviceRule:
        for target in targets:
            if target in TRANSFERS:
                from ..errors import RuleRegistrationError
                raise RuleRegistrationError(f"a device rule for {target!r} is already registered")
            TRANSFERS[target] = (name, fn)
        return fn
    return register


def tensors_in(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    visit(args)
    visit(kwargs)
    return found


def _is_device_like(value: Any) -> bool:
    return isinstance(value, torch.device)


def _to_meta(value: Any) -> Any:
    return META if isinstance(value, torch.device) else value


def default_placement(target: Any, args: tuple, kwargs: dict) -> Placement:
    """An explicit device argument, else the inputs' common device, else the default device."""
    explicit = kwargs.get("device")
    if explicit is None:
        explicit = next((a for a in args if _is_device_like(a)), None)
    if explicit is not None:
        device = normalize_device(explicit)
        kwargs = {**kwargs, "device": META} if "device" in kwargs else kwargs
        args = tuple(_to_meta(a) for a in args)
        return Placement(device, target, args, _without_pinning(kwargs), "explicit device argument")
    common = merge_devices(tensors_in(args, kwargs))
    if common is None:
        return Placement(default_device(), target, args, _without_pinning(kwargs), "default device")
    return Placement(common, target, args, _without_pinning(kwargs), "common device of inputs", transfer=False)


def _without_pinning(kwargs: dict) -> dict:
    if kwargs.get("pin_memory"):
        return {**kwargs, "pin_memory": False}
    return kwargs


def place(target: Any, args: tuple, kwargs: dict) -> Placement:
    """The placement for one call: its table entry's, else the default rule's."""
    entry = TRANSFERS.get(target) if _hashable(target) else None
    if entry is None:
        return default_placement(target, args, kwargs)
    return entry[1](target, args, kwargs)


def _hashable(target: Any) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


# --- moves between devices -------------------------------------------------------------

def _move(self: torch.Tensor, device: torch.device, rule: str, *, dtype=None, copy=False,
          non_blocking=False, memory_format=torch.preserve_format) -> Placement:
    moved = device != device_of(self)
    kwargs = {"copy": copy or moved, "memory_format": memory_format}
    if dtype is not None:
        kwargs["dtype"] = dtype
    return Placement(device, torch.Tensor.to, (self,), kwargs, rule)


def _parse_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.device, dict]:
    """Tensor.to's overloads: (device, dtype, ...), (dtype, ...), (tensor, ...), keywords."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    rest = list(args)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        device, dtype = device_of(other), other.dtype
    elif rest and (isinstance(rest[0], (str, torch.device)) or (isinstance(rest[0], int) and not isinstance(rest[0], bool))):
        device = rest.pop(0)
    if rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    for name, value in zip(("non_blocking", "copy"), rest):
        kwargs[name] = value
    target = device_of(self) if device is None else normalize_device(device)
    return target, {"dtype": dtype, **kwargs}


@transfer("to", torch.Tensor.to, name="Tensor.to")
def tensor_to(target, args, kwargs):
    self, *rest = args
    device, options = _parse_to(self, *rest, **kwargs)
    return _move(self, device, "Tensor.to", **options)


def _backend_move(device_type: str) -> DeviceRule:
    def rule(target, args, kwargs):
        self, *rest = args
        index = kwargs.get("device", rest[0] if rest else None)
        if index is None or isinstance(index, int):
            device = normalize_device(torch.device(device_type, index))
        else:
            device = normalize_device(index)
        return _move(self, device, f"Tensor.{device_type}",
                     non_blocking=kwargs.get("non_blocking", False),
                     memory_format=kwargs.get("memory_format", torch.preserve_format))
    return rule


for _device_type in ("cuda", "xpu", "mtia"):
    if hasattr(torch.Tensor, _device_type):
        transfer(_device_type, getattr(torch.Tensor, _device_type), name=f"Tensor.{_device_type}")(
            _backend_move(_device_type))


@transfer("cpu", torch.Tensor.cpu, name="Tensor.cpu")
def tensor_cpu(target, args, kwargs):
    return _move(args[0], torch.device("cpu"), "Tensor.cpu",
                 memory_format=kwargs.get("memory_format", torch.preserve_format))


# --- values read off the device --------------------------------------------------------

def _host(value: Any, rule: str) -> Placement:
    return Placement(None, None, (), {}, rule, host_value=value, has_host_value=True)


@transfer(builtins.getattr, name="getattr")
def getattr_rule(target, args, kwargs):
    obj, name, *default = args
    if isinstance(obj, torch.Tensor) and name in _DEVICE_ATTRIBUTES:
        return _host(_DEVICE_ATTRIBUTES[name](device_of(obj)), f"Tensor.{name}")
    return default_placement(target, args, kwargs)


_DEVICE_ATTRIBUTES = {
    "device": lambda device: device,
    "is_cuda": lambda device: device.type == "cuda",
    "is_cpu": lambda device: device.type == "cpu",
    "is_meta": lambda device: device.type == "meta",
    "is_xpu": lambda device: device.type == "xpu",
    "is_mps": lambda device: device.type == "mps",
}


@transfer("get_device", torch.Tensor.get_device, name="Tensor.get_device")
def get_device(target, args, kwargs):
    device = device_of(args[0])
    return _host(device.index if device.type != "cpu" else -1, "Tensor.get_device")


# --- indexing with an index on another device ------------------------------------------

def _on_self(rule: str) -> DeviceRule:
    """The result lives with the indexed tensor; index tensors may sit on the CPU."""
    def placement(target, args, kwargs):
        self = args[0]
        if not isinstance(self, torch.Tensor):
            return default_placement(target, args, kwargs)
        return Placement(device_of(self), target, args, kwargs, rule)
    return placement


for _target, _name in ((operator.getitem, "getitem"), (aten.index.Tensor, "aten.index.Tensor"),
                       (aten._unsafe_index.Tensor, "aten._unsafe_index.Tensor")):
    transfer(_target, name=_name)(_on_self(_name))
