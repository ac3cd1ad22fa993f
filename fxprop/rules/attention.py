"""Scaled dot-product attention: the fused kernel the target device would pick.

`scaled_dot_product_attention` picks a backend inside C++ and calls that backend's kernel,
whose output layout differs from the math path's: the fused kernels return the output in
the query's physical layout. On meta tensors the pick is always "math", so this rule makes
the pick for the node's logical device and calls the chosen kernel's meta implementation:
the host's own choice for the CPU, `sdpa_backends`'s model of torch's choice for CUDA.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from ..engine import session as context
from .. import symbolic
from . import sdpa_backends
from ..resolve.registry import rule
from ..torch_compat import fused_sdp_choice

aten = torch.ops.aten
_EXACT_SAMPLE_LIMIT = 1 << 24  # elements; above this the host sample keeps only dims' zero-ness


def _host_sample(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU tensor with the same metadata, for the host's backend checks (never filled).
    ``requires_grad`` is kept: the CPU takes the math path for a mask that requires grad."""
    if tensor is None:
        return None
    if symbolic.has_symbolic([tensor]):
        sample = symbolic.host_sample(tensor)
    elif tensor.numel() <= _EXACT_SAMPLE_LIMIT:
        sample = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    else:
        sample = torch.empty(tuple(min(size, 2) for size in tensor.shape), dtype=tensor.dtype, device="cpu")
    return sample.requires_grad_(tensor.requires_grad)


def attention_settings() -> tuple:
    """The global settings the backend choice reads, for memoized results to be told apart."""
    return (sdpa_backends.enabled_backends(), tuple(sdpa_backends.priority_order()))


def choose_backend(device: torch.device | None, query, key, value, attn_mask, dropout_p, is_causal, scale,
                   enable_gqa) -> SDPBackend:
    """The backend torch would choose on ``device`` for these inputs."""
    if device is None or device.type == "cpu":
        with context.on_host():
            choice = fused_sdp_choice(_host_sample(query), _host_sample(key), _host_sample(value),
                                             _host_sample(attn_mask), dropout_p, is_causal, scale=scale,
                                             enable_gqa=enable_gqa)
        return SDPBackend(choice)
    if device.type == "cuda":
        return sdpa_backends.choose(sdpa_backends.Call(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                         enable_gqa))
    return SDPBackend.MATH


@rule(F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    return attention_on(context.node_device(), query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def attention_on(device: torch.device | None, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None, enable_gqa=False) -> torch.Tensor:
    """What `scaled_dot_product_attention` runs on ``device``: the chosen backend's kernel, called as sdpa
    calls it there (on meta tensors, whose own pick is always "math")."""
    backend = choose_backend(device, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    device_type = (device or torch.device("cpu")).type
    if backend == SDPBackend.FLASH_ATTENTION and device_type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    if device_type == "cuda":
        return sdpa_backends.KERNELS[backend](sdpa_backends.Call(query, key, value, attn_mask, dropout_p, is_causal,
                                                                   scale, enable_gqa))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
