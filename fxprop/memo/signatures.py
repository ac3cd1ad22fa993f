"""Signatures of a call's arguments: hashable summaries of everything about a value that a rule's
result may depend on, for the rule cache's keys and the graph replay's (`fxprop.memo.replay`).

Tensors sign as their shape, strides, storage offset, dtype, logical device, ``requires_grad``,
leafness and conj/neg bits; python values as their type and value (a float's zero with its sign);
the values fxprop knows of a tensor by their bits (`values_signature`). With symbolic sizes a size
stands for its expression (`symbolic_signature`), which names one ShapeEnv's symbols.
"""
from __future__ import annotations

import math
from typing import Any, Hashable

import torch

from ..devices import device_of
from ..torch_compat import size_expression


class Uncacheable(Exception):
    """A value whose identity, not its content, matters; calls on it are not memoized."""


# --- signatures --------------------------------------------------------------------------

_PLAIN = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout, type(Ellipsis))


def _tensor_signature(value: torch.Tensor) -> Hashable:
    if value.layout is not torch.strided:
        raise Uncacheable
    bits = (value.is_conj(), value.is_neg()) if value.is_complex() else ()
    return (value.shape, value.stride(), value.storage_offset(), value.dtype, device_of(value),
            value.requires_grad, value.requires_grad and value.is_leaf, bits)


def _sequence_signature(value: tuple | list) -> Hashable:
    return (type(value), tuple([signature(item) for item in value]))


def _dict_signature(value: dict) -> Hashable:
    return ("dict", tuple([(key, signature(item)) for key, item in value.items()]))


def _set_signature(value: set | frozenset) -> Hashable:
    return ("set", frozenset(signature(item) for item in value))


def _slice_signature(value: slice) -> Hashable:
    return ("slice", signature(value.start), signature(value.stop), signature(value.step))


_BY_TYPE = {tuple: _sequence_signature, list: _sequence_signature, torch.Size: _sequence_signature,
            dict: _dict_signature, set: _set_signature, frozenset: _set_signature, slice: _slice_signature}
_BY_TYPE.update({plain: (lambda value: (type(value), value)) for plain in _PLAIN})
# -0.0 == 0.0 (and hashes alike), yet copysign, atan2 and 1 / x tell them apart
_BY_TYPE[float] = lambda value: (float, value, math.copysign(1.0, value))
_BY_TYPE[complex] = lambda value: (complex, value, math.copysign(1.0, value.real), math.copysign(1.0, value.imag))


def signature(value: Any) -> Hashable:
    """A hashable summary of everything about ``value`` that a rule's result may depend on."""
    by_type = _BY_TYPE.get(type(value))
    if by_type is not None:
        return by_type(value)
    if isinstance(value, torch.Tensor):
        return _tensor_signature(value)
    for kind, summarize in ((tuple, _sequence_signature), (list, _sequence_signature), (dict, _dict_signature)):
        if isinstance(value, kind):
            return (type(value), summarize(value))
    raise Uncacheable


def values_signature(tensor: torch.Tensor) -> Hashable:
    """The values of a tensor fxprop knows, as a key holds them: by their bits, so that -0.0 and 0.0
    (equal, yet ``copysign`` and ``1 / x`` tell them apart) differ and a NaN matches itself."""
    flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    bits = _INTEGERS_OF_SIZE[min(flat.element_size(), 8)]
    return (tensor.dtype, tuple(flat.contiguous().view(bits).tolist()))


_INTEGERS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # same bits, read as integers
_VALUES_IN_A_KEY = 4096  # elements: a call given larger known values is computed each time


def known_values_signature(tensors: list[torch.Tensor], known: Any) -> tuple | None:
    """The values fxprop knows of a call's tensors (``known``: the propagation's `KnownValues`), by
    position, as its key holds them: a rule may read them (a mask's, an index's). None where one
    holds more than a key takes. A broadcast dim (stride 0) is read once: an expanded mask is keyed
    by the values it was expanded from, which with the tensor's sizes (in the key) give them all."""
    parts = []
    for position, tensor in enumerate(tensors):
        real = known.get(tensor)
        if real is not None:
            broadcast = tuple(dim for dim, (size, stride) in enumerate(zip(real.shape, real.stride()))
                              if stride == 0 and size > 1)
            for dim in broadcast:
                real = real.narrow(dim, 0, 1)
            if real.numel() > _VALUES_IN_A_KEY:
                return None
            parts.append((position, broadcast, values_signature(real)))
    return tuple(parts)


class TensorSignatures:
    """`signature` (``symbolic``: `symbolic_signature`) for the calls of one propagation, each
    tensor's part computed once: a graph's values feed several calls. A call that may change a
    tensor's metadata (anything not memoized: in-place and ``out=`` ops, ``requires_grad_``, the
    user's code) must be followed by `forget`."""

    def __init__(self, symbolic: bool = False) -> None:
        self._known: dict[int, tuple[torch.Tensor, Hashable]] = {}
        self._sign_tensor = _symbolic_tensor_signature if symbolic else _tensor_signature
        self._sign_other = symbolic_signature if symbolic else signature
        self._symbolic = symbolic

    def __call__(self, value: Any) -> Hashable:
        kind = type(value)
        if kind is tuple or kind is list or (self._symbolic and isinstance(value, (tuple, list))):
            return (kind, tuple([self(item) for item in value]))
        if kind is dict or (self._symbolic and isinstance(value, dict)):
            return (kind if self._symbolic else "dict", tuple([(key, self(item)) for key, item in value.items()]))
        if isinstance(value, torch.Tensor):
            known = self._known.get(id(value))
            if known is not None and known[0] is value:
                return known[1]
            found = self._sign_tensor(value)
            self._known[id(value)] = (value, found)
            return found
        return self._sign_other(value)

    def forget(self) -> None:
        self._known.clear()


_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _expression(size: Any) -> Hashable:
    return ("sym", size_expression(size)) if isinstance(size, _SYMBOLIC_SCALARS) else size


def _symbolic_tensor_signature(value: torch.Tensor) -> Hashable:
    if value.layout is not torch.strided:
        raise Uncacheable
    bits = (value.is_conj(), value.is_neg()) if value.is_complex() else ()
    return (tuple(map(_expression, value.shape)), tuple(map(_expression, value.stride())),
            _expression(value.storage_offset()), value.dtype, device_of(value), value.requires_grad,
            value.requires_grad and value.is_leaf, bits)


def symbolic_signature(value: Any) -> Hashable:
    """`signature` for a call with symbolic sizes: a size stands for its expression. Expressions
    name the symbols of one ShapeEnv, so such keys belong to one propagation's memo only."""
    if isinstance(value, torch.Tensor):
        return _symbolic_tensor_signature(value)
    if isinstance(value, _SYMBOLIC_SCALARS):
        return (type(value), size_expression(value))
    # subclasses too: a node's list arguments are fx's immutable_list
    if isinstance(value, (tuple, list)):
        return (type(value), tuple([symbolic_signature(item) for item in value]))
    if isinstance(value, dict):
        return (type(value), tuple([(key, symbolic_signature(item)) for key, item in value.items()]))
    return signature(value)
