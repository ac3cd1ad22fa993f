"""Reshaping: ``reshape``, a view of its input where the sizes allow one and a copy otherwise.

ATen's reshape is the view of its input wherever ``computeStride`` finds strides for the new sizes
(always for a contiguous input), and a contiguous copy viewed otherwise. With symbolic sizes it
decides that in SymInt arithmetic, each operation a call into python: about a millisecond a
reshape. Where the view is decided on sight (`viewable_on_sight`), the reshape is that view, which
fxprop's view computes on expressions; anything else, every reshape of concrete sizes and every
call spelled otherwise than ``reshape(x, sizes)`` (or ``x.reshape(*sizes)``), runs torch's own,
which refuses what torch refuses.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import symbolic
from ..aten.view_strides import viewable_on_sight
from ..engine import session as context
from ..engine.composite_kernels import call_composite
from ..resolve.registry import rule

aten = torch.ops.aten


@rule(aten.reshape.default)
def reshape(*args, **kwargs):
    return _view_or_torchs_own(aten.reshape.default, args, kwargs)


@rule(torch.reshape)
def torch_reshape(*args, **kwargs):
    return _view_or_torchs_own(torch.reshape, args, kwargs)


@rule(torch.Tensor.reshape)
def tensor_reshape(*args, **kwargs):
    return _view_or_torchs_own(torch.Tensor.reshape, args, kwargs, sizes_spread=True)


@rule("reshape")
def reshape_method(*args, **kwargs):
    """``x.reshape(...)``: a tensor's reshape, or the method of whatever else ``x`` is."""
    return _view_or_torchs_own("reshape", args, kwargs, sizes_spread=True)


def _view_or_torchs_own(reshape: Callable | str, args: tuple, kwargs: dict, sizes_spread: bool = False) -> Any:
    """``reshape(*args, **kwargs)`` (a method name: ``args[0]``'s method) as the view it is where that
    is decided on sight. ``sizes_spread``: the sizes may come as separate arguments (``x.reshape(2, 3)``)."""
    if not kwargs and len(args) >= 2 and type(args[0]) is torch.Tensor and symbolic.current().active:
        input, sizes = args[0], args[1:]
        if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
            sizes = sizes[0]
        elif not sizes_spread:
            sizes = None
        if sizes is not None and all(type(size) is int or isinstance(size, torch.SymInt) for size in sizes) \
                and viewable_on_sight(input, sizes):
            return aten.view.default(input, list(sizes))
    return call_composite(reshape, args, kwargs, context.node_device())
