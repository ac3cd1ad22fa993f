"""The CPU kernels of CompositeImplicitAutograd ops, which fxprop's dispatch never sees.

Such an op decomposes above any dispatch mode, so fxprop's dispatch sees its parts and asks the
host about those only. On a CPU tensor that needs no grad, some of these ops run a kernel of their
own instead of their parts: ``max_pool1d`` runs ``max_pool1d_impl``, compiled for floating types
only, where its parts (``max_pool2d_with_indices``) take integers too. So a node that reaches
such an op on the CPU with a dtype other than the common floating ones asks the host's kernel of
the op itself, on stand-ins, as for any op the dispatch sees (`fxprop.aten.host_dtypes`). A node
whose own target is the op asks it directly; torch-level callables (``F.max_pool1d``, a module)
are mapped to the op by name, through a TorchFunctionMode entered only for such nodes.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..aten.host_dtypes import check_cpu_kernel_dtypes
from .blame import boundary
from ..call import Call
from ..torch_compat import OpOverload, OpOverloadPacket, is_composite_implicit, overload_for_call, schema_of

aten = torch.ops.aten
_COMMON_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


def may_run_a_kernel_of_its_own(call: Call, device: torch.device | None) -> bool:
    """Whether a composite call on ``device`` may reach a CompositeImplicitAutograd op whose CPU
    kernel implements fewer dtypes than its parts: tensors of other dtypes than the common
    floating ones, on the CPU, none of them needing grad (with grad, the op runs its parts)."""
    return (device is not None and device.type == "cpu"
            and any(t.dtype not in _COMMON_FLOATS for t in call.tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in call.tensors)))


def call_composite(target: Any, args: tuple, kwargs: dict, device: torch.device | None) -> Any:
    """``target(*args, **kwargs)`` (a method name: ``args[0]``'s method), a composite called on
    ``device`` (a node's own call, or one a rule hands back to torch), the CPU kernels it may reach
    asked where `may_run_a_kernel_of_its_own`."""
    if not may_run_a_kernel_of_its_own(Call(target, args, kwargs), device):
        return _called(target, args, kwargs)
    if isinstance(target, OpOverload):
        value = _called(target, args, kwargs)
        check_composite_kernel(target, args, kwargs, value)
        return value
    with composite_kernels_asked():
        return _called(target, args, kwargs)


@boundary
def _called(target: Any, args: tuple, kwargs: dict) -> Any:
    if isinstance(target, str):
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


def check_composite_kernel(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> None:
    """Refuse as the CPU kernel of ``op``, a CompositeImplicitAutograd op, refuses these dtypes."""
    if op.namespace == "aten" and is_composite_implicit(op):
        check_cpu_kernel_dtypes(op, args, kwargs, result)


@contextlib.contextmanager
def composite_kernels_asked():
    """While a composite runs: each torch call it makes that binds to a CompositeImplicitAutograd
    op is asked (a TorchFunctionMode sees the outermost torch call of each of the composite's own
    statements, ``F.max_pool1d`` in a module's ``forward``, not the calls nested inside it)."""
    with _AskingCompositeOps():
        yield


class _AskingCompositeOps(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        packet = _composite_packet(func)
        if packet is not None:
            kwargs = _as_the_ops_keywords(packet, kwargs)
            op = overload_for_call(packet, args, kwargs)
            if op is not None:
                check_composite_kernel(op, args, kwargs, result)
        return result


def _as_the_ops_keywords(packet: OpOverloadPacket, kwargs: dict) -> dict:
    """A torch-level call's keywords as its aten op takes them: None is the op's default, and a
    switch the op does not have, left off, is no argument (``F.max_pool1d``'s ``stride=None``,
    ``return_indices=False``)."""
    names = {argument.name for overload in packet.overloads() for argument in schema_of(getattr(packet, overload)).arguments}
    return {key: value for key, value in kwargs.items()
            if value is not None and not (key not in names and value is False)}


def _composite_packet(func: Any) -> OpOverloadPacket | None:
    """The aten packet a torch callable binds to by its name (``torch.max_pool1d``,
    ``F.max_pool1d``, ``torch._C._nn.one_hot``, a Tensor method), where some overload of it is
    CompositeImplicitAutograd; else None. Whether the call's arguments fit an overload decides
    the rest (``F.nll_loss``'s reduction is a string, ``aten.nll_loss``'s a number: no overload)."""
    if not (isinstance(func, _BUILTINS) or (getattr(func, "__module__", None) or "").startswith("torch.")):
        return None  # the user's own function
    return _composite_packet_named(getattr(func, "__name__", ""))


_BUILTINS = (type(torch.max_pool1d), type(torch.Tensor.add))


@functools.lru_cache(maxsize=None)
def _composite_packet_named(name: str) -> OpOverloadPacket | None:
    packet = getattr(aten, name, None)
    if not isinstance(packet, OpOverloadPacket):
        return None
    if not any(is_composite_implicit(getattr(packet, overload)) for overload in packet.overloads()):
        return None
    return packet
