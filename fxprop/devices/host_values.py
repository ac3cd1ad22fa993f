"""Values read off a tensor onto the host: python values, never tensors on the target device.

- device attributes (``x.device``, ``x.is_cuda``, ``x.get_device()``, ``x.type()``) are known
  from the logical device alone, and so are that device's own (``x.device.type``);
- ``x.item()`` and ``x.tolist()`` need data: like every op no rule covers, they run on host
  CPU stand-ins (`fxprop.kinds.fallback`), whose values are the user's own for small integer
  inputs passed for real and placeholders otherwise;
- ``nonzero``'s count is such a value too: its result lives with the input, sized on the host.
"""
from __future__ import annotations

import builtins

import torch

from .placement import device_of
from .transfers import Placement, default_placement, everywhere, host, self_device, transfer

aten = torch.ops.aten

DEVICE_ATTRIBUTES = {
    "device": lambda device: device,
    "is_cuda": lambda device: device.type == "cuda",
    "is_cpu": lambda device: device.type == "cpu",
    "is_meta": lambda device: device.type == "meta",
    "is_xpu": lambda device: device.type == "xpu",
    "is_mps": lambda device: device.type == "mps",
}


@transfer(builtins.getattr, name="getattr")
def getattr_rule(target, args, kwargs):
    obj, name, *default = args
    if isinstance(obj, torch.Tensor) and name in DEVICE_ATTRIBUTES:
        return host(DEVICE_ATTRIBUTES[name](device_of(obj)), f"Tensor.{name}")
    if isinstance(obj, torch.device):  # a logical device's ``type`` / ``index``, never the host's
        return host(builtins.getattr(obj, name, *default), f"torch.device.{name}")
    return default_placement(target, args, kwargs)


@transfer("get_device", torch.Tensor.get_device, name="Tensor.get_device")
def get_device(target, args, kwargs):
    device = device_of(args[0])
    return host(device.index if device.type != "cpu" else -1, "Tensor.get_device")


@transfer("item", torch.Tensor.item, name="Tensor.item: read on the host")
def item(target, args, kwargs):
    return Placement(None, target, args, kwargs, "Tensor.item: read on the host")


@transfer("tolist", torch.Tensor.tolist, name="Tensor.tolist: read on the host")
def tolist(target, args, kwargs):
    return Placement(None, target, args, kwargs, "Tensor.tolist: read on the host")


def _sized_on_host(name: str):
    def rule(target, args, kwargs):
        return Placement(self_device(args, kwargs, name), target, args, kwargs,
                         f"{name}: lives with the input, count read on the host")
    return rule


for _name in ("nonzero", "argwhere"):
    transfer(*everywhere(_name), name=_name)(_sized_on_host(_name))
