"""Indexing and scattering with index tensors that live on another device.

What torch allows (``device_check`` in native_functions.yaml, and FakeTensor's own rules):

- Advanced indexing moves its index tensors to ``self``'s device: ``x[idx]``, ``aten.index``,
  ``_unsafe_index``, ``index_put(_)``, ``_unsafe_index_put``, ``_index_put_impl_`` (all
  ``device_check: NoCheck``). The values written must live with ``self`` or be a 0-dim
  tensor (on any device, which torch copies over).
- Scatters implemented by ``copy_`` take their source from any device: ``slice_scatter``,
  ``select_scatter``, ``diagonal_scatter``, ``as_strided_scatter``; so does ``x[0:2] = src``.
- Every other op with an index argument has its devices checked by its generated wrapper, which
  makes no exception for 0-dim CPU tensors: a CPU index into a cuda tensor is refused, as
  ``index_select``, ``gather``, ``scatter`` and ``embedding`` refuse it on a GPU.
"""
from __future__ import annotations

import operator

import torch

from ..errors import DeviceMismatchError
from .placement import device_of, merge_devices
from ..call import tensors_in
from .transfers import Placement, default_placement, everywhere, onto_meta, transfer

aten = torch.ops.aten

INDICES_FROM_ANY_DEVICE = ("index", "_unsafe_index")
PUTS_WITH_INDICES_FROM_ANY_DEVICE = ("index_put", "index_put_", "_unsafe_index_put", "_index_put_impl_")
SOURCE_FROM_ANY_DEVICE = ("slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter")
SAME_DEVICE_NO_CPU_SCALARS = (
    "index_select", "gather", "take", "take_along_dim", "put", "put_",
    "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
    "index_add", "index_add_", "index_copy", "index_copy_", "index_reduce", "index_reduce_",
    "masked_scatter", "masked_scatter_", "embedding",
    "nextafter",  # FakeTensor's one exception to the 0-dim CPU rule, matching eager mode
)


def _self(args: tuple, kwargs: dict):
    return args[0] if args else kwargs.get("input", kwargs.get("self"))


def _check_values(name: str, self: torch.Tensor, values) -> None:
    if isinstance(values, torch.Tensor) and device_of(values) != device_of(self) and values.dim() != 0:
        raise DeviceMismatchError(f"{name}: values must be on the device of self ({device_of(self)}) or be a "
                                  f"0-dim tensor, got values of shape {tuple(values.shape)} on {device_of(values)}")


def _with_self(self: torch.Tensor, target, args: tuple, kwargs: dict, rule: str) -> Placement:
    return Placement(device_of(self), target, *onto_meta(args, kwargs), rule)


@transfer(operator.getitem, name="x[index]: indices from any device")
def getitem(target, args, kwargs):
    self = args[0]
    if not isinstance(self, torch.Tensor):
        # an item of a tuple or list (a node's several outputs) is the tensor it was, on its own device
        return Placement(None, target, args, kwargs, "an item of a sequence keeps its device")
    return _with_self(self, target, args, kwargs, "x[index]: indices from any device")


@transfer(operator.setitem, name="x[index] = values")
def setitem(target, args, kwargs):
    self, index, values = args
    if not isinstance(self, torch.Tensor):
        return default_placement(target, args, kwargs)
    if tensors_in((index,), {}):
        _check_values("x[index] = values (index_put_)", self, values)
    return _with_self(self, target, args, kwargs, "x[index] = values")


def _others_from_any_device(name: str, others: str):
    """The result lives with ``self``; the named other tensors may sit on any device."""
    def rule(target, args, kwargs):
        return _with_self(_self(args, kwargs), target, args, kwargs, f"{name}: {others} from any device")
    return rule


def _put_with_indices_from_any_device(name: str):
    def rule(target, args, kwargs):
        self = _self(args, kwargs)
        values = args[2] if len(args) > 2 else kwargs.get("values")
        _check_values(name, self, values)
        return _with_self(self, target, args, kwargs, f"{name}: indices from any device")
    return rule


def _same_device_no_cpu_scalars(name: str):
    def rule(target, args, kwargs):
        device = merge_devices(tensors_in(args, kwargs), cpu_scalars_follow=False)
        return Placement(device, target, *onto_meta(args, kwargs), f"{name}: all tensors on one device",
                         transfer=False)
    return rule


for _name in INDICES_FROM_ANY_DEVICE:
    transfer(*everywhere(_name), name=_name)(_others_from_any_device(_name, "indices"))
for _name in PUTS_WITH_INDICES_FROM_ANY_DEVICE:
    transfer(*everywhere(_name), name=_name)(_put_with_indices_from_any_device(_name))
for _name in SOURCE_FROM_ANY_DEVICE:
    transfer(*everywhere(_name), name=_name)(_others_from_any_device(_name, "source"))
for _name in SAME_DEVICE_NO_CPU_SCALARS:
    transfer(*everywhere(_name), name=_name)(_same_device_no_cpu_scalars(_name))
# ``tensor_split`` reads a tensor of indices or sections on the host: on the CPU, which its rule checks
transfer(*everywhere("tensor_split"), name="tensor_split")(_others_from_any_device("tensor_split", "indices"))
