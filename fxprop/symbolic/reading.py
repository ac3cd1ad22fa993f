"""Reading results back in the user's own symbols (`shape_of`), and host stand-ins of symbolic tensors."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import InputError
from .session import _SESSIONS, _plain
from .sizes import definitely_equal


def shape_of(node: Any) -> Any:
    """A node's shape as a tuple of ints and sympy expressions in the user's own symbols.

    Multi-output nodes give a tuple of such tuples; a node holding a python size (``x.size(0)``,
    ``operator.mul``) gives its expression; a torch.Size gives a tuple.
    """
    if "val" not in node.meta:
        raise InputError(f"node %{node.name} has no propagated value; run fxprop.propagate first")
    return user_shape(node.meta["val"])


def user_shape(value: Any) -> Any:
    """`shape_of` for a value rather than a node: sizes in the user's own symbols."""
    return _shape(value)


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(_user(dim) for dim in value.shape)
    if isinstance(value, torch.Size):
        return tuple(_user(dim) for dim in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _user(value)
    if isinstance(value, (list, tuple)):
        return tuple(_shape(item) for item in value)
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return value


def _user(dim: Any) -> Any:
    if isinstance(dim, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        session = _SESSIONS.get(dim.node.shape_env)
        if session is not None:
            return session.user(dim.node.expr)
        return _plain(dim.node.expr)
    return dim


def _example_size(size: Any) -> int:
    if not isinstance(size, torch.SymInt):
        return size
    hint = size.node.hint
    return hint if isinstance(hint, int) else 2


def host_sample(tensor: torch.Tensor) -> torch.Tensor:
    """A small CPU tensor standing in for a symbolic one where a host check needs a real tensor.

    A symbolic dim takes its symbol's example value where it has one (dynamo's and export's
    backed symbols), so that it compares with other tensors' dims as the real ones do (an SDPA
    mask's sequence length against the query's); an unbacked one becomes 2. Over 2**24 elements,
    every dim is at most 2. The last dim keeps whether its stride is 1.
    """
    sizes = [_example_size(size) for size in tensor.shape]
    if math.prod(sizes) > 1 << 24:
        sizes = [min(size, 2) for size in sizes]
    sample = torch.empty(sizes, dtype=tensor.dtype, device="cpu")
    if tensor.dim() >= 2 and not definitely_equal(tensor.stride()[-1], 1):
        sample = torch.empty([*sizes[:-2], sizes[-1], sizes[-2]], dtype=tensor.dtype, device="cpu").transpose(-1, -2)
    return sample
