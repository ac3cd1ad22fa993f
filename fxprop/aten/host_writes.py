"""Whether the host's kernel writes into a tensor whose elements share memory.

TensorIterator refuses to write into an ``expand``ed tensor, and so do the elementwise kernels
(`in_place.check_no_overlapping_write` follows its rule). Other kernels decide for themselves:
``addmm_``, ``scatter_``, ``index_add_`` and ``masked_scatter_`` call ATen's
``assert_no_internal_overlap`` on ``self``; the CPU's ``masked_fill_`` only warns that writing an
expanded tensor is deprecated, and writes. No table says which, so where a written tensor has
overlapping elements the host's kernel is asked: the call runs once on stand-ins laid out as the
arguments are (the same sizes, strides and offsets, over one storage per storage the arguments
share), filled with ones (zeros for integer tensors: an index in range of any dim). Only a
refusal of the write is taken from it; the answer is kept per layout for the process.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

from .. import symbolic
from ..engine import session as context
from ..torch_compat import OpOverload, pytree, storage_key

_SIZE_LIMIT = 1 << 16  # elements in all the stand-ins' storages
_ANSWER_LIMIT = 4096
_answers: dict[tuple, tuple[type, str] | None] = {}
_lock = threading.Lock()

_WRITE_REFUSALS = ("more than one element of the written-to tensor",
                   "some elements of the input tensor and the written-to tensor")


class CannotAsk(Exception):
    """The host cannot answer for this call (symbolic sizes, another device, a random op, too large,
    or a refusal of the stand-ins' values): the caller keeps its own rule."""


def host_refusal_of_write(op: OpOverload, args: tuple, kwargs: dict) -> tuple[type, str] | None:
    """The host kernel's refusal to write as this call writes (error type and message), or None
    where it writes; `CannotAsk` where it cannot tell."""
    device = context.node_device()
    if (device is not None and device.type != "cpu") or torch.Tag.nondeterministic_seeded in op.tags:
        raise CannotAsk  # another device's kernels check otherwise; a random op would draw from the generator
    flat, spec = pytree.tree_flatten((args, kwargs))
    if symbolic.has_symbolic(flat):
        raise CannotAsk
    storages: dict[int, int] = {}
    layout = []
    for value in flat:
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided:
                raise CannotAsk
            group = storages.setdefault(storage_key(value), len(storages))
            layout.append((tuple(value.shape), value.stride(), value.storage_offset(), group, value.dtype))
        else:
            layout.append((type(value), value))
    try:
        key = (op, spec, tuple(layout))
        hash(key)
    except TypeError:
        raise CannotAsk from None
    with _lock:
        known = key in _answers
        answer = _answers.get(key)
    if not known:
        answer = _ask(op, flat, spec)
        with _lock:
            if len(_answers) >= _ANSWER_LIMIT:
                _answers.pop(next(iter(_answers)))
            _answers[key] = answer
    if answer is CannotAsk:
        raise CannotAsk
    return answer


def _ask(op: OpOverload, flat: list, spec: Any) -> Any:
    bases = _bases(flat)
    if bases is None:
        return CannotAsk

    def stand_in(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return bases[storage_key(value)].as_strided(value.shape, value.stride(), value.storage_offset())

    with context.on_host(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # masked_fill_'s deprecation of expanded tensors: the user's own run warns
        args, kwargs = pytree.tree_unflatten([stand_in(value) for value in flat], spec)
        try:
            op(*args, **kwargs)
        except RuntimeError as error:
            message = str(error).split("\n")[0]
            if any(phrase in message for phrase in _WRITE_REFUSALS):
                return RuntimeError, message
            return CannotAsk  # refused for something else (the stand-ins' values, perhaps)
        except Exception:  # noqa: BLE001 (any other refusal says nothing about the write)
            return CannotAsk
    return None


def _bases(flat: list) -> dict[int, torch.Tensor] | None:
    """One host storage per storage the arguments share, as long as the farthest element any of them reaches."""
    extents: dict[int, tuple[int, torch.dtype]] = {}
    for value in flat:
        if isinstance(value, torch.Tensor):
            reach = value.storage_offset() + 1 + sum((size - 1) * stride for size, stride in
                                                     zip(value.shape, value.stride()) if size > 0)
            if value.numel() == 0:
                reach = value.storage_offset()
            key = storage_key(value)
            known = extents.get(key)
            if known is not None and known[1] is not value.dtype:
                return None  # a view of another dtype over the same bytes
            extents[key] = (max(reach, known[0] if known else 0), value.dtype)
    if sum(extent for extent, _ in extents.values()) > _SIZE_LIMIT:
        return None

    def filled(extent: int, dtype: torch.dtype) -> torch.Tensor:
        if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
            return torch.ones(extent, dtype=dtype)
        return torch.zeros(extent, dtype=dtype)
    try:
        return {key: filled(extent, dtype) for key, (extent, dtype) in extents.items()}
    except (RuntimeError, NotImplementedError):
        return None  # a dtype the host cannot fill
