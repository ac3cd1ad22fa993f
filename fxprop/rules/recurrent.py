"""Recurrent modules (nn.RNN, nn.LSTM, nn.GRU) over a symbolic number of steps.

torch runs a recurrent module one step at a time (``torch._decomp``'s ``lstm_impl`` unbinds the
input along time), which needs the number of steps as an int. Only the output's time dim
depends on it: each step's output has one step's shape, dtype and device, and the final
states do not depend on the length at all. So with a symbolic length the module runs one step
on meta, and its output is widened to every step, laid out as the real kernels lay out their
stacked steps (time-major and contiguous, transposed back when ``batch_first``).
"""
from __future__ import annotations

import torch

from ..resolve.registry import rule


@rule(torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU)
def recurrent_module(module: torch.nn.RNNBase, input, hx=None):
    if not isinstance(input, torch.Tensor):  # a PackedSequence
        return module(input, hx)
    batch_first = module.batch_first and input.dim() == 3
    time_dim = 1 if batch_first else 0
    steps = input.shape[time_dim]
    if not isinstance(steps, torch.SymInt):
        return module(input, hx)
    step_output, state = module(input.narrow(time_dim, 0, 1), hx)
    time_major = step_output.transpose(0, 1) if batch_first else step_output
    output = time_major.expand(steps, *time_major.shape[1:]).contiguous()
    return (output.transpose(0, 1) if batch_first else output), state
