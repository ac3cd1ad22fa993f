"""Reductions whose meta kernels accept what every real kernel refuses."""
from __future__ import annotations

import torch

from ..engine import session as context
from ..resolve.registry import rule
from ..symbolic.sizes import known_laid_out_in, resolve
from ..torch_compat import canonicalize_dim, check, check_index, scalar_type_name

aten = torch.ops.aten


def wrap_dim(dim: int, ndim: int) -> int:
    """torch's maybe_wrap_dim: a 0-dim tensor takes dims -1 and 0; the error is torch's IndexError."""
    return canonicalize_dim(max(ndim, 1), dim)


def _reduction_needing_elements(op, name: str, default_dim: int | None = None):
    """Corrects the meta kernel of a reduction that returns an element of its input (max, min,
    median, mode): real kernels refuse a zero-size reduced dim, which has no element to return."""
    def of_nonempty(self, *args, **kwargs):
        if args or "dim" in kwargs or default_dim is not None:
            dim = args[0] if args else kwargs.get("dim", default_dim)
            if self.dim() > 0:
                wrapped = dim + self.dim() if dim < 0 else dim
                check_index(not (0 <= wrapped < self.dim()) or self.shape[wrapped] != 0,
                            lambda: f"{name}(): Expected reduction dim {wrapped} to have non-zero size.")
        else:
            check(self.numel() != 0, lambda: f"{name}(): Expected reduction dim to be specified for "
                                              "input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
        return op(self, *args, **kwargs)
    of_nonempty.__name__ = of_nonempty.__qualname__ = f"{name}_of_nonempty"
    return rule(op)(of_nonempty)


for _op, _name in [(aten.max.dim, "max"), (aten.min.dim, "min"), (aten.max.default, "max"),
                   (aten.min.default, "min"), (aten.median.dim, "median"), (aten.nanmedian.dim, "nanmedian")]:
    _reduction_needing_elements(_op, _name)
_reduction_needing_elements(aten.mode.default, "mode", default_dim=-1)


def _reduction_over_nonempty_dims(op, name: str, needs_dim: bool = False):
    """Corrects the meta kernels of amax, amin, aminmax, argmax and argmin, which refuse a
    zero-size reduced dim with RuntimeError where the real kernels raise IndexError (naming the
    dim as it was given; argmax and argmin also when an empty input is reduced whole)."""
    def over_nonempty_dims(self, *args, **kwargs):
        dim = args[0] if args else kwargs.get("dim")
        check_index(not needs_dim or dim is not None or self.numel() != 0,
                    lambda: f"{name} Expected reduction dim to be specified for input.numel() == 0.")
        dims = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
        if self.dim() > 0:
            for given in dims:
                wrapped = given + self.dim() if given < 0 else given
                check_index(not (0 <= wrapped < self.dim()) or self.shape[wrapped] != 0,
                            lambda: f"{name} Expected reduction dim {given} to have non-zero size.")
        return op(self, *args, **kwargs)
    over_nonempty_dims.__name__ = over_nonempty_dims.__qualname__ = f"{name.split('(')[0].rstrip(':')}_over_nonempty_dims"
    return rule(op)(over_nonempty_dims)


for _op, _name in [(aten.amax.default, "amax():"), (aten.amin.default, "amin():"), (aten.aminmax.default, "aminmax:")]:
    _reduction_over_nonempty_dims(_op, _name)
for _op, _name in [(aten.argmax.default, "argmax():"), (aten.argmin.default, "argmin():")]:
    _reduction_over_nonempty_dims(_op, _name, needs_dim=True)


@rule(aten.mean.dim)
def mean(self, dim, keepdim=False, *, dtype=None):
    """Corrects aten.mean.dim's meta kernel, which checks ``dim`` first: real kernels first refuse
    a result dtype that is not floating point or complex (an integer input's, or ``dtype``'s)."""
    result_dtype = dtype if dtype is not None else self.dtype
    check(result_dtype.is_floating_point or result_dtype.is_complex,
          lambda: f"mean(): could not infer output dtype. {'Input' if dtype is None else 'Optional'} dtype must be "
                  f"either a floating point or complex dtype. Got: {scalar_type_name(result_dtype)}")
    return aten.mean.dim(self, dim, keepdim, dtype=dtype)


def _softmax_checking_dim(op):
    """Corrects the softmax meta kernels, which accept any ``dim``: real kernels wrap it against the rank."""
    def softmax(self, dim, half_to_float):
        wrap_dim(dim, self.dim())
        return op(self, dim, half_to_float)
    softmax.__name__ = softmax.__qualname__ = f"{op.__name__.split('.')[0].lstrip('_')}_checking_dim"
    return rule(op)(softmax)


_softmax_checking_dim(aten._softmax.default)
_softmax_checking_dim(aten._log_softmax.default)


def _softmax_backward_checking_operands(op, checks_sizes: bool):
    """Corrects the softmax backward meta kernels, decompositions that broadcast the grad against the
    output and give ``input_dtype``: real kernels refuse sizes that differ (softmax's; log softmax's
    reads the output at the grad's sizes, left to the meta kernel), wrap ``dim`` against the
    rank, and give a contiguous tensor of the grad's dtype -- half for a float grad of a half
    softmax. Over an output of elements, they also refuse one of another dtype, and the CPU's
    that half-to-float backward."""
    def softmax_backward(grad_output, output, dim, input_dtype):
        differing = checks_sizes and (grad_output.dim() != output.dim() or any(
            resolve(size == other, default=True) is False for size, other in zip(grad_output.shape, output.shape)))
        check(not differing, lambda: f"Expected tensor for argument #1 'grad' to have same size as tensor for argument "
                                     f"#2 'output'; but {list(grad_output.shape)} does not equal {list(output.shape)}")
        wrap_dim(dim, grad_output.dim())
        half_to_float = grad_output.dtype is torch.float32 and input_dtype is torch.float16
        iterated = resolve(output.numel() != 0, default=True)  # the CPU kernels return early for an empty output
        mismatched = None if not iterated else output.dtype if output.dtype != grad_output.dtype else (
            input_dtype if half_to_float and context.node_on_cpu() else None)
        check(mismatched is None, lambda: f"expected scalar type {scalar_type_name(grad_output.dtype)} but found "
                                          f"{scalar_type_name(mismatched)}")
        dtype = input_dtype if half_to_float else grad_output.dtype
        result = op(grad_output, output, dim, dtype)
        if result.dtype != dtype:  # an integer grad of no elements, made floating by the decomposition's exp
            result = result.to(dtype)
        return result if known_laid_out_in(result.shape, result.stride(), torch.contiguous_format) else result.contiguous()
    name = op.__name__.split(".")[0].lstrip("_")
    softmax_backward.__name__ = softmax_backward.__qualname__ = f"{name}_checking_operands"
    return rule(op)(softmax_backward)


_softmax_backward_checking_operands(aten._softmax_backward_data.default, checks_sizes=True)
_softmax_backward_checking_operands(aten._log_softmax_backward_data.default, checks_sizes=False)


_REDUCTION_NONE = 0


@rule(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    """Corrects the meta kernel (a decomposition over ``atleast_2d``), which keeps a batch of one
    for a 0-d or 1-d input under ``reduction='none'``: the CPU kernel gives one 0-dim loss."""
    loss, is_target = aten.multilabel_margin_loss_forward.default(self, target, reduction)
    return (loss.view(()) if reduction == _REDUCTION_NONE and self.dim() <= 1 else loss), is_target


@rule(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    """Corrects the meta kernel as `multilabel_margin_loss_forward` does: one 0-dim loss for a 0-d or
    1-d input under ``reduction='none'``."""
    loss = aten.multi_margin_loss.default(self, target, p, margin, weight, reduction)
    return loss.view(()) if reduction == _REDUCTION_NONE and self.dim() <= 1 else loss


@rule(aten.cov.default, torch.cov, "cov")
def cov(input, correction=1, fweights=None, aweights=None):
    """Corrects nothing in a kernel: torch's cov (ATen's Correlation.cpp) reads the data once, to
    warn when the degrees of freedom are not positive, and the result's metadata never depends
    on it. This is the same computation without that look."""
    check(input.dim() <= 2, lambda: "cov(): expected input to have two or fewer dimensions but got an input "
                                    f"with {input.dim()} dimensions")
    x = input if input.dim() == 2 else input.view(1, -1)
    observations = x.shape[1]
    weights = None
    for name, given, integral in (("fweights", fweights, True), ("aweights", aweights, False)):
        if given is None:
            continue
        check(given.dim() <= 1, lambda: f"cov(): expected {name} to have one or fewer dimensions but got {name} "
                                        f"with {given.dim()} dimensions")
        if integral:
            check(not (given.dtype.is_floating_point or given.dtype.is_complex),
                  lambda: f"cov(): expected fweights to have integral dtype but got fweights with {given.dtype} dtype")
        else:
            check(given.dtype.is_floating_point, lambda: "cov(): expected aweights to have floating point dtype but "
                                                         f"got aweights with {given.dtype} dtype")
        check(given.numel() == observations, lambda: f"cov(): expected {name} to have the same numel as there are "
                                                     f"observations in the input but got {given.numel()} != {observations}")
        weights = given if weights is None else weights * given
    if weights is None:
        weight_sum = torch.scalar_tensor(observations, dtype=torch.int64)
        average = x.sum(1) / weight_sum
        norm_factor = weight_sum - correction
    else:
        weight_sum = weights.sum()
        average = (x * weights).sum(1) / weight_sum
        if correction == 0:
            norm_factor = weight_sum
        elif aweights is None:
            norm_factor = weight_sum - correction
        else:
            norm_factor = weight_sum - correction * (weights * aweights).sum() / weight_sum
    centred = x - average.unsqueeze(1)
    product = torch.mm(centred, (centred if weights is None else centred * weights).t().conj())
    return torch.true_divide(product, norm_factor).squeeze()


@rule(aten.corrcoef.default, torch.corrcoef, "corrcoef")
def corrcoef(input):
    """cov normalized by the standard deviations, clipped to [-1, 1] (ATen's Correlation.cpp);
    a rule because it reaches cov inside torch's C++, past cov's rule."""
    c = cov(input)
    if c.dim() == 0:
        return c / c
    diagonal = c.diagonal()
    deviation = torch.sqrt(diagonal.real if diagonal.is_complex() else diagonal)
    c = c / deviation.view(-1, 1)
    c = c / deviation.view(1, -1)
    if c.is_complex():
        return torch.complex(c.real.clip(-1, 1), c.imag.clip(-1, 1))
    return c.clip(-1, 1)
