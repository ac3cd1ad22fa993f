"""Ops whose output sizes depend on the data: each such size is a fresh, bounded symbol.

No size is guessed from example data: ``nonzero`` on any input gives ``(u0, ndim)`` with
``0 <= u0 <= numel``, recorded with the node that defined it (`fxprop.symbolic`). This holds
for concrete inputs too, so a graph with concrete inputs may carry symbolic sizes downstream.
Modelled on torch's own fake implementations (`torch/_subclasses/fake_impls.py`).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..devices import device_of
from ..engine import session as context
from .. import symbolic
from ..errors import DataDependentError, UnsupportedError
from ..resolve.registry import rule
from ..torch_compat import check, scalar_type_name

aten = torch.ops.aten


def _numel(tensor: torch.Tensor):
    return math.prod(tensor.shape) if tensor.dim() else 1


def _count(upper) -> int | torch.SymInt:
    """A fresh size in [0, upper]; an empty input has exactly 0 elements selected."""
    if isinstance(upper, int) and upper == 0:
        return 0
    return symbolic.current().fresh_size(upper)


@rule(aten.nonzero.default)
def nonzero(input: torch.Tensor) -> torch.Tensor:
    count = _count(_numel(input))
    return torch.empty_strided((count, input.dim()), (1, count), dtype=torch.int64, device="meta")


@rule(aten.masked_select.default)
def masked_select(input: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(input.shape, mask.shape)
    return torch.empty((_count(math.prod(shape)),), dtype=input.dtype, device="meta")


def _unique(input: torch.Tensor, dim: int | None, return_inverse: bool, return_counts: bool):
    if dim is not None:
        dim = dim % max(input.dim(), 1)
    count = _count(_numel(input) if dim is None else input.shape[dim])
    values = (torch.empty((count,), dtype=input.dtype, device="meta") if dim is None else
              torch.empty((*input.shape[:dim], count, *input.shape[dim + 1:]), dtype=input.dtype, device="meta"))
    inverse_shape = tuple(input.shape) if dim is None else (input.shape[dim],)
    inverse = torch.empty(inverse_shape if return_inverse else (0,), dtype=torch.int64, device="meta")
    counts = torch.empty((count,) if return_counts else (0,), dtype=torch.int64, device="meta")
    return values, inverse, counts


@rule(aten._unique2.default)
def unique2(input: torch.Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False):
    return _unique(input, None, return_inverse, return_counts)


@rule(aten._unique.default)
def unique(input: torch.Tensor, sorted: bool = True, return_inverse: bool = False):
    values, inverse, _ = _unique(input, None, return_inverse, False)
    return values, inverse


@rule(aten.unique_dim.default)
def unique_dim(input: torch.Tensor, dim: int, sorted: bool = True, return_inverse: bool = False,
               return_counts: bool = False):
    return _unique(input, dim, return_inverse, return_counts)


@rule(aten.unique_consecutive.default)
def unique_consecutive(input: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None):
    return _unique(input, dim, return_inverse, return_counts)


@rule(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats: torch.Tensor, *, output_size: int | None = None) -> torch.Tensor:
    if output_size is None:
        # The sum of the repeats has no bound a static pass can know; sizes are non-negative.
        output_size = symbolic.current().fresh_size(None)
    return torch.empty((output_size,), dtype=repeats.dtype, device="meta")


def known_values(tensor: torch.Tensor) -> torch.Tensor | None:
    """The values of a tensor the user passed in for real (small integer tensors), else None."""
    session = context.current_session()
    return session.real_values.get(tensor) if session is not None else None


@rule(aten._local_scalar_dense.default, aten.item.default)
def local_scalar_dense(input: torch.Tensor):
    """A value read from data: a fresh symbol, unless the tensor is one the user passed in for real.
    An empty tensor holds no value to read."""
    numel = _numel(input)
    check(not (isinstance(numel, int) and numel == 0), lambda: "_local_scalar_dense: Empty tensor not supported")
    known = known_values(input)
    if known is not None:
        with context.on_host():
            return known.item()
    return symbolic.current().fresh_value(input.dtype)


@rule("tolist", torch.Tensor.tolist)
def tolist(self: torch.Tensor) -> Any:
    """Values read from data: the real ones of a tensor the user passed in for real, else one fresh
    symbol per element, nested as the tensor's dims."""
    known = known_values(self)
    if known is not None:
        with context.on_host():
            return known.tolist()
    if not all(isinstance(size, int) for size in self.shape):
        # fxprop's limit, not the model's error: real execution has a number of values to list
        message = f"tolist(): a tensor of symbolic shape {tuple(self.shape)} has no fixed number of values"
        if free_unbacked_symbols(tuple(self.shape)):
            raise DataDependentError(f"{message}: its size depends on the data")
        raise UnsupportedError(message)

    def nested(sizes: tuple) -> Any:
        if not sizes:
            return symbolic.current().fresh_value(self.dtype)
        return [nested(sizes[1:]) for _ in range(sizes[0])]
    return nested(tuple(self.shape))


@rule("tensor_split", torch.tensor_split, torch.Tensor.tensor_split, aten.tensor_split.tensor_indices_or_sections)
def tensor_split(input: torch.Tensor, indices_or_sections: Any = None, dim: int = 0, *, sections: Any = None,
                 indices: Any = None, tensor_indices_or_sections: Any = None) -> tuple:
    """Splits ``input`` along ``dim`` into a number of sections, or at indices. Given as a tensor,
    they are read on the host, as torch's kernel reads them: a CPU tensor of longs, 0-dim for a
    number of sections, 1-dim for indices. Its values are known for a tensor built from constants
    (`fxprop.known_values`); for any other tensor the split depends on the data."""
    by = next((value for value in (indices_or_sections, tensor_indices_or_sections, sections, indices)
               if value is not None), None)
    if isinstance(by, torch.Tensor):
        by = _split_points_on_the_host(by)
    overload = aten.tensor_split.indices if isinstance(by, (list, tuple)) else aten.tensor_split.sections
    return overload(input, by, dim)


def _split_points_on_the_host(by: torch.Tensor) -> int | list[int]:
    check(device_of(by).type == "cpu",
          lambda: f"tensor_split expected tensor_indices_or_sections to be on cpu, but it's on {device_of(by)}")
    check(by.dtype == torch.int64, lambda: "tensor_split expected tensor_indices_or_sections to have dtype of long, "
                                           f"but got {scalar_type_name(by.dtype)}")
    check(by.dim() in (0, 1), lambda: "tensor_split expected tensor_indices_or_sections to be a zero-dimensional "
                                      f"or one-dimensional tensor, but got a tensor with {by.dim()} dims")
    known = known_values(by)
    if known is None:
        raise DataDependentError(f"tensor_split by a tensor of {'sections' if by.dim() == 0 else 'indices'}: "
                                 "its values depend on the data")
    with context.on_host():
        return known.tolist()


@rule(aten.unique_dim_consecutive.default)
def unique_dim_consecutive(input: torch.Tensor, dim: int, return_inverse: bool = False,
                           return_counts: bool = False):
    return _unique(input, dim, return_inverse, return_counts)


@rule(aten.bincount.default)
def bincount(self: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """The length is ``max(max(self) + 1, minlength)``: a fresh size of at least ``minlength`` (exactly
    ``minlength`` for an empty input). Weighted counts are float32 for float32 weights, else float64;
    an empty input counts nothing, in int64 whatever the weights."""
    check(self.dim() == 1 and not (self.dtype.is_floating_point or self.dtype.is_complex),
          lambda: f"bincount only supports 1-d non-negative integral inputs, got a {self.dim()}-d {self.dtype} tensor")
    check(minlength >= 0, lambda: "minlength should be >= 0")
    length = minlength if _numel(self) == 0 else symbolic.current().fresh_size(None, lower=max(minlength, 1))
    empty = isinstance(_numel(self), int) and _numel(self) == 0
    dtype = torch.int64 if weights is None or empty else (
        torch.float32 if weights.dtype == torch.float32 else torch.float64)
    return torch.empty((length,), dtype=dtype, device="meta")


@rule(aten.one_hot.default, torch.nn.functional.one_hot)
def one_hot(self: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``num_classes`` classes, or (when -1) ``max(self) + 1``: a fresh size. Laid out contiguous,
    as the kernels fill ``zeros`` (the composite kernel's other branch, for meta tensors, follows
    ``self``'s layout through ``eq``, which is why ``torch.nn.functional.one_hot`` needs this rule too)."""
    check(self.dtype == torch.int64, lambda: "one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        check(_numel(self) != 0, lambda: "Can not infer total number of classes from empty tensor.")
        num_classes = symbolic.current().fresh_size(None, lower=1)
    return torch.empty((*self.shape, num_classes), dtype=torch.int64, device="meta")


def _ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, max_target_length) -> tuple:
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    steps = log_probs.shape[0]
    negative_log_likelihood = log_probs.new_empty((batch,) if log_probs.dim() == 3 else ())
    log_alpha = log_probs.new_empty((batch, steps, 2 * max_target_length + 1))
    return negative_log_likelihood, log_alpha


@rule(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """log_alpha is (batch, steps, 2 * max(target_lengths) + 1)."""
    return _ctc_loss(log_probs, targets, max(target_lengths, default=0))


@rule(aten._ctc_loss.Tensor)
def ctc_loss_tensor_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """With the target lengths in a tensor, their maximum is a value: known for a tensor passed in for
    real, else a fresh size bounded by the targets' length."""
    known = known_values(target_lengths)
    if known is not None:
        with context.on_host():
            longest = int(known.max()) if known.numel() else 0
    else:
        bound = targets.shape[1] if targets.dim() == 2 else _numel(targets)
        longest = symbolic.current().fresh_size(bound)
    return _ctc_loss(log_probs, targets, longest)


@rule(aten.linalg_lstsq.default)
def linalg_lstsq(self: torch.Tensor, b: torch.Tensor, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular_values). The solution's shape is static; what the other
    three hold depends on the driver (CPU default "gelsy", CUDA "gels"), and the residuals of "gelsd"
    and "gelss" exist only when the matrix has full rank: a fact about the data."""
    device = context.node_device()
    driver = driver or ("gelsy" if device is None or device.type == "cpu" else "gels")
    check(driver in ("gels", "gelsy", "gelsd", "gelss"),
          lambda: f"torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss), got {driver}")
    check(self.dim() >= 2, lambda: f"torch.linalg.lstsq: input must have at least 2 dimensions, got {self.dim()}")
    vector = b.dim() == self.dim() - 1
    rows, columns = self.shape[-2], self.shape[-1]
    batch = torch.broadcast_shapes(self.shape[:-2], b.shape[:-1] if vector else b.shape[:-2])
    rhs = 1 if vector else b.shape[-1]
    taller = max(rows, columns)
    buffer = torch.empty_strided((*batch, taller, rhs), (*symbolic.contiguous_strides(batch, inner=taller * rhs), 1, taller),
                                 dtype=self.dtype, device="meta")
    solution = buffer.narrow(-2, 0, columns)
    if vector:
        solution = solution.squeeze(-1)
    real_dtype = self.real.dtype if self.is_complex() else self.dtype
    rank = (torch.empty(batch, dtype=torch.int64, device="meta") if driver != "gels"
            else torch.empty((0,), dtype=torch.int64, device="meta"))
    singular_values = (torch.empty((*batch, min(rows, columns)), dtype=real_dtype, device="meta")
                       if driver in ("gelsd", "gelss") else torch.empty((0,), dtype=real_dtype, device="meta"))
    if driver == "gelsy" or rows <= columns:
        residuals = torch.empty((0,), dtype=real_dtype, device="meta")
    elif driver == "gels":
        residuals = torch.empty((*batch, rhs) if not vector else batch, dtype=real_dtype, device="meta")
    else:
        raise DataDependentError(f"torch.linalg.lstsq: with driver {driver!r} the residuals exist only when the "
                                 "matrix has full rank, which depends on its values")
    return solution, residuals, rank, singular_values


# --- questions about values: answered from real values, else an unknown SymBool ---------

def _answer_from_values(question, *tensors: torch.Tensor) -> Any:
    """``question`` asked of the real values when the user passed every tensor in for real,
    else a fresh symbolic bool: synthesized data never answers a question about values."""
    known = [known_values(tensor) for tensor in tensors]
    if all(values is not None for values in known):
        with context.on_host():
            return question(*known)
    return symbolic.current().fresh_value(torch.bool)


@rule(aten.equal.default, torch.equal, "equal")
def equal(self: torch.Tensor, other: torch.Tensor) -> Any:
    """True when shapes and every value agree. Different shapes answer False without data."""
    if len(self.shape) != len(other.shape) or any(
            symbolic.resolve(a != b, default=False) for a, b in zip(self.shape, other.shape)):
        return False
    return _answer_from_values(torch.equal, self, other)


@rule(aten.allclose.default, torch.allclose, "allclose")
def allclose(self: torch.Tensor, other: torch.Tensor, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> Any:
    """isclose(...).all(): torch checks dtypes and broadcasting first, then reads the values."""
    check(self.dtype == other.dtype, lambda: f"{scalar_type_name(self.dtype)} did not match {scalar_type_name(other.dtype)}")
    aten.isclose.default(self, other, rtol, atol, equal_nan)
    return _answer_from_values(lambda a, b: torch.allclose(a, b, rtol, atol, equal_nan), self, other)


@rule(aten.is_nonzero.default, torch.is_nonzero, "is_nonzero")
def is_nonzero(self: torch.Tensor) -> Any:
    """``bool(t)`` of a one-element tensor; more or fewer elements are ambiguous."""
    check(self.numel() != 0, lambda: "Boolean value of Tensor with no values is ambiguous")
    check(self.numel() == 1, lambda: "Boolean value of Tensor with more than one value is ambiguous")
    return _answer_from_values(lambda t: bool(t), self)


@rule(aten._nested_tensor_from_mask_left_aligned.default)
def nested_tensor_from_mask_left_aligned(t: torch.Tensor, mask: torch.Tensor):
    """Whether every row of the padding mask is a run of True then of False: a question about the
    mask's values alone (of ``t`` the kernel reads the sizes). Answered for a mask whose values are
    known (TransformerEncoder's fast-path check of a real padding mask), else a fresh bool."""
    check(mask.dtype == torch.bool, lambda: f"Expected mask to be of type Bool, got {mask.dtype}")
    check(mask.dim() == 2, lambda: "Padding mask should be 2D")
    check(t.dim() == 3, lambda: "Input should be a 3D tensor, N * L * D")
    check(t.shape[0] == mask.shape[0] and t.shape[1] == mask.shape[1], lambda: "Mask size should match input size")
    known = known_values(mask)
    if known is None:
        return symbolic.current().fresh_value(torch.bool)
    with context.on_host():
        sizes_only = torch.zeros((), dtype=t.dtype).expand(tuple(t.shape))
        return aten._nested_tensor_from_mask_left_aligned.default(sizes_only, known)
