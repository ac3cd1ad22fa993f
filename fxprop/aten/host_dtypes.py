"""Which dtypes the CPU's elementwise kernels implement.

Meta kernels compute a result type for any dtype, but a CPU kernel is compiled for a list of
dtypes only: ``abs`` of a bool tensor, ``gelu`` of an int tensor and ``bitwise_and`` of floats
raise "not implemented for 'Bool'" (or refuse outright, as ``relu`` of bools does). torch keeps
no table of these lists, so the host's own kernel is asked: the op runs once on small stand-ins
of the same dtypes and ranks, each dim of size 0, 1 or 2 as the input's is 0, 1 or larger (a
dim of 0 kept, since some CPU kernels return before they dispatch on dtype there; 2 rather
than 1, since one-element operands take the kernels' scalar paths, whose lists differ), with
the same python arguments, and its refusal is the node's. The answer depends only on the op
and those types and sizes, so it is kept for the process.

Elementwise ops (tagged ``pointwise``, or the in-place form of one), which accept any
broadcastable sizes, and the reductions that check their dtype first (max, amax, std, ...) are
asked on stand-ins: these stand for any input of theirs. Any other op given a dtype that few
kernels implement (complex, float8, the wide unsigned ints), integer tensors narrower than
int64 (an index, a target or a sorter that the kernel reads as int64: ``put``, ``nll_loss``,
``searchsorted``; or data a pooling or sampling kernel has no code for: ``grid_sample`` of
uint8), integer or bool tensors that its meta kernel keeps in its result (``softmax`` of
ints), or out= tensors of a floating dtype the inputs do not have (``index_select`` of float32
into float64, which TensorIterator's kernels cast and others refuse), is asked on stand-ins of
its own sizes, up to a limit. int64 and bool tensors alone are
not: they are the common indices and masks, and every embedding would pay a host call. Views are
never asked, nor random ops, which would draw from the global generator. Nodes on other devices
are not asked: their kernels have other lists.

Integer stand-ins are zeros, in range of any dim, so a refusal is the node's only where it cannot
be the values': a NotImplementedError (a kernel missing for the dtype), a message about dtypes,
or a refusal that goes away once the narrow integer tensors are int64 zeros instead, or the
out= tensors are of the inputs' dtype (only dtypes changed). A uint8 tensor among a list of indices is a mask, not an index, and is never made
int64: its zeros select nothing where int64 zeros select one element each.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..engine import session as context
from .host_answers import HostAnswers
from .. import symbolic
from ..errors import PropagationError
from ..call import tensors_in, tensors_of
from .in_place import is_elementwise, written_arguments
from ..torch_compat import OpOverload, pytree, schema_of

_answers = HostAnswers(limit=8192)


# Reductions whose CPU kernels dispatch on dtype before anything else; they take the stand-ins
# as they take any input of the same rank.
_REDUCTIONS = frozenset({"max", "min", "amax", "amin", "aminmax", "argmax", "argmin", "std", "var", "std_mean",
                         "var_mean"})


# Integer dtypes other than int64, the one dtype of indices.
_NARROW_INTEGERS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32})


# dtypes that many CPU kernels are not compiled for: any op given one is asked on its own sizes.
_RARELY_IMPLEMENTED = frozenset({torch.complex32, torch.complex64, torch.complex128, torch.uint16, torch.uint32,
                                 torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                 torch.float8_e5m2fnuz, torch.float8_e8m0fnu})


def check_cpu_kernel_dtypes(op: OpOverload, args: tuple, kwargs: dict, result: Any = None) -> None:
    """Raise as the CPU kernel would when it has no implementation for these dtypes (``result``:
    what the meta kernel made of the call; the host is not asked for outputs over the limit)."""
    if is_elementwise(op) or (op.namespace == "aten" and op.__name__.split(".")[0] in _REDUCTIONS):
        _check(op, args, kwargs)
    elif op.namespace == "aten" and _asked_on_its_own_sizes(op, args, kwargs, result):
        if not _too_big_to_ask(args, kwargs, result):
            _check(op, args, kwargs, full_size=True)


def _asked_on_its_own_sizes(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> bool:
    """A dtype that few kernels implement; integer tensors narrower than int64, which the kernels
    that read indices refuse (``put``'s index, ``nll_loss``'s target, ``searchsorted``'s sorter)
    and few others implement (``grid_sample`` of uint8); either as the ``dtype=`` the op computes
    in (``nansum`` into complex64); or, in softmax or batch_norm of ints, integers the meta kernel
    keeps in its result, which the CPU kernel has no code for."""
    dtypes = {tensor.dtype for tensor in tensors_in(args, kwargs)}
    if isinstance(kwargs.get("dtype"), torch.dtype):
        dtypes.add(kwargs["dtype"])
    if not dtypes.isdisjoint(_RARELY_IMPLEMENTED):
        return True
    return not op.is_view and (not dtypes.isdisjoint(_NARROW_INTEGERS) or _integral_in_and_out(args, kwargs, result)
                               or (schema_of(op).is_mutable and bool(_outs_of_another_dtype(op, args, kwargs))))


def _outs_of_another_dtype(op: OpOverload, args: tuple, kwargs: dict) -> dict[int, torch.dtype]:
    """The out= tensors (by their position among the call's leaves) of a floating or complex dtype
    that is neither an input's nor the complex counterpart of one, each with the dtype the inputs
    suggest (``sort`` of float32 into a float64 ``values=``: float32; ``complex`` of float32 into
    complex128: complex64). Many kernels that are not TensorIterator's refuse to cast into their
    out= tensors (``index_select``, ``tril``, ``softmax``)."""
    outs = {id(t) for t in written_arguments(op, args, kwargs)}
    if torch.Tag.inplace in op.tags and args:
        outs.discard(id(args[0]))
    if not outs:
        return {}
    flat = pytree.tree_leaves((args, kwargs))
    inputs = [v.dtype for v in flat if isinstance(v, torch.Tensor) and id(v) not in outs]
    suggested = {"floating": next((d for d in inputs if d.is_floating_point), None),
                 "complex": next((d for d in inputs if d.is_complex), None)
                 or _COMPLEX_OF.get(next((d for d in inputs if d.is_floating_point), None))}
    retyped = {}
    for position, value in enumerate(flat):
        if not isinstance(value, torch.Tensor) or id(value) not in outs:
            continue
        dtype = suggested["complex" if value.dtype.is_complex else "floating"]
        if (value.dtype.is_floating_point or value.dtype.is_complex) and dtype is not None and value.dtype not in (
                *inputs, *(_COMPLEX_OF.get(d) for d in inputs)):
            retyped[position] = dtype
    return retyped


_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _integral_in_and_out(args: tuple, kwargs: dict, result: Any) -> bool:
    def integral(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex)
    return any(integral(v) for v in tensors_of(result)) and any(integral(v) for v in tensors_in(args, kwargs))


def refusal_type_on_the_host(op: OpOverload, args: tuple, kwargs: dict, refusal: BaseException) -> None:
    """Where a meta kernel or decomposition refuses a CPU call, raise instead as the CPU kernel
    refuses it, on stand-ins of the same sizes and dtypes (``layer_norm`` of ints: the
    decomposition's RuntimeError, the kernel's NotImplementedError; ``avg_pool2d`` of a 0-dim
    uint8 tensor: the meta kernel's dtype check, the kernel's IndexError for the dims). The
    call is refused for its sizes or dtypes, which the kernel checks before any value, so the
    stand-ins' values do not decide the kernel's refusal. Asked only once the call is refused."""
    if op.namespace != "aten" or _too_big_to_ask(args, kwargs, None) or _masks_among_indices(args, kwargs):
        return
    try:
        _check(op, args, kwargs, full_size=True, any_refusal=True)
    except PropagationError as host_refusal:
        if host_refusal.error_type is not type(refusal):
            raise host_refusal from refusal


def _masks_among_indices(args: tuple, kwargs: dict) -> bool:
    """Whether a bool or uint8 tensor sits in a list of indices (``index_put``'s): a mask selects as
    many elements as its values say, so a refusal of stand-ins could be their values'."""
    return any(isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) and item.dtype in _MASKS
                                                        for item in value)
               for value in (*args, *kwargs.values()))


_MASKS = (torch.bool, torch.uint8)
_FULL_SIZE_LIMIT = 1 << 16  # elements in all: a refused call is asked on stand-ins of its own sizes up to this


def _too_big_to_ask(args: tuple, kwargs: dict, result: Any) -> bool:
    """Whether asking the host on the call's own sizes could allocate past the limit: outputs the
    meta kernel sized, or sizes given as numbers (a factory's), over it."""
    leaves = pytree.tree_leaves((args, kwargs, result))
    if any(isinstance(v, torch.Tensor) and not symbolic.has_symbolic([v]) and v.numel() > _FULL_SIZE_LIMIT
           for v in leaves):
        return True
    sizes = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, int) and not isinstance(v, bool)]
    return math.prod(s for s in sizes if s > 0) > _FULL_SIZE_LIMIT


def _check(op: OpOverload, args: tuple, kwargs: dict, full_size: bool = False, any_refusal: bool = False) -> None:
    device = context.node_device()
    if (device is not None and device.type != "cpu") or torch.Tag.nondeterministic_seeded in op.tags:
        return  # a random op would draw from the global generator
    flat, structure = _flattened(args, kwargs)
    tensors = [value for value in flat if isinstance(value, torch.Tensor)]
    if not tensors or symbolic.has_symbolic(flat):
        return
    if full_size and sum(t.numel() for t in tensors) > _FULL_SIZE_LIMIT:
        return
    if full_size:
        shape_of = lambda t: tuple(t.shape)  # noqa: E731
    else:  # an out= argument is empty: resized to the result without the warning a full one gets
        written = set()
        if "out" in kwargs:  # one that is also an input (``out=x``) stands in full, as the input it is
            read = {id(t) for t in tensors_in(args, {key: value for key, value in kwargs.items() if key != "out"})}
            written = {id(t) for t in written_arguments(op, args, kwargs)} - read
        shape_of = lambda t: (0,) if id(t) in written else _stand_in_shape(t)  # noqa: E731
    try:
        key = (op, structure, any_refusal, tuple(shape_of(v) + (v.dtype,) if isinstance(v, torch.Tensor)
                                                 else (type(v), v) for v in flat))
        hash(key)
    except TypeError:
        return
    refusal = _answers.get(key, lambda: _ask_the_host(op, flat, pytree.tree_structure((args, kwargs)), shape_of,
                                                      any_refusal))
    if refusal is not None:
        error_type, message = refusal
        raise PropagationError(message, error_type=error_type)


class _NotPlain(Exception):
    """A container or value that `_plain_structure` leaves to pytree."""


# Leaves pytree never flattens further; anything else (named tuples, OrderedDicts, fx's immutable
# lists, tensor subclasses) is flattened by pytree itself.
_PLAIN_LEAVES = frozenset({torch.Tensor, int, float, bool, complex, str, type(None), torch.dtype, torch.device,
                           torch.memory_format, torch.layout})


def _flattened(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """The call's leaves in pytree's order, and a structure that tells apart what pytree's spec
    does. A call's arguments are almost always plain tuples, lists and dicts, whose structure is
    a tuple that hashes and compares in C: a TreeSpec hashes and compares in python."""
    flat: list = []
    try:
        return flat, _plain_structure((args, kwargs), flat)
    except _NotPlain:
        return pytree.tree_flatten((args, kwargs))


def _plain_structure(value: Any, flat: list) -> Any:
    kind = type(value)
    if kind is tuple or kind is list:
        return kind, tuple([_plain_structure(item, flat) for item in value])
    if kind is dict:  # pytree flattens a dict's values in insertion order
        return dict, tuple(value), tuple([_plain_structure(item, flat) for item in value.values()])
    if kind not in _PLAIN_LEAVES:
        raise _NotPlain
    flat.append(value)
    return None


def _ask_the_host(op: OpOverload, flat: list, spec: Any, shape_of: Any, any_refusal: bool) -> tuple[type, str] | None:
    with context.on_host(), torch.no_grad():
        error = _refusal_of_stand_ins(op, flat, spec, shape_of)
        # only a refusal of the dtypes is the node's; the stand-ins' values may be refused
        if error is not None and (isinstance(error, NotImplementedError) or (
                isinstance(error, (RuntimeError, TypeError)) and _about_dtypes(str(error))) or (
                any_refusal and isinstance(error, (RuntimeError, IndexError, ValueError, TypeError))) or (
                isinstance(error, (RuntimeError, IndexError, ValueError, TypeError))
                and (_passes_as_int64(op, flat, spec, shape_of) or _passes_with_outs_retyped(op, flat, spec, shape_of)))):
            return type(error), str(error).split("\n")[0]
    return None


def _refusal_of_stand_ins(op: OpOverload, flat: list, spec: Any, shape_of: Any,
                          retyped: dict | None = None) -> Exception | None:
    """What the host's kernel raises for the call on stand-ins (the leaves at the positions in
    ``retyped`` of the dtypes there), or None where it accepts it or the host cannot even make the stand-ins."""
    def stand_in(position: int, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        dtype = retyped.get(position, value.dtype) if retyped else value.dtype
        if not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool:
            return torch.zeros(shape_of(value), dtype=dtype, device="cpu")  # an index in range of any dim
        return torch.ones(shape_of(value), dtype=dtype, device="cpu")

    try:
        args, kwargs = pytree.tree_unflatten([stand_in(i, value) for i, value in enumerate(flat)], spec)
    except (NotImplementedError, RuntimeError):
        return None  # a dtype the host cannot even fill (float4, bits): nothing to ask
    try:
        op(*args, **kwargs)
    except Exception as error:
        return error
    return None


def _passes_as_int64(op: OpOverload, flat: list, spec: Any, shape_of: Any) -> bool:
    """Whether the refused call passes once its narrow integer tensors are int64, the same zeros:
    then their dtype is what the kernel refused (an index, a target or a sorter must be Long), not a value.
    A uint8 tensor in a list of indices is a mask, whose zeros select nothing where int64 zeros
    select an element each: widened, its refusal would be the stand-ins' values'."""
    paths = [path for path, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(flat, spec))[0]]
    widened = {i: torch.int64 for i, value in enumerate(flat) if isinstance(value, torch.Tensor)
               and value.dtype in _NARROW_INTEGERS and not (value.dtype is torch.uint8 and len(paths[i]) > 2)}
    return bool(widened) and _refusal_of_stand_ins(op, flat, spec, shape_of, retyped=widened) is None


def _passes_with_outs_retyped(op: OpOverload, flat: list, spec: Any, shape_of: Any) -> bool:
    """Whether the refused call passes once its out= tensors have their inputs' dtype: then the
    kernel refused to write into that dtype (``index_select`` of float32 into float64)."""
    args, kwargs = pytree.tree_unflatten(flat, spec)
    retyped = _outs_of_another_dtype(op, args, kwargs) if schema_of(op).is_mutable else {}
    return bool(retyped) and _refusal_of_stand_ins(op, flat, spec, shape_of, retyped=retyped) is None


def _stand_in_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """Up to two elements per dim: a tensor of one element would take the kernels' scalar paths,
    whose dtype lists are other (float8's mul), where the input is not one element."""
    return tuple(min(size, 2) for size in tensor.shape)


def _about_dtypes(message: str) -> bool:
    """A refusal for the dtypes themselves, not for the stand-ins' sizes or values
    (a NotImplementedError always is: a kernel missing for these types)."""
    return any(phrase in message for phrase in ("not implemented for", "not yet implemented for", "not supported for",
                                                "inputs not supported", "only support", "does not support",
                                                "is not supported", "without overflow", "Found dtype",
                                                "can't be cast to the desired output type", "Expected the dtype",
                                                "supports bool tensor for result"))
