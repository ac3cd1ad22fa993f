"""The forms fxprop writes into ``node.meta``: FakeTensors for "val", TensorMetadata for "tensor_meta".

A FakeTensor here is only a container for a meta tensor and its logical device, built the
way FakeTensorMode builds its own, so that passes reading ``node.meta["val"]`` see what
torch.export would have left there.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from ..symbolic import known_laid_out_in
from ..torch_compat import (FakeTensor, FakeTensorMode, has_symbolic_sizes, make_subclass, set_throw_on_mutable_data_ptr,
                            size_expression)
from torch.fx.passes.shape_prop import TensorMetadata

_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
_constructor_states: "weakref.WeakKeyDictionary[FakeTensorMode, dict]" = weakref.WeakKeyDictionary()


class FakeTensorFactory:
    """Builds FakeTensors for one FakeTensorMode.

    The mode's first container is built by FakeTensor's own constructor; later ones copy the
    state it set, which halves the cost per node and stays faithful to whatever the constructor
    sets. That state is the mode's (its settings' and the mode itself), kept as long as the mode lives.
    """

    def __init__(self, mode: FakeTensorMode):
        self.mode = mode
        self._state: dict | None = _constructor_states.get(mode)

    def __call__(self, meta: torch.Tensor, device: torch.device) -> FakeTensor:
        return self.from_snapshot(meta, device, meta.requires_grad)

    def from_snapshot(self, meta: torch.Tensor, device: torch.device, requires_grad: bool) -> FakeTensor:
        """A FakeTensor over ``meta``'s sizes, strides and storage (``requires_grad`` its own)."""
        if self._state is None:
            fake = FakeTensor(self.mode, meta, device, requires_grad=requires_grad)
            self._state = _constructor_states[self.mode] = dict(fake.__dict__)
            return fake
        fake = make_subclass(FakeTensor, meta, requires_grad, dispatch_device=True, device_for_backend_keys=device)
        set_throw_on_mutable_data_ptr(fake)
        if "_fake_device" in self._state:
            fake.__dict__ = {**self._state, "_fake_device": device}  # already normalized by fxprop.devices
        else:
            fake.__dict__ = dict(self._state)
            fake.fake_device = device
        return fake


def tensor_metadata(meta: torch.Tensor, symbolic_formats: dict | None = None) -> TensorMetadata:
    """What `torch.fx.passes.shape_prop.ShapeProp` records for a tensor. With symbolic sizes the
    memory format is one the sizes decide without an assumption, as ShapeProp decides it;
    ``symbolic_formats`` keeps those decisions for one ShapeEnv, by the sizes' expressions."""
    shape = meta.shape
    stride = meta.stride()
    memory_format = None
    if has_symbolic_sizes(meta):
        key = tuple(size_expression(size) if isinstance(size, torch.SymInt) else size for size in (*shape, None, *stride))
        if symbolic_formats is not None and key in symbolic_formats:
            memory_format = symbolic_formats[key]
        else:
            memory_format = next((candidate for candidate in _FORMATS if known_laid_out_in(shape, stride, candidate)),
                                 None)
            if symbolic_formats is not None:
                symbolic_formats[key] = memory_format
    else:
        memory_format = _memory_format(shape, stride, meta)
    return TensorMetadata(shape, meta.dtype, meta.requires_grad, stride, memory_format, False, {})


_formats_by_layout: dict[tuple, torch.memory_format | None] = {}  # a fact of sizes and strides alone
_FORMATS_KEPT = 1 << 14
_UNDECIDED = object()


def _memory_format(shape: torch.Size, stride: tuple, meta: torch.Tensor) -> torch.memory_format | None:
    key = (shape, stride)
    found = _formats_by_layout.get(key, _UNDECIDED)
    if found is not _UNDECIDED:
        return found
    found = None
    for candidate in _FORMATS:
        try:
            if meta.is_contiguous(memory_format=candidate):
                found = candidate
                break
        except RuntimeError:
            continue
    if len(_formats_by_layout) < _FORMATS_KEPT:
        _formats_by_layout[key] = found
    return found


def map_structure(fn, value: Any) -> Any:
    """Apply ``fn`` to every tensor in a value made of tuples, lists, dicts and named tuples."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        mapped = [map_structure(fn, item) for item in value]
        if isinstance(value, list):
            return mapped
        if type(value).__module__ == "torch.return_types":
            return type(value)(mapped)
        if hasattr(value, "_fields"):
            return type(value)(*mapped)
        return tuple(mapped)
    if isinstance(value, dict):
        return {key: map_structure(fn, item) for key, item in value.items()}
    return value
