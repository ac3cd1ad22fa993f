"""Functional collectives (``_c10d_functional``): where torch's meta kernels lay results out, or
accept calls, otherwise than the real ops (the C++ kernels in ``c10d/Functional.cpp`` and the
process groups they call; compared with runs on the fake process group and on gloo in
``tests/test_distributed.py``). The other collectives keep torch's meta kernels.

A result depends on its group only through the group's size, which the ops take as an argument
(``group_size``) or do not need; the group the graph names is never looked up, so a graph
propagates where its process groups do not exist. Real execution alone refuses a ``group_size``
that is not the group's.
"""
from __future__ import annotations

import torch

from ..errors import PropagationError, UnsupportedError
from ..resolve.registry import rule
from ..torch_compat import check, distributed_available, register_dtensor_fake_kernels

REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "unused"})
"""The reduce ops the functional collectives accept by name, lower case only (``Functional.cpp``)."""


def _check_reduce_op(op_name: str, reduce_op: str) -> None:
    check(reduce_op in REDUCE_OPS, lambda: f"{op_name}: Unrecognized reduce_op: {reduce_op}")


def _check_scatter_divides(op_name: str, input: torch.Tensor, group_size: int) -> None:
    """Every process group refuses a first dim its group size does not divide (the kernel only warns)."""
    check(input.dim() == 0 or input.size(0) % group_size == 0,
          lambda: f"{op_name}: the first dim of the input ({input.size(0)}) is not divisible by the group size "
                  f"({group_size}): input tensor must be the same size as output size times world size")


def _into_out(op_name: str, out: torch.Tensor, expected: list) -> torch.Tensor:
    """An ``_out`` collective writes into ``out`` and returns it, its strides kept. Every process group
    refuses an ``out`` with another number of elements; one with as many in another shape is
    refused by gloo, and not every backend is known to refuse it, so fxprop does not decide."""
    if list(out.shape) == list(expected):
        return out
    numel = 1
    for size in expected:
        numel *= size
    if out.numel() != numel:
        raise PropagationError(f"{op_name}: out has shape {tuple(out.shape)}, the result has shape {tuple(expected)}",
                               error_type=RuntimeError)
    raise UnsupportedError(f"{op_name}: out has shape {tuple(out.shape)} for a result of shape {tuple(expected)}: "
                           "whether the process group takes it depends on its backend")


if distributed_available():
    c10d = torch.ops._c10d_functional

    @rule(c10d.all_reduce.default)
    def all_reduce(input, reduce_op, group_name):
        _check_reduce_op("all_reduce", reduce_op)
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    @rule(c10d.all_reduce_.default)
    def all_reduce_(input, reduce_op, group_name):
        _check_reduce_op("all_reduce_", reduce_op)
        return input

    @rule(c10d.all_reduce_coalesced.default)
    def all_reduce_coalesced(inputs, reduce_op, group_name):
        """Corrects the meta kernel's ``empty_like``: each result is a contiguous clone of its input."""
        _check_reduce_op("all_reduce_coalesced", reduce_op)
        return [torch.empty_like(input, memory_format=torch.contiguous_format) for input in inputs]

    @rule(c10d.all_reduce_coalesced_.default)
    def all_reduce_coalesced_(inputs, reduce_op, group_name):
        _check_reduce_op("all_reduce_coalesced_", reduce_op)
        return inputs

    @rule(c10d.broadcast.default)
    def broadcast(input, src, group_name):
        """Corrects the meta kernel's ``empty_like``: the result is a contiguous clone of the input."""
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    @rule(c10d.wait_tensor.default)
    def wait_tensor(tensor):
        """Corrects the meta kernel's ``empty_like``: the real op returns its input itself, strides and all
        (a non-dense one too: an in-place ``all_reduce_`` of a strided view)."""
        return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device)

    @rule(c10d.reduce_scatter_tensor.default)
    def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
        _check_reduce_op("reduce_scatter_tensor", reduce_op)
        _check_scatter_divides("reduce_scatter_tensor", input, group_size)
        return c10d.reduce_scatter_tensor.default(input, reduce_op, group_size, group_name)

    @rule(c10d.reduce_scatter_tensor_coalesced.default)
    def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
        _check_reduce_op("reduce_scatter_tensor_coalesced", reduce_op)
        for input in inputs:
            _check_scatter_divides("reduce_scatter_tensor_coalesced", input, group_size)
        return c10d.reduce_scatter_tensor_coalesced.default(inputs, reduce_op, group_size, group_name)

    @rule(c10d.reduce_scatter_tensor_out.default)
    def reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, *, out):
        _check_reduce_op("reduce_scatter_tensor_out", reduce_op)
        _check_scatter_divides("reduce_scatter_tensor_out", input, group_size)
        return _into_out("reduce_scatter_tensor_out", out, [input.size(0) // group_size, *input.shape[1:]])

    @rule(c10d.all_gather_into_tensor_out.default)
    def all_gather_into_tensor_out(input, group_size, group_name, *, out):
        expected = [input.size(0) * group_size, *input.shape[1:]] if input.dim() else [group_size]
        return _into_out("all_gather_into_tensor_out", out, expected)

    @rule(c10d.all_to_all_single.default)
    def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
        """The meta kernel does not check that the input splits add up to the input's first dim,
        which every process group checks."""
        check(not input_split_sizes or sum(input_split_sizes) == input.size(0),
              lambda: f"all_to_all_single: input split sizes {list(input_split_sizes)} add up to "
                      f"{sum(input_split_sizes)}, not to the input's first dim {input.size(0)}: "
                      "Split sizes doesn't match total dim 0 size")
        return c10d.all_to_all_single.default(input, output_split_sizes, input_split_sizes, group_name)

    @rule(torch.ops._dtensor.shard_dim_alltoall.default)
    def shard_dim_alltoall(input, gather_dim, shard_dim, group_name):
        """DTensor's all-to-all (a redistribution from one sharded dim to another): torch registers its
        fake with DTensor; until DTensor is imported, its only kernel runs the real collective."""
        register_dtensor_fake_kernels()
        return torch.ops._dtensor.shard_dim_alltoall.default(input, gather_dim, shard_dim, group_name)
