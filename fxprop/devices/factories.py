"""Factories: where a freshly made tensor lives.

- torch-level constructors (`torch.zeros`, `torch.arange`, ...): the ``device=`` argument,
  else torch's default device when `propagate` was called (`torch.set_default_device`,
  ``with torch.device(...)``), else, for `torch.tensor`/`as_tensor`/`asarray` of a tensor,
  the data's device, else the CPU. These are exactly the functions torch's default-device
  mode intercepts (`torch.utils._device._device_constructors`).
- aten factories (graphs from torch.export / make_fx): ``device=`` else the CPU, because the
  default device applies only to python-level calls; an ``out=`` tensor's device for out variants.
  Ops that are factories in some overloads only (``normal.float_float`` beside
  ``normal.Tensor_Tensor``) follow the default rule, which tells them apart by their schema.
- ``*_like``: ``device=`` else the input's device. ``new_*``: ``device=`` else ``self``'s
  device (also for `new_tensor` of data on another device).
- pin_memory: only CPU tensors can be pinned; the pinned copy is a CPU tensor.
"""
from __future__ import annotations

import torch

from ..errors import DeviceMismatchError
from .placement import CPU, META, default_device_if_set, device_of, normalize_device
from .transfers import Placement, everywhere, onto_meta, self_device, transfer

aten = torch.ops.aten

CONSTRUCTORS = ("arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_permuted",
                "empty_strided", "eye", "full", "hamming_window", "hann_window", "kaiser_window", "linspace",
                "logspace", "ones", "rand", "randint", "randn", "randperm", "scalar_tensor", "tensor",
                "tril_indices", "triu_indices", "zeros")
FFT_CONSTRUCTORS = {"fftfreq": "fft_fftfreq", "rfftfreq": "fft_rfftfreq"}
TAKES_DATA = ("tensor", "as_tensor", "asarray")  # without a default device, a tensor's data keeps its device
LIKE = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like")
NEW = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor")


def _explicit(kwargs: dict) -> torch.device | None:
    device = kwargs.get("device")
    return normalize_device(device) if device is not None else None


def _constructor(name: str):
    def rule(target, args, kwargs):
        device = _explicit(kwargs) or default_device_if_set()
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if device is None and name in TAKES_DATA and isinstance(data, torch.Tensor):
            device = device_of(data)
        return Placement(device or CPU, target, *onto_meta(args, kwargs), f"torch.{name}: device argument, "
                         "else the default device")
    return rule


for _name in CONSTRUCTORS:
    transfer(getattr(torch, _name), name=f"torch.{_name}")(_constructor(_name))
for _name in FFT_CONSTRUCTORS:
    transfer(getattr(torch.fft, _name), name=f"torch.fft.{_name}")(_constructor(_name))


def _aten_factory(name: str):
    def rule(target, args, kwargs):
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            return Placement(device_of(out), target, *onto_meta(args, kwargs), f"aten.{name}.out: out's device")
        device = _explicit(kwargs) or CPU
        # the engine's `with torch.device("meta")` reaches python-level calls only: say "meta" here
        args, kwargs = onto_meta(args, {**kwargs, "device": META})
        return Placement(device, target, args, kwargs, f"aten.{name}: device argument, else the CPU")
    return rule


for _name in (*CONSTRUCTORS, *FFT_CONSTRUCTORS.values()):
    if _name in TAKES_DATA:
        continue  # aten::tensor / aten::as_tensor are TorchScript builtins, not graph ops
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        transfer(_packet, name=f"aten.{_name}")(_aten_factory(_name))


def _like_input(name: str):
    def rule(target, args, kwargs):
        device = _explicit(kwargs) or self_device(args, kwargs, name)
        return Placement(device, target, *onto_meta(args, kwargs), f"{name}: device argument, else the input's")
    return rule


for _name in (*LIKE, *NEW):
    transfer(*everywhere(_name), name=_name)(_like_input(_name))


def _pinned_copy(self: torch.Tensor, device=None) -> torch.Tensor:
    return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, requires_grad=self.requires_grad)


@transfer(*everywhere("pin_memory"), aten._pin_memory, name="pin_memory")
def pin_memory(target, args, kwargs):
    """A pinned copy lives on the CPU, with the same sizes and strides; only CPU tensors can be pinned."""
    device = self_device(args, kwargs, "pin_memory")
    if device.type != "cpu":
        raise DeviceMismatchError(f"pin_memory: only dense CPU tensors can be pinned, got a tensor on {device}")
    return Placement(CPU, _pinned_copy, args[:1], {}, "pin_memory")
