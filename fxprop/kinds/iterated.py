"""Results of elementwise ops with symbolic sizes, without their python kernels.

With symbolic sizes an elementwise op's meta kernel is torch's python reference, run in SymInt
arithmetic: a millisecond or more a call (``gelu_backward``, ``threshold_backward``, ``pow``), most
of it spent on the broadcast shape and the layout. Both are facts of sizes and strides: the shape is
the operands' broadcast, the layout TensorIterator's (`fxprop.aten.layout`, by which every static
elementwise result is laid out too). What is left is the dtype, and whether the kernel accepts the
call at all. For an elementwise op neither depends on sizes that broadcast plainly, so the same
kernel answers both on stand-ins: tensors of the operands' dtypes and ranks with one element per
dim, the call's other arguments as they are. Its answers are facts of the op, kept for the process
by the dtypes, ranks and arguments that decide them.

The shortcut is taken only where every answer is plain: sizes that broadcast equal-or-1 on sight, a
layout the ShapeEnv's ranges decide (`fxprop.aten.layout.decided_tensor_iterator_strides`), nothing
cast before iterating (on the CPU an operand of another dtype than the common one is iterated as a
dense copy: operands of several dtypes take the shortcut only where every one is dense already), no
complex operand, every tensor of the call an operand and every output of
the broadcast's rank. Anything else, and any call the stand-ins are refused, runs the meta kernel,
which checks and raises as before.
"""
from __future__ import annotations

from typing import Any

import torch

from ..aten.layout import decided_dense, plainly_iterated_operands
from ..torch_compat import OpOverload, has_symbolic_sizes
from .direct import dense_result, elementwise_result, plain_broadcast

_results_on_stand_ins: dict[tuple, tuple[bool, tuple[torch.dtype, ...]]] = {}
"""Whether an op returns a tuple and its outputs' dtypes, by `_stand_in_key`."""
_KEPT = 1 << 14


def iterated_result(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """``op``'s result for operands of symbolic sizes, or None where the meta kernel must run."""
    operands = plainly_iterated_operands(op, args, kwargs)
    if operands is None:
        return None
    tensors = [operand for operand in operands if isinstance(operand, torch.Tensor)]
    if not any(has_symbolic_sizes(tensor) for tensor in tensors) or _tensor_count((args, kwargs)) != len(tensors):
        return None
    if _symbolic_number((args, kwargs)):
        return None  # the kernel would compute with it, and may decide something about it
    if len({tensor.dtype for tensor in tensors}) > 1 and not all(decided_dense(tensor) for tensor in tensors):
        return None  # an operand of another dtype is iterated as its cast copy, laid out densely
    shape = plain_broadcast([tensor.shape for tensor in tensors])
    if shape is None:
        return None
    found = _on_stand_ins(op, args, kwargs, len(shape))
    if found is None:
        return None
    is_tuple, dtypes = found
    first = elementwise_result(shape, dtypes[0], tuple(tensors), iterated=tuple(operands))
    if first is None:
        return None
    if not is_tuple:
        return first
    return (first, *(dense_result(shape, first.stride(), dtype, first.numel()) for dtype in dtypes[1:]))


def _on_stand_ins(op: OpOverload, args: tuple, kwargs: dict, rank: int) -> tuple[bool, tuple] | None:
    key = _stand_in_key(op, args, kwargs)
    found = _results_on_stand_ins.get(key) if key is not None else None
    if found is not None:
        return found
    try:
        result = op(*_stand_ins(args), **_stand_ins(kwargs))
    except Exception:  # noqa: BLE001 (the meta kernel runs on the call itself and raises what torch raises)
        return None
    outputs = result if isinstance(result, tuple) else (result,)
    if not outputs or not all(isinstance(out, torch.Tensor) and out.dim() == rank for out in outputs):
        return None
    found = (isinstance(result, tuple), tuple(out.dtype for out in outputs))
    if key is not None and len(_results_on_stand_ins) < _KEPT:
        _results_on_stand_ins[key] = found
    return found


def _stand_ins(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty((1,) * value.dim(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_stand_ins(item) for item in value)
    if isinstance(value, dict):
        return {key: _stand_ins(item) for key, item in value.items()}
    return value


def _stand_in_key(op: OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """What the stand-ins' answer depends on: the op, each tensor's dtype and rank, every other
    argument by its type and value, and the default dtype (an integer input's floating result);
    None where a value cannot be a key."""
    def summary(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (torch.Tensor, value.dtype, value.dim())
        if isinstance(value, (list, tuple)):
            return (type(value), tuple(summary(item) for item in value))
        return (type(value), value)
    try:
        key = (op, torch.get_default_dtype(), summary(args),
               tuple(sorted((name, summary(value)) for name, value in kwargs.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _symbolic_number(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_symbolic_number(item) for item in value)
    if isinstance(value, dict):
        return any(_symbolic_number(item) for item in value.values())
    return False


def _tensor_count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, (list, tuple)):
        return sum(_tensor_count(item) for item in value)
    if isinstance(value, dict):
        return sum(_tensor_count(item) for item in value.values())
    return 0
