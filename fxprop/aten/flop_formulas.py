"""The FLOP formulas fxprop applies: `torch.utils.flop_counter`'s registry, plus the fused CPU
kernels it misses (`EXTRA_FORMULAS`). A leaf module: the estimate applies them to annotated
nodes, the dispatch of DTensor graphs to each rank's local ops as they run."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import flop_counter

aten = torch.ops.aten


def _rnn_layer_flops(input_shape, weight_ih_shape, weight_hh_shape, *args, out_shape=None, **kwargs) -> int:
    """One oneDNN RNN layer: the input and hidden projections of every gate at every step,
    what the composite RNN path counts as addmm/mm (``2 * steps * batch * gates * (in + hidden)``)."""
    steps_times_batch = input_shape[0] * input_shape[1]
    gates, width = weight_ih_shape
    hidden = weight_hh_shape[1]
    return 2 * steps_times_batch * gates * (width + hidden)


def _rnn_layer_backward_flops(input_shape, weight_ih_shape, weight_hh_shape, *args, out_shape=None, **kwargs) -> int:
    """The gradients of both projections, for the inputs and for the weights: twice the forward."""
    return 2 * _rnn_layer_flops(input_shape, weight_ih_shape, weight_hh_shape)


EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop.__wrapped__,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_counter.sdpa_backward_flop.__wrapped__,
    aten.mkldnn_rnn_layer: _rnn_layer_flops,
    aten.mkldnn_rnn_layer_backward: _rnn_layer_backward_flops,
}
"""Formulas (on shapes) for the fused CPU kernels that `torch.utils.flop_counter.flop_registry`
misses; ``FlopCounterMode(custom_mapping=EXTRA_FORMULAS)`` counts real execution the same way."""

FORMULAS: dict[Any, Callable[..., int]] = {
    **flop_counter.flop_registry, **{op: flop_counter.shape_wrapper(f) for op, f in EXTRA_FORMULAS.items()}}
"""Every formula used, keyed by op packet, each taking ``(*args, out_val=..., **kwargs)``."""
