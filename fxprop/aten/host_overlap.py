"""Writes into memory an input occupies, refused as the host's kernel refuses them.

Real kernels refuse to write into memory that an input also occupies, or into a tensor some of
whose elements share memory (ATen's ``assert_no_overlap``, ``assert_no_partial_overlap`` and
``assert_no_internal_overlap``), but each kernel chooses its own checks: ``cat``,
``index_select``, ``addmm`` and ``cumsum`` into an ``out=`` that overlaps an input refuse,
``mm``, ``bmm`` and ``sum`` do not, and torch keeps no table of which. fxprop's meta tensors
share storages as the real ones would (the views of one input share its storage), so a call that
writes into a tensor whose storage another of its tensors shares, or whose own elements
overlap, is asked of the host's kernel, before its meta kernel runs as the real kernel's checks
come first: on stand-ins that share memory exactly as the call's tensors do, every byte zero
(an index in range of any dim). Only ATen's overlap refusal is the node's; the stand-ins'
values cannot cause it. Elementwise ops are checked by fxprop itself (`in_place`), except the
``out=`` forms whose kernel is composite (``clone.out`` computes, then copies: no check) and
writes into a tensor whose own elements overlap (the CPU's ``masked_fill_`` writes them);
those, like any composite kernel, behave alike on every device, and are asked for every device;
the others only for CPU nodes. Random ops are never asked.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from ..engine import session as context
from .host_answers import HostAnswers
from ..errors import PropagationError
from .in_place import checked_before_the_meta_kernel, host_decides_self_overlap, written_arguments
from ..torch_compat import (OpOverload, has_kernel, has_symbolic_layout, internal_overlap, pytree, schema_of,
                            storage_key)

_STAND_IN_BYTES = 1 << 20  # the memory all the stand-ins of one call may span
_answers = HostAnswers(limit=4096)
_OVERLAP_REFUSAL = "unsupported operation:"  # how ATen's MemoryOverlap checks begin their message


def check_overlapping_writes(op: OpOverload, args: tuple, kwargs: dict) -> None:
    """Refuse as the host's kernel does a write into memory another tensor of the call occupies."""
    if not schema_of(op).is_mutable or op.namespace != "aten" or torch.Tag.nondeterministic_seeded in op.tags:
        return
    written = written_arguments(op, args, kwargs)
    if not written:
        return
    if checked_before_the_meta_kernel(op) and not (
            host_decides_self_overlap(op) and any(internal_overlap(w) == 1 for w in written)):
        return
    flat, spec = pytree.tree_flatten((args, kwargs))
    tensors = [value for value in flat if isinstance(value, torch.Tensor)]
    if not _shares_memory(written, tensors) or not _device_answers(op):
        return
    if any(t.layout is not torch.strided or has_symbolic_layout(t) for t in tensors):
        return
    layouts = _stand_in_layouts(tensors)
    if layouts is None:
        return
    key = (op, spec, tuple(layouts[id(v)] if isinstance(v, torch.Tensor) else (type(v), v) for v in flat))
    try:
        hash(key)
    except TypeError:
        return
    refusal = _answers.get(key, lambda: _ask_the_host(op, flat, spec, layouts))
    if refusal is not None:
        raise PropagationError(refusal, error_type=RuntimeError)


def _shares_memory(written: list, tensors: list) -> bool:
    keys = [storage_key(t) for t in tensors]
    return any(internal_overlap(w) == 1 or keys.count(storage_key(w)) > 1 for w in written)


def _device_answers(op: OpOverload) -> bool:
    """Whether the host's answer is the node's: on a CPU node, or where the op's kernel is composite."""
    device = context.node_device()
    if device is None or device.type == "cpu":
        return True
    return not any(has_kernel(op.name(), key) for key in ("CPU", "CUDA", "Meta"))


def _stand_in_layouts(tensors: list) -> dict | None:
    """Each tensor's place in a stand-in storage, by ``id``: (storage index, byte offset there, shape,
    stride, dtype), the storages cut to the bytes the call's tensors span; None past the limit."""
    spans: dict[int, list[int]] = {}
    for t in tensors:
        begin, end = _byte_span(t)
        span = spans.setdefault(storage_key(t), [begin, end])
        span[0], span[1] = min(span[0], begin), max(span[1], end)
    for span in spans.values():
        span[0] -= span[0] % 16  # aligned for every dtype's element size
    if sum(end - begin for begin, end in spans.values()) > _STAND_IN_BYTES:
        return None
    order = list(spans)
    return {id(t): (order.index(storage_key(t)), t.storage_offset() * t.element_size() - spans[storage_key(t)][0],
                    spans[storage_key(t)][1] - spans[storage_key(t)][0], tuple(t.shape), t.stride(), t.dtype)
            for t in tensors}


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    begin = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return begin, begin
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return begin, begin + (last + 1) * t.element_size()


def _ask_the_host(op: OpOverload, flat: list, spec: Any, layouts: dict) -> str | None:
    storages: dict[int, torch.UntypedStorage] = {}

    def stand_in(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        index, offset, span, shape, stride, dtype = layouts[id(value)]
        if index not in storages:
            storages[index] = torch.zeros(max(span, 16), dtype=torch.uint8).untyped_storage()
        itemsize = torch.empty((), dtype=dtype).element_size()
        return torch.empty((0,), dtype=dtype).set_(storages[index], offset // itemsize, shape, stride)

    with context.on_host(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # masked_fill_'s deprecation of expanded tensors: the user's own run warns
        try:
            args, kwargs = pytree.tree_unflatten([stand_in(value) for value in flat], spec)
            op(*args, **kwargs)
        except RuntimeError as error:
            message = str(error).split("\n")[0]
            return message if message.startswith(_OVERLAP_REFUSAL) else None
        except Exception:  # noqa: BLE001 - any other refusal is the meta kernel's to make
            return None
    return None
