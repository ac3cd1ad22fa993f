"""The real-tensor fallback: for an op no other rule covers, run it once on the host.

Inputs are materialized on the host CPU whatever their logical device. Tensors whose values
are known (small integer tensors the user passed in for real) keep them; the others are
synthesized: floating values drawn from a private generator seeded afresh for every call
(never torch's global one), integer and bool tensors zeros, so every index is in range. Ops
that draw random numbers get the private generator too. The op's results are turned into
meta tensors and the real tensors dropped at once; the bytes it needed (its inputs, and the
most the allocator held for the call at once: outputs and the kernel's temporaries) are reported
and capped. The cap refuses inputs past it before the run, the rest after it.

Only metadata is kept. A python value the op returns (a bool, a number) was computed from
synthesized data unless every input was known, so it becomes a fresh data-dependent symbol.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import symbolic
from ..engine.blame import boundary
from ..errors import FallbackLimitError, PropagationError, UnsupportedError
from ..engine.known_values import KnownValues, has_no_values
from ..torch_compat import (OpOverload, has_kernel_for_dispatch_key, peak_allocated_bytes, pytree, schema_of,
                           storage_key)

_KERNELS_FOR_EVERY_DEVICE = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                             "CompositeImplicitAutograd")
REAL_VALUE_LIMIT = 1 << 16  # elements: larger user tensors are never kept for the fallback
_SEED = 0x5EED


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the smallest storage that backs ``tensor``'s view."""
    if tensor.numel() == 0:
        return 0
    extent = tensor.storage_offset() + 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    return int(extent) * tensor.element_size()


def materialize(meta: torch.Tensor, real_values: KnownValues,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """A host tensor standing in for ``meta``: its known values, else synthesized ones."""
    known = real_values.get(meta)
    if known is not None:
        return known.detach().to("cpu", copy=True)
    extent = storage_bytes(meta) // max(meta.element_size(), 1)
    base = torch.empty(extent, dtype=meta.dtype, device="cpu")
    if meta.dtype.is_floating_point or meta.dtype.is_complex:
        base.copy_(torch.randn(extent, generator=generator or torch.Generator().manual_seed(_SEED), device="cpu"))
    else:
        base.zero_()
    return base.as_strided(meta.shape, meta.stride(), meta.storage_offset())


def to_meta(value: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return value
    offset = value.storage_offset()
    if offset == 0:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    extent = storage_bytes(value) // value.element_size()
    return torch.empty(extent, dtype=value.dtype, device="meta").as_strided(value.shape, value.stride(), offset)


def _over_limit(op: Any, needed: int, limit: int, what: str) -> FallbackLimitError:
    return FallbackLimitError(
        f"{op}: this call is answered by running the op on real host tensors, which would need {needed:,} bytes "
        f"({what}), over the fallback limit of {limit:,} bytes "
        "(raise it with propagate(..., fallback_limit_bytes=N) or register a rule)")


def refuse_without_kernel_for(op: Any, device: torch.device | None) -> None:
    """The host runs an op for any logical device, and a fake kernel answers for any, but a
    library op registered for some devices only cannot run on the others: real execution
    raises NotImplementedError there. (torch's own ops are skipped: this build of torch may
    lack kernels another build has.)"""
    device = device if device is not None else torch.device("cpu")
    if device.type == "meta" or not isinstance(op, OpOverload):
        return
    if op.namespace in ("aten", "prims", "_c10d_functional", "c10d", "quantized", "_quantized"):
        return
    keys = (device.type.upper() if device.type != "privateuseone" else "PrivateUse1", *_KERNELS_FOR_EVERY_DEVICE)
    if not any(has_kernel_for_dispatch_key(op.name(), key) for key in keys):
        raise PropagationError(
            f"Could not run '{op.name()}' with arguments from the '{keys[0]}' backend: the op has no kernel for "
            f"{device.type} (and no composite one), so real execution on {device} raises",
            error_type=NotImplementedError)


@boundary
def _call(op: Callable, args: tuple, kwargs: dict, measured: bool) -> tuple[Any, int | None]:
    with torch.no_grad():
        if not measured:
            return op(*args, **kwargs), None
        return peak_allocated_bytes(lambda: op(*args, **kwargs))


def run_on_host(op: Callable, args: tuple, kwargs: dict, *, limit_bytes: int,
                real_values: KnownValues) -> tuple[Any, int]:
    """Run ``op`` on host tensors standing in for the meta ones; return meta results and bytes used."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    metas = [(i, value) for i, value in enumerate(flat) if isinstance(value, torch.Tensor) and value.device.type == "meta"]
    needed = sum(storage_bytes(value) for _, value in metas)
    if needed > limit_bytes:
        raise _over_limit(op, needed, limit_bytes, "its inputs")

    def run(measured: bool) -> tuple[Any, int | None, list]:
        generator = torch.Generator().manual_seed(_SEED)
        real_flat = list(flat)
        for i, value in metas:
            real_flat[i] = materialize(value, real_values, generator)
        real_args, real_kwargs = pytree.tree_unflatten(real_flat, spec)
        if _takes_generator(op) and real_kwargs.get("generator") is None:
            real_kwargs["generator"] = generator
        return *_call(op, real_args, real_kwargs, measured), real_flat

    try:
        result, peak, real_flat = run(measured=True)
    except Exception:
        # A kernel that runs a profiler of its own cannot run under the one that measures it:
        # its refusal counts only when it refuses unmeasured too (on inputs made afresh).
        result, peak, real_flat = run(measured=False)
    input_storages = {storage_key(real_flat[i]) for i, _ in metas}
    produced = sum(t.untyped_storage().nbytes() for t in _distinct_storages(result)
                   if storage_key(t) not in input_storages)
    if peak is not None and peak > produced:
        produced = peak  # the outputs and the kernel's temporaries
    if needed + produced > limit_bytes:
        raise _over_limit(op, needed + produced, limit_bytes, "its inputs, outputs and temporaries")
    for leaf in pytree.tree_leaves(result):
        if isinstance(leaf, torch.Tensor) and leaf.layout is not torch.strided:
            raise UnsupportedError(f"{op} made a tensor of layout {leaf.layout} on the host: fxprop "
                                   f"propagates strided tensors only")
    exact = all(value in real_values or has_no_values(value) for _, value in metas)
    aliases = {id(real_flat[i]): value for i, value in metas}
    meta_result = pytree.tree_map(lambda leaf: _to_static(leaf, aliases, exact), result)
    return meta_result, needed + produced


def _distinct_storages(result: Any) -> list[torch.Tensor]:
    """One tensor per storage among ``result``'s (views of one new storage count once)."""
    by_storage = {}
    for leaf in pytree.tree_leaves(result):
        if isinstance(leaf, torch.Tensor) and leaf.layout is torch.strided:
            by_storage.setdefault(storage_key(leaf), leaf)
    return list(by_storage.values())


def _to_static(leaf: Any, aliases: dict[int, torch.Tensor], exact: bool) -> Any:
    if isinstance(leaf, torch.Tensor):
        alias = aliases.get(id(leaf))
        return _laid_out_as(alias, leaf) if alias is not None else to_meta(leaf)
    if not exact and isinstance(leaf, (bool, int, float)):
        return symbolic.current().fresh_value(_dtype_of(leaf))
    return leaf


def _laid_out_as(alias: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    """The meta tensor an out= (or self) argument is, resized and restrided as the kernel left its
    host copy (an empty ``out=`` grows to the result's shape)."""
    if alias.shape != written.shape:
        alias.resize_(written.shape)
    if alias.stride() != written.stride() and written.numel():
        alias.as_strided_(written.shape, written.stride(), alias.storage_offset())
    return alias


def _dtype_of(value: bool | int | float) -> torch.dtype:
    return torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float64


def _takes_generator(op: Any) -> bool:
    return isinstance(op, OpOverload) and any(argument.name == "generator" for argument in schema_of(op).arguments)
