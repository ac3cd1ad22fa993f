"""Reading tensor values on the host while a step is traced on the meta device.

Eager code reads some values on the host (``.item()``, ``bool(t)``, ``if t.all():``):
transformers looks for packed sequences in its position ids when it keeps no KV cache (as
under activation checkpointing), an optimizer reads its ``step`` counters. Meta tensors have
no values, but these do not depend on the data: they follow from python numbers
(``torch.arange(seq)``) or are real CPU tensors. Inside `HostReads`, every small meta tensor
made only from such values keeps a CPU copy of its value, computed by the same op on the CPU,
and an op that reads values (``item``, and those tagged ``data_dependent_output``:
``_local_scalar_dense``, ``is_nonzero``, ``equal``, ...) is answered from those copies as eager answers it, leaving no
node in the graph. A value that depends on the data (the batch, the weights) has no copy, and
reading it stays the error it is on the meta device, unless ``stand_in`` is set: then
``.item()`` of such a value gives 1 (1.0, True) and is counted in ``stood_in``. That is for
code whose reads only scale what it computes, never decide what it allocates: Adafactor's
relative step size reads each parameter's norm.

>>> with HostReads():
...     positions = torch.arange(6, device="meta")
...     bool((positions.diff() == 1).all())
True
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from ..torch_compat import TorchDispatchMode, _disable_current_modes, dispatch_without_importing_dynamo, pytree

aten = torch.ops.aten
META = torch.device("meta")
HOST = torch.device("cpu")
LARGEST_COPY = 1 << 20  # elements: position ids of long sequences, never activations
_UNKNOWN = object()


class HostReads(TorchDispatchMode):
    """Host copies of the values of data-independent meta tensors, and value reads answered from them."""

    def __init__(self, stand_in: bool = False) -> None:
        super().__init__()
        dispatch_without_importing_dynamo(type(self))
        self.copies = WeakTensorKeyDictionary()
        self.stand_in = stand_in
        self.stood_in = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, spec = pytree.tree_flatten((args, kwargs))
        on_host = [self._on_host(item) for item in flat]
        known = all(item is not _UNKNOWN for item in on_host)
        reads = torch.Tag.data_dependent_output in func.tags or func is aten.item.default
        if known and reads:
            host_args, host_kwargs = pytree.tree_unflatten(on_host, spec)
            with _disable_current_modes():
                return func(*host_args, **host_kwargs)
        if self.stand_in and func in (aten.item.default, aten._local_scalar_dense.default):
            self.stood_in += 1
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point or dtype.is_complex else 1
        out = func(*args, **kwargs)
        outputs = [tensor for tensor in pytree.tree_leaves(out) if isinstance(tensor, torch.Tensor)]
        on_meta = [tensor for tensor in outputs if tensor.device == META]
        if not on_meta:
            return out
        if not known or torch.Tag.nondeterministic_seeded in func.tags or any(
                tensor.numel() > LARGEST_COPY for tensor in on_meta):
            for tensor in on_meta:  # an in-place op of unknown values makes its target unknown
                self.copies.pop(tensor, None)
            return out
        host_args, host_kwargs = pytree.tree_unflatten(on_host, spec)
        with _disable_current_modes():
            host_out = func(*host_args, **host_kwargs)
        for tensor, copy in zip(pytree.tree_leaves(out), pytree.tree_leaves(host_out)):
            if isinstance(tensor, torch.Tensor) and tensor.device == META and isinstance(copy, torch.Tensor):
                self.copies[tensor] = copy
        return out

    def _on_host(self, item: Any) -> Any:
        """A meta tensor's host copy (or `_UNKNOWN`), a meta device as the CPU; others as they are."""
        if isinstance(item, torch.Tensor):
            return self.copies.get(item, _UNKNOWN) if item.device == META else item
        if isinstance(item, torch.device) and item == META:
            return HOST
        return item
