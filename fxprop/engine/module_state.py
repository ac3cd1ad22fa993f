"""Module state seen through meta tensors: parameters and buffers are never materialized.

`StateView` turns each parameter, buffer and tensor attribute into a meta tensor once per
`propagate` call, and builds shadow copies of modules whose state points at those meta
tensors, so running a module (BatchNorm's running-stat updates included) leaves the user's
module untouched. A shadow is an instance of the module's own class (its forward, hooks and
properties work as on the original). The containers it holds are copies, so nothing the module
appends or increments reaches the user's objects: lists, tuples (named ones too), sets, dicts of
any kind (Counter, OrderedDict, defaultdict), deques, SimpleNamespaces and dataclass instances,
copied as deep as they nest, each copied once per call so that what modules share stays shared.
Objects of other classes are the user's own, shared as they are.

A lazy module (`torch.nn.modules.lazy.LazyModuleMixin`) infers its parameters on its first call,
from a forward pre-hook that materializes them and turns the module into its ``cls_to_become``.
Its shadow does the same, on its own: each uninitialized parameter or buffer is a fresh
uninitialized one on meta, and the hook handles it removes point at the shadow's copies of the
hook dicts. The user's module stays lazy, as it was.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import types
import weakref
from typing import Any, Callable, Hashable

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils.hooks import RemovableHandle

from ..memo.signatures import Uncacheable, signature, values_signature
from ..devices import normalize_device, tag
from .known_values import KnownValues
from ..distributed.dtensors import as_parameter, internal_dtensor, is_dtensor
from .inputs import meta_like, values_worth_knowing
from ..torch_compat import own_state, version_counter

_STATE_SLOTS = ("_parameters", "_buffers", "_modules")


class StateView:
    def __init__(self, param_device: torch.device | str | None, known: KnownValues | None = None):
        self.param_device = normalize_device(param_device) if param_device is not None else None
        self.known = known
        self._tensors: dict[int, torch.Tensor] = {}
        self._shadows: dict[int, nn.Module] = {}
        self._signatures: dict[int, Hashable] = {}
        self._copies: dict[int, Any] = {}
        self._versions_made: dict[int, int] = {}
        self._keepalive: list[Any] = []
        self.adjust_shadow: Callable[[nn.Module, nn.Module], None] | None = None  # FSDP's hooks, emulated
        self.registered: dict[int, torch.Tensor] = {}  # by a parameter's id: what FSDP's emulation registers in its place

    def device_of_state(self, tensor: torch.Tensor) -> torch.device:
        if tensor.device.type == "meta" and self.param_device is not None:
            return self.param_device
        return tensor.device

    def tensor(self, real: torch.Tensor) -> torch.Tensor:
        """The meta stand-in for one parameter, buffer or constant (the same one on every use)."""
        found = self._tensors.get(id(real))
        if found is None and isinstance(real, UninitializedTensorMixin):
            # materialized by the shadow's own first call (the lazy module's pre-hook), on meta
            self._tensors[id(real)] = found = tag(type(real)(requires_grad=real.requires_grad, device="meta",
                                                             dtype=real.dtype), self.device_of_state(real))
            self._keepalive.append(real)
        if found is None:
            if is_dtensor(real):
                meta = internal_dtensor(real, meta_like)
                if isinstance(real, nn.Parameter):
                    meta = as_parameter(meta, real.requires_grad)
            elif isinstance(real, nn.Parameter):
                meta = meta_like(real.detach(), self.device_of_state(real))
                meta = tag(nn.Parameter(meta, requires_grad=real.requires_grad), self.device_of_state(real))
            else:
                meta = meta_like(real.detach(), self.device_of_state(real))
                meta.requires_grad_(real.requires_grad)
            if self.known is not None and values_worth_knowing(real):
                self.known.remember(meta, real)  # a counter (num_batches_tracked), an index buffer
            self._tensors[id(real)] = found = meta
            self._versions_made[id(meta)] = version_counter(meta)
            self._keepalive.append(real)
        return found

    def unwritten(self, meta: torch.Tensor) -> bool:
        """Whether nothing has written this stand-in since it was made (a module's own update of
        its buffer has, and the user's real buffer no longer holds its values)."""
        return self._versions_made.get(id(meta)) == version_counter(meta)

    def value(self, value: Any) -> Any:
        """The stand-in of a module attribute the graph reads (``get_attr``): a parameter FSDP has
        unsharded reads as the unsharded one, as the module's attribute does while it is gathered."""
        if isinstance(value, torch.Tensor):
            registered = self.registered.get(id(value))
            return registered if registered is not None else self.tensor(value)
        if isinstance(value, nn.Module):
            return self.shadow(value)
        return self._detached(value)  # a container (a list attribute the graph appends to): this call's copy

    def shadow(self, module: nn.Module) -> nn.Module:
        """A shallow copy of ``module`` whose tensors are meta stand-ins."""
        found = self._shadows.get(id(module))
        if found is not None:
            return found
        # object.__new__, not the class's own __new__: GraphModule.__new__ makes a new class per call.
        clone = object.__new__(type(module))
        self._shadows[id(module)] = clone
        self._keepalive.append(module)
        state = {key: self._detached(item) for key, item in module.__dict__.items() if key not in _STATE_SLOTS}
        parameters, buffers, submodules = own_state(module)
        state["_parameters"] = {k: None if p is None else self.tensor(p) for k, p in parameters.items()}
        state["_buffers"] = {k: None if b is None else self.tensor(b) for k, b in buffers.items()}
        state["_modules"] = {k: None if m is None else self.shadow(m) for k, m in submodules.items()}
        clone.__dict__ = state
        if self.adjust_shadow is not None:
            self.adjust_shadow(module, clone)
        return clone

    def _detached(self, item: Any) -> Any:
        """``item`` as a shadow holds it: tensors as meta stand-ins, modules as shadows, containers copied."""
        if type(item) in _PLAIN_STATE:
            return item
        if isinstance(item, torch.Tensor):
            return self.tensor(item)
        if isinstance(item, nn.Module):
            return self.shadow(item)
        if isinstance(item, RemovableHandle):
            return self._handle(item)
        if not _is_container(item):
            return item
        found = self._copies.get(id(item))
        if found is not None:
            return found
        self._keepalive.append(item)
        if isinstance(item, dict):
            # the dict types modules hold (hook dicts are OrderedDicts) copy themselves, type and
            # default factory kept, without copy.copy's reduce-and-rebuild
            copied = self._copies[id(item)] = item.copy() if type(item) in _SELF_COPYING_DICTS else copy.copy(item)
            for key, part in item.items():
                copied[key] = self._detached(part)
            return copied
        if isinstance(item, collections.deque):
            copied = self._copies[id(item)] = collections.deque(maxlen=item.maxlen)
            copied.extend(self._detached(part) for part in item)
            return copied
        if isinstance(item, (types.SimpleNamespace,)) or dataclasses.is_dataclass(item):
            copied = self._copies[id(item)] = copy.copy(item)
            for key, part in vars(item).items():
                object.__setattr__(copied, key, self._detached(part))
            return copied
        parts = [self._detached(part) for part in item]
        copied = type(item)(*parts) if hasattr(type(item), "_fields") else type(item)(parts)
        self._copies[id(item)] = copied
        return copied

    def _handle(self, handle: RemovableHandle) -> RemovableHandle:
        """A hook handle whose ``remove`` removes the hook from the shadow's copies of the hook dicts
        (a lazy module's pre-hook removes itself on its first call)."""
        found = self._copies.get(id(handle))
        if found is not None:
            return found
        self._keepalive.append(handle)
        copied = self._copies[id(handle)] = copy.copy(handle)
        copied.hooks_dict_ref = _copied_ref(self, handle.hooks_dict_ref)
        copied.extra_dict_ref = tuple(_copied_ref(self, ref) for ref in handle.extra_dict_ref)
        return copied

    def state_tensors(self, module: nn.Module) -> list[torch.Tensor]:
        """Every parameter and buffer of a module, as meta stand-ins for the devices they are on (an
        uninitialized one, whose size its first call decides, as one element on its device)."""
        return [tag(torch.empty((1,), device="meta"), self.device_of_state(t))
                if isinstance(t, UninitializedTensorMixin) else self.tensor(t)
                for t in (*module.parameters(), *module.buffers())]

    def signature(self, module: nn.Module) -> Hashable:
        """Everything a standard torch.nn module's forward depends on; Uncacheable otherwise."""
        key = id(module)
        if key in self._signatures:
            found = self._signatures[key]
            if found is None:
                raise Uncacheable
            return found
        try:
            found = self._compute_signature(module)
        except Uncacheable:
            self._signatures[key] = None
            raise
        self._signatures[key] = found
        return found

    def _compute_signature(self, module: nn.Module) -> Hashable:
        """One flat tuple: each attribute's name, then its type and value (numbers, strings, None)
        or its `signature`; hook dicts must be empty."""
        cls = type(module)
        state = module.__dict__
        if not cls.__module__.startswith("torch.nn.") or "forward" in state:
            raise Uncacheable
        parts: list[Hashable] = [cls, self.param_device]
        append = parts.append
        for name, item in state.items():
            kind = type(item)
            if kind in _PLAIN_STATE:
                if item and "hook" in name:
                    raise Uncacheable
                append(name)
                append(kind)
                append(item)
            elif "hook" in name:
                if item:
                    raise Uncacheable
            elif kind is weakref.ref or (kind is list and item and all(isinstance(r, weakref.ref) for r in item)):
                continue  # weak references mirror state that is already part of the signature
            elif name == "_modules":
                append(name)
                append(tuple([(key, None if child is None else self.signature(child)) for key, child in item.items()]))
            elif name == "_parameters" or name == "_buffers":
                append(name)
                append(self._state_signature(item))
            else:
                append(name)
                append(signature(item))
        return tuple(parts)

    @staticmethod
    def _state_signature(tensors: dict) -> Hashable:
        """Parameters or buffers by name, with the values fxprop knows of them (`remember` above:
        they are part of what it computes)."""
        parts: list[Hashable] = []
        for name, tensor in tensors.items():
            if tensor is None:
                parts.append((name, None))
                continue
            if isinstance(tensor, UninitializedTensorMixin):
                raise Uncacheable  # a lazy module: its first call decides its parameters
            known = values_signature(tensor) if values_worth_knowing(tensor) else None
            parts.append((name, type(tensor), signature(tensor), known))
        return tuple(parts)


_PLAIN_STATE = frozenset({bool, int, float, str, type(None)})
_SELF_COPYING_DICTS = frozenset({dict, collections.OrderedDict, collections.defaultdict, collections.Counter})


def _is_container(item: Any) -> bool:
    if isinstance(item, (list, tuple, set, frozenset, dict, collections.deque, types.SimpleNamespace)):
        return not isinstance(item, torch.Size)
    return dataclasses.is_dataclass(item) and not isinstance(item, type) and hasattr(item, "__dict__")


def _copied_ref(view: StateView, ref: weakref.ref) -> weakref.ref:
    """A weak reference to the view's copy of the dict ``ref`` refers to (a dead one stays dead)."""
    target = ref()
    if target is None:
        return ref
    return weakref.ref(view._detached(target))
