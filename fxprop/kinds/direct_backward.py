"""Results of the backward kernels of softmax, layer norm and slicing computed directly.

Under symbolic sizes their meta kernels are torch's python decompositions, each part dispatched
again: ten to twenty-five milliseconds a call in a training graph. What the kernels allocate is
plain. ``_softmax_backward_data`` and ``_log_softmax_backward_data`` give a contiguous tensor of
the grad's sizes and dtype (``TORCH_META_FUNC(_softmax_backward_data)``);
``native_layer_norm_backward`` a contiguous input grad (``layer_norm_backward_cpu`` and ``_cuda``
make their input contiguous first) and weight and bias grads of the parameters' sizes, each only
where ``output_mask`` asks for it; ``slice_backward`` zeros of the input's sizes (contiguous, of the
grad's dtype) with the grad copied into the slice, broadcast as ``copy_`` broadcasts it.

As in `fxprop.kinds.direct`, only plain calls take the shortcut: sizes equal on sight, a dim in
range, and one floating dtype everywhere for softmax and layer norm. Anything else returns None
and the meta kernel runs, checks and raises as before.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..symbolic import known_laid_out_in
from ..torch_compat import canonicalize_dim, check, check_index
from .direct import (FULL_PRECISION, contiguous_result, empty_contiguous, one_float, plain_broadcast, same_sizes,
                     wrapped_dim)
from .direct_views import slice_extent

aten = torch.ops.aten

def softmax_backward_data(grad_output: Any, output: Any, dim: Any, input_dtype: Any) -> torch.Tensor | None:
    """Grad and output of one floating dtype, the forward's input of the same dtype (a half-to-float
    softmax's backward differs by device)."""
    if not (isinstance(grad_output, torch.Tensor) and isinstance(output, torch.Tensor)):
        return None
    dtype = one_float(grad_output, output)
    if dtype is None or input_dtype != dtype or not same_sizes(grad_output.shape, tuple(output.shape)) or \
            wrapped_dim(dim, grad_output.dim()) is None:
        return None
    return contiguous_result(grad_output, dtype)


def native_layer_norm_backward(grad_out: Any, input: Any, normalized_shape: Any, mean: Any, rstd: Any, weight: Any,
                               bias: Any, output_mask: Any) -> tuple | None:
    """Full precision, every tensor of the input's dtype, a contiguous input, statistics of the shape
    ``native_layer_norm`` gives them, and a weight and a bias wherever their grads are asked for (the
    kernels refuse a missing one)."""
    tensors = (grad_out, input, mean, rstd, *(t for t in (weight, bias) if t is not None))
    if not all(isinstance(t, torch.Tensor) for t in tensors) or not isinstance(output_mask, (list, tuple)) or \
            len(output_mask) != 3 or not all(type(asked) is bool for asked in output_mask):
        return None
    if not isinstance(normalized_shape, (list, tuple)) or not normalized_shape or \
            not all(type(size) is int for size in normalized_shape):
        return None
    normalized = tuple(normalized_shape)
    axis = input.dim() - len(normalized)
    statistics = (*input.shape[:axis], *(1 for _ in normalized))
    if one_float(*tensors) not in FULL_PRECISION or axis < 0 or not same_sizes(input.shape[axis:], normalized) or \
            not same_sizes(grad_out.shape, tuple(input.shape)) or \
            not (same_sizes(mean.shape, statistics) and same_sizes(rstd.shape, statistics)):
        return None
    want_input, want_weight, want_bias = output_mask
    if (want_weight and weight is None) or (want_bias and bias is None) or \
            any(t is not None and not same_sizes(t.shape, normalized) for t in (weight, bias)):
        return None
    if not known_laid_out_in(input.shape, input.stride(), torch.contiguous_format):
        return None  # a strided input's grad: laid out by its meta kernel, and on the CPU by the rule
    return (contiguous_result(input, input.dtype) if want_input else None,
            torch.empty(normalized, dtype=input.dtype, device="meta") if want_weight else None,
            torch.empty(normalized, dtype=input.dtype, device="meta") if want_bias else None)


def slice_backward(grad_output: Any, input_sizes: Any, dim: Any, start: Any, end: Any, step: Any) -> torch.Tensor | None:
    """Bounds that decide nothing (`slice_extent`), and a grad that ``copy_`` broadcasts into the
    slice on sight: the result; one it cannot broadcast there is refused as ``copy_`` refuses it
    (torch's decomposition, ``slice_scatter``, accepts some). Anything else is the meta kernel's."""
    if not isinstance(grad_output, torch.Tensor) or not isinstance(input_sizes, (list, tuple)) or \
            type(step) is not int or type(dim) is not int or \
            not all(isinstance(size, torch.SymInt) or (type(size) is int and size >= 0) for size in input_sizes):
        return None
    # The kernel slices zeros of the input's sizes: slice's own refusals, in its order (torch's
    # decomposition makes none of them).
    check_index(len(input_sizes) > 0, lambda: "slice() cannot be applied to a 0-dim tensor.")
    at = canonicalize_dim(len(input_sizes), dim)
    check(step > 0, lambda: "slice step must be positive")
    extent = slice_extent(input_sizes[at], start, end, step)
    if extent is None:
        return None
    sliced = list(input_sizes)
    sliced[at] = extent[1]
    broadcast = plain_broadcast([tuple(grad_output.shape), tuple(sliced)])
    if broadcast is None:
        if all(type(size) is int for size in (*grad_output.shape, *sliced)):
            torch.broadcast_shapes(tuple(grad_output.shape), tuple(sliced))  # raises copy_'s RuntimeError
        return None
    if not same_sizes(broadcast, tuple(sliced)):
        raise RuntimeError(f"output with shape {sliced} doesn't match the broadcast shape {list(broadcast)}")
    return empty_contiguous(tuple(input_sizes), grad_output.dtype)


DIRECT_BACKWARD: dict[Any, Callable[..., Any]] = {
    aten._softmax_backward_data.default: softmax_backward_data,
    aten._log_softmax_backward_data.default: softmax_backward_data,
    aten.native_layer_norm_backward.default: native_layer_norm_backward,
    aten.slice_backward.default: slice_backward,
}
