"""Which fused kernel `scaled_dot_product_attention` runs on a CUDA device, and its output.

torch tries the backends in `torch._C._get_sdp_priority_order()` (flash, efficient, math,
cudnn by default), skips those disabled with `torch.backends.cuda.enable_*_sdp` /
`torch.nn.attention.sdpa_kernel`, and takes the first whose constraints the inputs meet
(`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`). Each backend's constraints are
listed below as small checks; each returns why the backend cannot run, or None.

The target GPU is assumed to be sm80 or newer (A100, H100, H200): the hardware and
cuDNN-version checks of sdp_utils are not modelled.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from ..errors import PropagationError
from ..symbolic import resolve
from ..torch_compat import sdp_priority_order

aten = torch.ops.aten
_LOW_PRECISION = (torch.float16, torch.bfloat16)


class Call(NamedTuple):
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool


def _true(condition) -> bool:
    return resolve(condition, default=False) is True


# --- constraints, one per check of sdp_utils.cpp ---------------------------------------

def four_dims(c: Call) -> str | None:
    if not all(t.dim() == 4 for t in (c.query, c.key, c.value)):
        return f"query, key and value must be 4-D, got {c.query.dim()}-D, {c.key.dim()}-D and {c.value.dim()}-D"
    return None


def no_attn_mask(c: Call) -> str | None:
    return "attn_mask is not supported" if c.attn_mask is not None else None


def half_or_bfloat16(c: Call) -> str | None:
    return None if c.query.dtype in _LOW_PRECISION else f"needs float16 or bfloat16, got {c.query.dtype}"


def half_bfloat16_or_float32(c: Call) -> str | None:
    return None if c.query.dtype in (*_LOW_PRECISION, torch.float32) else f"unsupported dtype {c.query.dtype}"


def flash_head_dim(c: Call) -> str | None:
    size = c.query.size(-1)
    if not (_true(size == c.key.size(-1)) and _true(size == c.value.size(-1)) and _true(size <= 256)):
        return f"head dims must be equal and at most 256, got {size}, {c.key.size(-1)}, {c.value.size(-1)}"
    return None


def efficient_head_dim(c: Call) -> str | None:
    size, value_size = c.query.size(-1), c.value.size(-1)
    if not (_true(size == c.key.size(-1)) and _true(size % 8 == 0) and _true(value_size % 8 == 0)):
        return f"head dims must be divisible by 8 and query's equal key's, got {size}, {c.key.size(-1)}, {value_size}"
    return None


def cudnn_head_dim(c: Call) -> str | None:
    size = c.query.size(-1)
    if not (_true(size == c.key.size(-1)) and _true(size <= 128) and _true(size % 8 == 0)):
        return f"head dim must be at most 128 and divisible by 8, got {size}"
    return None


def _same_batch_and_heads(c: Call, grouped_heads: bool) -> str | None:
    q, k, v = c.query, c.key, c.value
    if not (_true(q.size(0) == k.size(0)) and _true(q.size(0) == v.size(0))):
        return f"batch sizes must be equal, got {q.size(0)}, {k.size(0)}, {v.size(0)}"
    if _true(q.size(1) == k.size(1)) and _true(q.size(1) == v.size(1)):
        return None
    if grouped_heads and c.enable_gqa and _true(k.size(1) == v.size(1)) and _true(q.size(1) % k.size(1) == 0):
        return None
    return f"head counts must be equal{' (or grouped, with enable_gqa)' if grouped_heads else ''}, got " \
           f"{q.size(1)}, {k.size(1)}, {v.size(1)}"


def same_batch_and_heads_or_grouped(c: Call) -> str | None:
    return _same_batch_and_heads(c, grouped_heads=True)


def same_batch_and_heads(c: Call) -> str | None:
    return _same_batch_and_heads(c, grouped_heads=False)


def nonzero_sequence_lengths(c: Call) -> str | None:
    if _true(c.query.size(-2) == 0) or _true(c.key.size(-2) == 0):
        return "sequence lengths must be non-zero"
    return None


def last_dim_contiguous(c: Call) -> str | None:
    for name, t in (("query", c.query), ("key", c.key), ("value", c.value)):
        if not (_true(t.stride(-1) == 1) or _true(t.size(-1) == 1)):
            return f"{name}'s last dim must have stride 1, got strides {t.stride()}"
    return None


def causal_needs_square(c: Call) -> str | None:
    if c.is_causal and not _true(c.query.size(-2) == c.key.size(-2)):
        return "is_causal needs seqlen_q == seqlen_k"
    return None


CONSTRAINTS: dict[SDPBackend, tuple[Callable[[Call], str | None], ...]] = {
    SDPBackend.FLASH_ATTENTION: (four_dims, no_attn_mask, half_or_bfloat16, flash_head_dim,
                                 same_batch_and_heads_or_grouped, nonzero_sequence_lengths, last_dim_contiguous,
                                 causal_needs_square),
    SDPBackend.EFFICIENT_ATTENTION: (four_dims, half_bfloat16_or_float32, efficient_head_dim, same_batch_and_heads,
                                     nonzero_sequence_lengths, last_dim_contiguous),
    SDPBackend.CUDNN_ATTENTION: (four_dims, no_attn_mask, half_or_bfloat16, cudnn_head_dim, same_batch_and_heads,
                                 nonzero_sequence_lengths, last_dim_contiguous),
    SDPBackend.MATH: (),
}

ENABLED: dict[SDPBackend, Callable[[], bool]] = {
    SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled,
    SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled,
    SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.cudnn_sdp_enabled,
    SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled,
}


def enabled_backends() -> tuple[SDPBackend, ...]:
    return tuple(backend for backend, enabled in ENABLED.items() if enabled())


def priority_order() -> list[SDPBackend]:
    return [SDPBackend(int(b)) for b in sdp_priority_order()]


def refusals(backend: SDPBackend, call: Call) -> list[str]:
    """Why ``backend`` cannot run ``call`` (empty when it can)."""
    return [reason for check in CONSTRAINTS[backend] if (reason := check(call)) is not None]


def choose(call: Call) -> SDPBackend:
    """The backend torch picks on a CUDA device."""
    tried = []
    for backend in priority_order():
        if backend not in CONSTRAINTS:
            continue
        if not ENABLED[backend]():
            tried.append(f"{backend.name}: disabled")
            continue
        reasons = refusals(backend, call)
        if not reasons:
            return backend
        tried.append(f"{backend.name}: {'; '.join(reasons)}")
    raise PropagationError("scaled_dot_product_attention: no CUDA backend can run these inputs, got "
                           + " | ".join(tried))


# --- the chosen kernel, as sdpa calls it (aten/src/ATen/native/transformers/attention.cpp) ---

def _needs_logsumexp(call: Call) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in (call.query, call.key, call.value))


def _pad_last_dim_to_8(t: torch.Tensor) -> torch.Tensor:
    size = t.size(-1)
    return t if _true(size % 8 == 0) else F.pad(t, (0, 8 - size % 8))


def flash(call: Call) -> torch.Tensor:
    """Head dims are padded to a multiple of 8 and the output sliced back, as sdpa does."""
    head_dim = call.query.size(-1)
    scale = call.scale if call.scale is not None else 1.0 / math.sqrt(head_dim)
    out = aten._scaled_dot_product_flash_attention.default(
        _pad_last_dim_to_8(call.query), _pad_last_dim_to_8(call.key), _pad_last_dim_to_8(call.value),
        call.dropout_p, call.is_causal, False, scale=scale)[0]
    return out if _true(out.size(-1) == head_dim) else out[..., :head_dim]


def efficient(call: Call) -> torch.Tensor:
    mask = call.attn_mask
    if mask is not None:
        mask = mask.expand(call.query.size(0), call.query.size(1), call.query.size(-2), call.key.size(-2))
    return aten._scaled_dot_product_efficient_attention.default(
        call.query, call.key, call.value, mask, _needs_logsumexp(call), call.dropout_p, call.is_causal,
        scale=call.scale)[0]


def cudnn(call: Call) -> torch.Tensor:
    return aten._scaled_dot_product_cudnn_attention.default(
        call.query, call.key, call.value, call.attn_mask, _needs_logsumexp(call), call.dropout_p, call.is_causal,
        False, scale=call.scale)[0]


def math_path(call: Call) -> torch.Tensor:
    return F.scaled_dot_product_attention(call.query, call.key, call.value, attn_mask=call.attn_mask,
                                          dropout_p=call.dropout_p, is_causal=call.is_causal, scale=call.scale,
                                          enable_gqa=call.enable_gqa)


KERNELS: dict[SDPBackend, Callable[[Call], torch.Tensor]] = {
    SDPBackend.FLASH_ATTENTION: flash,
    SDPBackend.EFFICIENT_ATTENTION: efficient,
    SDPBackend.CUDNN_ATTENTION: cudnn,
    SDPBackend.MATH: math_path,
}
