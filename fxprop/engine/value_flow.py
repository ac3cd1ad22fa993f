"""Known values through ops: an op whose every tensor input is known computes known values too.

A real small integer tensor the user passed in, a module's counter (BatchNorm's
``num_batches_tracked``), a constant: fxprop knows their values (`fxprop.known_values`). When an
aten op reaches the dispatch with only such tensors -- or none, a factory such as ``full`` or
``arange`` of concrete sizes -- its results' values are known as well: the op runs once more on
the host, on copies of the known values, and each result (and each tensor it writes in place)
is remembered with the values real execution would give it. So ``float(num_batches_tracked)``
after ``num_batches_tracked.add_(1)`` is a number, and TransformerEncoder's check of a real bool
mask against the causal mask it builds (``bool((mask == causal).all())``) is decided.

Results of up to 65,536 elements are kept, of any dtype: computed from known values, a float is
known as exactly as an integer (of a user's input fxprop keeps only what `values_worth_knowing`
says, as float inputs are data). Nothing random (``nondeterministic_seeded``),
nothing uninitialized (``empty``, ``new_empty``, ``resize_``), nothing that reads its input's
storage beyond the view (``as_strided``, ``_reshape_alias``), nothing of symbolic size and
nothing whose meta layout the host result cannot take is remembered: those results stay
values fxprop does not know.
"""
from __future__ import annotations

from typing import Any

import torch

from ..aten.in_place import written_arguments
from ..devices import META
from ..call import Call
from ..torch_compat import OpOverload, is_non_overlapping_and_dense, pytree, schema_of
from ..errors import PropagationError
from .known_values import KnownValues
from .session import node_device

LIMIT = 1 << 16  # elements, as `fxprop.specs.values_worth_knowing`
_UNDEFINED = ("empty", "resize", "set_")  # results whose values no input decides
# Results that read their input's storage beyond the view (strides and offset are the storage's):
# the host copy of a known value is compact, so its storage holds other elements.
_STORAGE_RELATIVE = ("as_strided", "_reshape_alias")
_SKIPPED_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise,
                 torch.Tag.dynamic_output_shape)


def worth_knowing(tensor: torch.Tensor) -> bool:
    """A result small enough to keep: up to `LIMIT` elements of any dtype (computed from known
    values, a float result is known as exactly as an integer one: a mask made float by
    ``masked_fill``)."""
    if any(isinstance(size, torch.SymInt) for size in tensor.shape):
        return False
    return tensor.numel() <= LIMIT


_deciding: dict[Any, bool] = {}


def _decides_values(func: Any) -> bool:
    """Whether ``func``'s results are decided by its inputs' values alone (not random, not
    uninitialized memory, not data-dependent in shape): a fact about the op, kept per op."""
    found = _deciding.get(func)
    if found is None:
        found = (isinstance(func, OpOverload) and not any(tag in func.tags for tag in _SKIPPED_TAGS)
                 and not any(part in schema_of(func).name.split("::", 1)[-1]
                             for part in (*_UNDEFINED, *_STORAGE_RELATIVE)))
        _deciding[func] = found
    return found


def host_inputs(call: Call, known: KnownValues) -> dict[int, torch.Tensor] | None:
    """Copies of the known values of the call's tensor inputs (by the input's id), when its results
    get known values: every tensor input is known and the op decides its values from its inputs
    alone; else None. Taken before the op runs: an in-place op forgets what it writes."""
    if not _decides_values(call.target) or call.kwargs.get("generator") is not None:
        return None
    tensors = call.tensors
    if tensors and not (known and all(tensor in known for tensor in tensors)):
        return None
    if call.has_symbolic:
        return None
    return {id(tensor): known.get(tensor).detach().to("cpu", copy=True) for tensor in tensors}


def learn(func: OpOverload, args: tuple, kwargs: dict, result: Any, copies: dict[int, torch.Tensor],
          known: KnownValues) -> None:
    """Run ``func`` on the host on ``copies`` (`host_inputs`), and remember the values of its small
    results and of the tensors it writes."""
    outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    written = written_arguments(func, args, kwargs) if schema_of(func).is_mutable else []
    if not any(worth_knowing(t) for t in (*outputs, *written)) or not all(worth_knowing(t) for t in outputs):
        return  # the host would make every output: one beyond the limit (``qr``'s complete Q) is not made

    def on_host(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return copies[id(value)]
        if isinstance(value, torch.device) and value == META:
            return torch.device("cpu")
        return value
    host_args, host_kwargs = pytree.tree_map(on_host, (args, kwargs))
    if host_kwargs.get("device") == META:
        host_kwargs["device"] = torch.device("cpu")
    try:
        with torch.no_grad():
            host_result = func(*host_args, **host_kwargs)
    except (RuntimeError, IndexError, ValueError, TypeError) as error:
        device = node_device()
        if (device is None or device.type == "cpu") and "meta" not in str(error):  # "meta": our host copy went wrong
            # the CPU kernel on the very values the node has: it refuses them for real (an index out of
            # range, an integer division by zero), which meta kernels never look at
            raise PropagationError(str(error).split("\n")[0], error_type=type(error)) from error
        return  # another device's kernel may answer otherwise (a device-side assert): the values stay unknown
    for meta in written:
        copy = copies.get(id(meta))
        if copy is not None:
            _remember(meta, copy, known)
    host_outputs = [t for t in pytree.tree_leaves(host_result) if isinstance(t, torch.Tensor)]
    if len(host_outputs) != len(outputs):
        return
    written_ids = {id(meta) for meta in written}
    for meta, real in zip(outputs, host_outputs):
        if id(meta) not in written_ids:  # an in-place op returns what it wrote: learned above
            _remember(meta, real, known)


def _remember(meta: torch.Tensor, real: torch.Tensor, known: KnownValues) -> None:
    if not worth_knowing(meta) or tuple(meta.shape) != tuple(real.shape) or meta.dtype != real.dtype:
        return
    if real.stride() != meta.stride():
        if not is_non_overlapping_and_dense(meta):
            return  # the host's layout overlaps where meta's does not, or the other way round
        laid_out = torch.empty_strided(meta.shape, meta.stride(), dtype=real.dtype)
        laid_out.copy_(real)
        real = laid_out
    known.learn(meta, real)
