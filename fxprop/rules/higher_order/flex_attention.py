"""``flex_attention``: attention with a score function and a block mask, laid out as torch's kernel."""
from __future__ import annotations


import torch

from ... import symbolic
from ...devices import device_of
from ...resolve.registry import rule
from ...torch_compat import check
from .common import describe, fill_order, fresh, through_autograd_function, walk

aten = torch.ops.aten
higher_order = torch.ops.higher_order


@rule(higher_order.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                   mask_mod_other_buffers=()):
    """Attention whose scores pass through ``score_mod(score, b, h, m, n, *buffers)`` and whose mask is
    ``mask_mod(b, h, m, n, *buffers)`` (the last entry of ``block_mask``). Returns the output
    (query's batch, heads and length, value's head dim, in query's dtype, laid out in query's stride
    order), and the log-sum-exp and max of the scores per query, in the working precision
    (float64 for float64 queries, else float32; the max has no gradient). Both functions are propagated on one score (in
    the working precision) and int64 indices, as torch's eager kernel calls them."""
    check(query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
          lambda: f"flex_attention: query, key and value must be 4-D (batch, heads, length, head dim), got "
                  f"{describe(query)}, {describe(key)}, {describe(value)}")
    batch, heads, length, _ = query.shape
    kv_batch, kv_heads = key.shape[0], key.shape[1]
    check(symbolic.definitely_equal(batch, kv_batch) or symbolic.definitely_equal(kv_batch, 1),
          lambda: f"Bq and Bkv must broadcast. Got Bq={batch} and Bkv={kv_batch}")
    check(symbolic.definitely_equal(heads % kv_heads, 0),
          lambda: f"flex_attention: the query's heads ({heads}) must be a multiple of the key's ({kv_heads})")
    working = torch.float64 if query.dtype == torch.float64 else torch.float32
    device = device_of(query)
    score = fresh((), (), working, device)
    indices = [fresh((), (), torch.int64, device) for _ in range(4)]
    with torch.no_grad():
        walk(score_mod, [score, *indices, *score_mod_other_buffers])
        mask = walk(block_mask[-1], [*indices, *mask_mod_other_buffers])
    check(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
          lambda: f"flex_attention: mask_mod must return a bool tensor, got {describe(mask)}")
    shape = (batch, heads, length, value.shape[-1])
    out = fresh(shape, _attention_strides(shape, query.stride()), query.dtype, device)
    stats = [fresh(shape[:3], symbolic.contiguous_strides(shape[:3]), working, device) for _ in range(2)]
    return tuple(through_autograd_function([out, *stats], (query, key, value, score_mod_other_buffers,
                                                            mask_mod_other_buffers), non_differentiable=(2,)))


def _attention_strides(shape: tuple, query_strides: tuple) -> list:
    """The output laid out in the query's fill order, its last dim kept innermost (torch's _permute_strides)."""
    order = fill_order(query_strides)
    strides = _strides_in_order(shape, order)
    if not symbolic.definitely_equal(strides[-1], 1):
        last = len(shape) - 1
        strides = _strides_in_order(shape, [last, *(dim for dim in order if dim != last)])
    return strides


def _strides_in_order(shape: tuple, order: list) -> list:
    strides: list = [0] * len(shape)
    running = 1
    for dim in order:
        strides[dim] = running
        running = running * shape[dim]
    return strides
