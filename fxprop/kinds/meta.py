"""Running torch's meta kernel for an aten op, checked and laid out as the real kernels would."""
from __future__ import annotations

from typing import Any

import torch

from .. import symbolic

from ..aten import layout
from ..aten.view_strides import VIEWS, as_aten_views, plain_view, remembered_view
from ..engine.blame import boundary
from .iterated import iterated_result
from .shortcuts import shortcut_result
from ..aten.in_place import check_writes_into_self
from ..torch_compat import OpOverload, call_kernel, meta_kernel_takes_no_outs


@boundary
def run_meta(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """``op`` on meta tensors (or computed directly, `fxprop.kinds.direct`): an in-place op is refused
    where its result would not fit ``self``, an elementwise result is restrided as TensorIterator
    would, and a view as ATen's kernel would."""
    check_writes_into_self(op, args, kwargs)
    if op in VIEWS:
        return remembered_view(op, args, kwargs, lambda: _view(op, args, kwargs))
    return _laid_out_result(op, args, kwargs)


def _view(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    viewed = plain_view(args) if not kwargs and type(args[0]) is torch.Tensor and symbolic.current().active else None
    return viewed if viewed is not None else _laid_out_result(op, args, kwargs)


def _laid_out_result(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    result = shortcut_result(op, args, kwargs)
    if result is None and symbolic.current().active:
        result = iterated_result(op, args, kwargs)
    if result is None and meta_kernel_takes_no_outs(op):  # its python Meta kernel refuses every out= call
        result = call_kernel(op, "CompositeExplicitAutograd", *args, **kwargs)
    elif result is None:
        result = op(*args, **kwargs)
    return as_aten_views(op, args, layout.relayout(op, args, kwargs, result))
