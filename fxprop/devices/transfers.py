"""The table of ops that choose or change where their result lives, and how it is consulted.

Each entry maps a target (a Tensor method name, a torch callable, an aten overload or packet)
to a rule. A rule reads the call and returns a `Placement`: the device of the result, and the
call rewritten so that it computes on meta tensors (device arguments become "meta").
Ops with no entry follow `default_placement`: an explicit ``device=`` argument, else the
common device of the tensor inputs, else the CPU (as c10 defaults an unset device).

The entries live by family: moves between devices (this module), factories
(`factories`), values read to the host (`host_values`) and indexing with indices on
another device (`indexing`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from ..torch_compat import OpOverload, OpOverloadPacket, schema_of

from ..call import Call, tensors_in
from ..errors import PropagationError, RuleRegistrationError
from .placement import CPU, META, device_of, merge_devices, normalize_device

aten = torch.ops.aten


@dataclass(frozen=True)
class Placement:
    """Where the result of one call lives, and the call to run on meta tensors to shape it.

    ``device`` is None for a call that produces no tensor, or whose tensors keep the devices they
    have (an item of a sequence). ``host_value`` short-cuts the
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
    """Register a device rule for targets; a target may have only one.

    An aten `OpOverloadPacket` registers the packet (for graphs that call it) and each of its
    overloads (for graphs from torch.export / make_fx).
    """
    def register(fn: DeviceRule) -> DeviceRule:
        for target in _expand(targets):
            if target in TRANSFERS:
                raise RuleRegistrationError(f"a device rule for {target!r} is already registered "
                                            f"({TRANSFERS[target][0]})")
            TRANSFERS[target] = (name, fn)
        return fn
    return register


def _expand(targets: Iterable[Any]) -> list[Any]:
    expanded = []
    for target in targets:
        expanded.append(target)
        if isinstance(target, OpOverloadPacket):
            expanded.extend(getattr(target, overload) for overload in target.overloads())
    return expanded


def everywhere(name: str, *, aten_name: str | None = None) -> tuple[Any, ...]:
    """Every spelling of one op an FX graph may hold: ``x.name(...)`` (a call_method target),
    ``torch.Tensor.name``, ``torch.name``, ``torch.nn.functional.name`` and ``aten.name``."""
    found: list[Any] = [name]
    for owner in (torch.Tensor, torch, torch.nn.functional):
        candidate = getattr(owner, name, None)
        if callable(candidate) and candidate not in found:
            found.append(candidate)
    packet = getattr(aten, aten_name or name, None)
    if isinstance(packet, OpOverloadPacket):
        found.append(packet)
    return tuple(found)


def onto_meta(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with every device argument made "meta" and pinning dropped."""
    args = tuple(META if isinstance(a, torch.device) else a for a in args)
    kwargs = {key: META if key == "device" and value is not None else value for key, value in kwargs.items()}
    if kwargs.get("pin_memory"):
        kwargs["pin_memory"] = False
    return args, kwargs


def default_placement(target: Any, args: tuple, kwargs: dict, tensors: list[torch.Tensor] | None = None) -> Placement:
    """An explicit device argument, else the inputs' common device, else the CPU (``tensors``: the
    call's tensors, when already found)."""
    explicit = kwargs.get("device")
    if explicit is None:
        explicit = next((a for a in args if isinstance(a, torch.device)), None)
    if explicit is not None:
        return Placement(normalize_device(explicit), target, *onto_meta(args, kwargs), "explicit device argument")
    common = merge_devices(tensors_in(args, kwargs) if tensors is None else tensors)
    if common is None:
        if isinstance(target, OpOverload) and any(a.name == "device" for a in schema_of(target).arguments):
            kwargs = {**kwargs, "device": META}  # an aten factory: `with torch.device("meta")` does not reach it
        return Placement(CPU, target, *onto_meta(args, kwargs), "no tensor inputs: the CPU")
    return Placement(common, target, *onto_meta(args, kwargs), "common device of inputs", transfer=False)


def place(call: Call) -> Placement:
    """The placement for one call: its table entry's, else the default rule's."""
    target = call.target
    entry = TRANSFERS.get(target) if _hashable(target) else None
    if entry is None:
        return default_placement(target, call.args, call.kwargs, call.tensors)
    return entry[1](target, call.args, call.kwargs)


def _hashable(target: Any) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


def bind(op: OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An aten overload's arguments by name, defaults filled in from its schema."""
    bound: dict[str, Any] = {}
    positional = list(args)
    for argument in schema_of(op).arguments:
        if positional and not argument.kwarg_only:
            bound[argument.name] = positional.pop(0)
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def self_device(args: tuple, kwargs: dict, name: str) -> torch.device:
    """The device of the op's first tensor argument (``self``/``input``)."""
    self = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if not isinstance(self, torch.Tensor):
        raise PropagationError(f"{name}: expected a tensor as the first argument, got {type(self).__name__}")
    return device_of(self)


# --- moves between devices -------------------------------------------------------------

def _move(self: torch.Tensor, device: torch.device, rule: str, *, dtype=None, copy=False,
          non_blocking=False, memory_format=None) -> Placement:
    """``self.to(device, dtype)``: a fresh tensor when the device changes, as torch makes one."""
    moved = device != device_of(self)
    kwargs = {"copy": bool(copy) or moved, "memory_format": memory_format or torch.preserve_format}
    if dtype is not None:
        kwargs["dtype"] = dtype
    return Placement(device, torch.Tensor.to, (self,), kwargs, rule)


def _is_device_like(value: Any) -> bool:
    return isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool))


def _parse_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.device, dict]:
    """Tensor.to's overloads: (device, dtype, ...), (dtype, ...), (tensor, ...), keywords."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    other = kwargs.pop("other", None)
    kwargs.pop("layout", None)      # to.dtype_layout: only strided tensors are propagated
    kwargs.pop("pin_memory", None)  # pinning does not change the device
    rest = list(args)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
    elif rest and (rest[0] is None or _is_device_like(rest[0])):
        device = rest.pop(0)
    if other is not None:
        device, dtype = device_of(other), other.dtype
    if rest and (rest[0] is None or isinstance(rest[0], torch.dtype)):
        dtype = rest.pop(0) or dtype
    for name, value in zip(("non_blocking", "copy", "memory_format"), rest):
        kwargs[name] = value
    target = device_of(self) if device is None else normalize_device(device)
    return target, {"dtype": dtype, **kwargs}


@transfer("to", torch.Tensor.to, aten.to, name="Tensor.to")
def tensor_to(target, args, kwargs):
    """Tensor.to(device, dtype, non_blocking, copy, memory_format), (dtype, ...), (other, ...)."""
    self, *rest = args
    if target in (aten.to.prim_dtype, aten.to.prim_other):  # TorchScript's (self, int? dtype, ...): no move
        return Placement(device_of(self), target, args, kwargs, "Tensor.to", transfer=False)
    device, options = _parse_to(self, *rest, **kwargs)
    return _move(self, device, "Tensor.to", **options)


def _backend_move(device_type: str) -> DeviceRule:
    """``x.cuda(device=None, non_blocking=False, memory_format=...)`` and its siblings."""
    def rule(target, args, kwargs):
        self, *rest = args
        index = kwargs.get("device", rest[0] if rest else None)
        if index is None or isinstance(index, int):
            device = normalize_device(torch.device(device_type, index))
        else:
            device = normalize_device(index)
        if device.type != device_type:
            raise PropagationError(f"Tensor.{device_type}: invalid device, expected a {device_type} device, "
                                   f"got {device}")
        return _move(self, device, f"Tensor.{device_type}", non_blocking=kwargs.get("non_blocking", False),
                     memory_format=kwargs.get("memory_format"))
    return rule


BACKEND_MOVES = tuple(name for name in ("cuda", "xpu", "mtia") if hasattr(torch.Tensor, name))
for _device_type in BACKEND_MOVES:
    transfer(_device_type, getattr(torch.Tensor, _device_type), name=f"Tensor.{_device_type}")(
        _backend_move(_device_type))


@transfer("cpu", torch.Tensor.cpu, name="Tensor.cpu")
def tensor_cpu(target, args, kwargs):
    return _move(args[0], CPU, "Tensor.cpu", memory_format=kwargs.get("memory_format"))


@transfer("type", torch.Tensor.type, name="Tensor.type")
def tensor_type(target, args, kwargs):
    """x.type() is a host string; x.type("torch.cuda.HalfTensor") moves, as the name says."""
    self, *rest = args
    wanted = kwargs.get("dtype", rest[0] if rest else None)
    if wanted is None:
        return host(_type_name(self.dtype, device_of(self)), "Tensor.type")
    if isinstance(wanted, torch.dtype):
        return _move(self, device_of(self), "Tensor.type", dtype=wanted)
    name = wanted if isinstance(wanted, str) else f"{wanted.__module__}.{wanted.__name__}"
    on_cuda = name.startswith("torch.cuda.")
    dtype = getattr(torch, name.rsplit(".", 1)[-1]).dtype
    device = normalize_device("cuda") if on_cuda else CPU
    if device.type == device_of(self).type:
        device = device_of(self)  # torch keeps the index when the backend does not change
    return _move(self, device, "Tensor.type", dtype=dtype, non_blocking=kwargs.get("non_blocking", False))


def _type_name(dtype: torch.dtype, device: torch.device) -> str:
    base = torch.empty((), dtype=dtype, device="meta").type().removeprefix("torch.meta.")
    return f"torch.{base}" if device.type == "cpu" else f"torch.{device.type}.{base}"


@transfer(aten._to_copy, name="aten._to_copy")
def to_copy(target, args, kwargs):
    """_to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)."""
    device = kwargs.get("device")
    result = normalize_device(device) if device is not None else device_of(args[0])
    return Placement(result, target, *onto_meta(args, kwargs), "aten._to_copy")


@transfer(*everywhere("copy_"), aten.copy, name="copy_: into self from any device")
def copy_from_any_device(target, args, kwargs):
    """copy_(self, src, non_blocking) copies across devices; the result lives with self."""
    return Placement(self_device(args, kwargs, "copy_"), target, *onto_meta(args, kwargs),
                     "copy_: into self from any device")


def host(value: Any, rule: str) -> Placement:
    """A python value known without computing: no tensor, no device."""
    return Placement(None, None, (), {}, rule, host_value=value, has_host_value=True)
