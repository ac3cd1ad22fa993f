"""The real-tensor fallback: for an op no other rule covers, run it once on the host.

Inputs are materialized on the host CPU whatever their logical device: floating tensors
as ones, integer and bool tensors as zeros (so every index is in range), except that small
integer/bool tensors the user passed in for real keep their real values. The op runs
under a forked RNG, its results are turned into meta tensors, and the real tensors are
dropped at once. The bytes it needed are reported so callers can see and cap the cost.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..errors import FallbackLimitError

REAL_VALUE_LIMIT = 1 << 16  # elements: larger user tensors are never kept for the fallback


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the smallest storage that backs ``tensor``'s view."""
    if tensor.numel() == 0:
        return 0
    extent = tensor.storage_offset() + 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    return int(extent) * tensor.element_size()


def materialize(meta: torch.Tensor, real_values: dict[int, torch.Tensor]) -> torch.Tensor:
    known = real_values.get(id(meta))
    if known is not None:
        return known.detach().to("cpu", copy=True)
    extent = storage_bytes(meta) // max(meta.element_size(), 1)
    base = torch.empty(extent, dtype=meta.dtype, device="cpu")
    base.fill_(1 if (meta.dtype.is_floating_point or meta.dtype.is_complex) else 0)
    return base.as_strided(meta.shape, meta.stride(), meta.storage_offset())


def to_meta(value: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return value
    offset = value.storage_offset()
    if offset == 0:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    extent = storage_bytes(value) // value.element_size()
    return torch.empty(extent, dtype=value.dtype, device="meta").as_strided(value.shape, value.stride(), offset)


def run_on_host(op: Callable, args: tuple, kwargs: dict, *, limit_bytes: int,
                real_values: dict[int, torch.Tensor]) -> tuple[Any, int]:
    """Run ``op`` on host tensors standing in for the meta ones; return meta results and bytes used."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    metas = [(i, value) for i, value in enumerate(flat) if isinstance(value, torch.Tensor) and value.device.type == "meta"]
    needed = sum(storage_bytes(value) for _, value in metas)
    if needed > limit_bytes:
        raise FallbackLimitError(
            f"{op}: no rule covers this op, and running it on real tensors would materialize "
            f"{needed:,} bytes, over the fallback limit of {limit_bytes:,} bytes "
            "(raise it with propagate(..., fallback_limit_bytes=N) or register a rule)")
    with torch.random.fork_rng(devices=[]):
        real_flat = list(flat)
        for i, value in metas:
            real_flat[i] = materialize(value, real_values)
        real_args, real_kwargs = pytree.tree_unflatten(real_flat, spec)
        with torch.no_grad():
            result = op(*real_args, **real_kwargs)
        produced = sum(storage_bytes(t) for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor))
        aliases = {id(real_flat[i]): value for i, value in metas}
        meta_result = pytree.tree_map(lambda t: aliases.get(id(t)) or to_meta(t), result)
    return meta_result, needed + produced
