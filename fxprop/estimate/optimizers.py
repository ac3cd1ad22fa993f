"""Optimizers as torch builds them for a target device, their state, and the bytes it holds.

The state is torch's own: `build` makes a `torch.optim` optimizer and `create_state` gives it
its state the way its first step does, by one step on zero gradients, so that a step traced
afterwards is a steady-state step (the second and later), with the state resident throughout.
What torch creates, per parameter:

- ``adamw``: ``exp_avg`` and ``exp_avg_sq``, each shaped and typed like the parameter (bfloat16
  parameters have bfloat16 moments), and ``step``, a 0-dim float32 counter on the host CPU.
- ``sgd``: with momentum, one ``momentum_buffer`` like the parameter; without, nothing.
- ``adafactor``: for parameters of two dims or more, factored second moments, ``row_var`` (the
  last dim reduced to 1) and ``col_var`` (the one before it reduced to 1); for the others a
  full ``variance``; and ``step``. Each in the gradient's dtype.

Which implementation runs is torch's default for the target device (what
``torch.optim.optimizer._default_to_fused_or_foreach`` picks when ``foreach`` is not given):
the foreach kernels on devices that have them (CUDA), one tensor at a time on the CPU. They
differ in their temporaries: foreach AdamW holds a square root of every ``exp_avg_sq`` at once.

>>> params = [torch.nn.Parameter(torch.zeros(4, 8, device="meta"))]
>>> optimizer = build("adamw", params, torch.device("cuda:0"))
>>> create_state(optimizer)
>>> state_bytes(optimizer, torch.device("cuda:0"))
{'cpu': 4, 'cuda:0': 256}
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..distributed.dtensors import local_of
from ..errors import InputError
from ..torch_compat import foreach_kernel_devices
from .host_reads import HostReads

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda params, foreach, momentum: torch.optim.AdamW(params, foreach=foreach),
    "sgd": lambda params, foreach, momentum: torch.optim.SGD(params, lr=1e-3, momentum=momentum, foreach=foreach),
    "adafactor": lambda params, foreach, momentum: torch.optim.Adafactor(params, foreach=foreach),
}


def build(name: str, params: Iterable[torch.nn.Parameter], device: torch.device,
          momentum: float = 0.0) -> torch.optim.Optimizer:
    """The torch optimizer ``name`` over ``params``, running the implementation torch picks on ``device``.
    ``momentum`` is SGD's (torch's default, 0, keeps no state)."""
    if name not in OPTIMIZERS:
        raise InputError(f"optimizer: unknown name {name!r}, expected one of {', '.join(OPTIMIZERS)}")
    if momentum and name != "sgd":
        raise InputError(f"optimizer: momentum is SGD's option, got momentum={momentum} for {name}")
    return OPTIMIZERS[name](list(params), device.type in foreach_kernel_devices(), momentum)


def create_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter the state the optimizer's first step creates: one step on zero gradients.

    The parameters change as that step changes them (weight decay, say); on the meta device
    there is nothing to change.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for param in params:
        param.grad = torch.zeros_like(param)
    with HostReads(stand_in=True):  # Adafactor reads each parameter's norm, which meta tensors lack
        optimizer.step()
    for param in params:
        param.grad = None


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state, in parameter order; a DTensor's as its local tensor."""
    return [local_of(value) for state in optimizer.state.values() for value in state.values()
            if isinstance(value, torch.Tensor)]


def state_bytes(optimizer: torch.optim.Optimizer, device: torch.device) -> dict[str, int]:
    """Bytes of the optimizer's state per device; tensors on the meta device count as on ``device``."""
    totals: dict[str, int] = {}
    for tensor in state_tensors(optimizer):
        where = str(device) if tensor.device.type == "meta" else str(tensor.device)
        totals[where] = totals.get(where, 0) + tensor.untyped_storage().nbytes()
    return totals
