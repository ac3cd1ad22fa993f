"""Every private torch name fxprop reads or patches, in one place.

A torch upgrade is a review of this file: each name below is one torch keeps private (a
leading underscore somewhere in its path), and `tests/test_structure.py` checks that no
other fxprop module reaches one, and that the patched name is still the one torch consults.
Longer than 500 lines because of that: one file to review is the point, and each entry is a
name or a thin wrapper around one, filed by the torch subsystem it reaches into.

The patches, `device_hint`, ShapeEnv's `_evaluate_expr`, its guard log and its two memoized
evaluations (`decisions_held_apart`),
and the python kernels of `ATEN_COMPOSITE_OVER_PYTHON_KERNEL`, are installed by
`install_patches` on the first propagate, never on import.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import types
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import sympy
import torch
import torch._meta_registrations as _meta_registrations
import torch.fx.experimental.symbolic_shapes as _symbolic_shapes
import torch.nn.modules.module as _module_hooks

from . import ambient
import torch._prims_common as _prims_common
from torch._prims_common import (ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes,  # noqa: F401
                                 is_contiguous_for_memory_format_or_false)
import torch.utils._pytree as pytree  # noqa: F401  (re-exported)
import torch.utils._foreach_utils  # noqa: F401  (foreach_kernel_devices)
from torch._decomp import decomposition_table  # noqa: F401
from torch._dispatch.python import enable_python_dispatcher, no_python_dispatcher  # noqa: F401
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket  # noqa: F401
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,  # noqa: F401
                                           FakeTensor, FakeTensorMode, unset_fake_temporarily)
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode, ShapeEnv,  # noqa: F401
                                                   _constrain_range_for_size, statically_known_true)
from torch.fx.graph import _PyTreeCodeGen as PyTreeCodeGen  # noqa: F401
from torch.utils._device import DeviceContext, _device_constructors  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: F401
from torch.utils._sympy import functions as sympy_functions  # noqa: F401

check = torch._check
check_index = torch._check_index
check_not_implemented = torch._check_not_implemented
internal_overlap = torch._debug_has_internal_overlap  # 0: none, 1: some elements share memory, 2: too hard to tell
has_kernel_for_dispatch_key = torch._C._dispatch_has_kernel_for_dispatch_key


def has_kernel(op_name: str, dispatch_key: str) -> bool:
    """Whether the dispatcher holds a kernel for ``op_name`` under ``dispatch_key``; False for a
    TorchScript builtin (``aten::to.prim_Device``), which the dispatcher does not know."""
    try:
        return has_kernel_for_dispatch_key(op_name, dispatch_key)
    except RuntimeError:
        return False


def prepare_dtensor_decompositions(device_types: tuple[str, ...] = ("cpu", "cuda")) -> None:
    """DTensor builds a one-rank mesh for its decomposition path (``floor_divide`` of a sharded int
    tensor) the first time one is needed; built while fxprop computes under ``torch.device("meta")``,
    that mesh's rank table would be a meta tensor it cannot read. Build them beforehand."""
    from torch.distributed.tensor import DTensor
    strategy = getattr(DTensor._op_dispatcher.sharding_propagator, "decomp_strategy", None)
    if strategy is not None:
        for device_type in device_types:
            strategy._get_fake_mesh(device_type)


def global_module_hooks_registered() -> bool:
    """Whether hooks that run around every module call are registered (``register_module_forward_hook``
    and its siblings): a module's result then depends on more than the module and its inputs."""
    return bool(_module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks
                or _module_hooks._global_backward_hooks or _module_hooks._global_backward_pre_hooks)


@functools.lru_cache(maxsize=None)
def scalar_type_name(dtype: torch.dtype) -> str:
    """The dtype as ATen's messages name it (``Float``, ``Long``, ``ComplexFloat``), read from
    the tensor type name ATen gives a tensor of that dtype."""
    return torch.empty((), dtype=dtype, device="meta").type().removeprefix("torch.meta.").removesuffix("Tensor")


def is_composite_implicit(op: OpOverload) -> bool:
    """Whether ``op`` has a CompositeImplicitAutograd kernel: it decomposes into other ops above
    any dispatch mode, so a mode sees its parts, never the op itself."""
    return has_kernel(op.name(), "CompositeImplicitAutograd")
set_grad_enabled_op = torch._C._set_grad_enabled
set_fwd_grad_enabled_op = torch._C._set_fwd_grad_enabled
swap_tensor_impl = torch._C._swap_tensor_impl  # torch.utils.swap_tensors' own, outside the dispatcher
dual_level_ops = (torch._C._enter_dual_level, torch._C._exit_dual_level)  # forward AD's process-wide level
neg_view = torch._neg_view
DelayedError = torch._C._functions.DelayedError
make_subclass = torch.Tensor._make_subclass
set_throw_on_mutable_data_ptr = torch._C._set_throw_on_mutable_data_ptr
fused_sdp_choice = torch._fused_sdp_choice
sdp_priority_order = torch._C._get_sdp_priority_order
foreach_kernel_devices = torch.utils._foreach_utils._get_foreach_kernels_supported_devices  # optimizers' default
ConvBackend = torch._C._ConvBackend
select_conv_backend = torch._C._select_conv_backend
conv_determine_backend_memory_format = torch._C._conv_determine_backend_memory_format
VARIABLE_FUNCTIONS_MODULES = ("torch._C._VariableFunctions", "torch._C._nn")

suggest_memory_format = _prims_common.suggest_memory_format
canonicalize_dim = _prims_common.canonicalize_dim
make_contiguous_strides_for = _prims_common.make_contiguous_strides_for
make_channels_last_2d_strides_for = _prims_common.make_channels_last_2d_strides_for
make_channels_last_3d_strides_for = _prims_common.make_channels_last_3d_strides_for
is_non_overlapping_and_dense = _prims_common.is_non_overlapping_and_dense_or_false  # whether the elements fill a
# block of memory exactly once, in some order of dims; False where symbolic sizes leave it open
meta_index_tensor = _meta_registrations.meta_index_Tensor

DATA_DEPENDENT_ERRORS = (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)


def schema_of(op: OpOverload) -> Any:
    """The op's FunctionSchema (its arguments, returns, mutability)."""
    return op._schema


def overload_name(op: OpOverload) -> str:
    return op._overloadname


def packet_of(op: OpOverload) -> OpOverloadPacket:
    return op._overloadpacket


def version_counter(tensor: torch.Tensor) -> int:
    """How many times the tensor was written in place (autograd's version counter)."""
    return tensor._version


def has_symbolic_layout(tensor: torch.Tensor) -> bool:
    return any(isinstance(v, torch.SymInt) for v in (*tensor.shape, *tensor.stride(), tensor.storage_offset()))


any_autocast_enabled = torch._C._is_any_autocast_enabled
below_autograd_views = torch._C._AutoDispatchBelowADInplaceOrView  # as_strided that makes no autograd view


MIN_MAX = (sympy.Min, sympy.Max, sympy_functions.Min, sympy_functions.Max)


class _StorageOfItsOwn(torch.Tensor):
    """A wrapper tensor made only for the storage it is made with (`meta_over_storage_of`); no op
    ever runs on it."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"fxprop: {func} called on a storage holder")


def meta_over_storage_of(shape: Sequence, strides: Sequence, dtype: torch.dtype, storage_bytes: Any) -> torch.Tensor:
    """A fresh meta tensor of these sizes and strides over a storage of its own of ``storage_bytes``
    (a SymInt kept as it is): no autograd view, and no SymInt arithmetic. ``torch.empty`` of a
    symbolic size computes and checks the storage's bytes again, four SymInt operations through
    python; a wrapper tensor's storage is constructed with the expression the caller already holds
    (constructed, not resized: a storage resized to a SymInt reads its bytes as garbage in C++)."""
    if isinstance(storage_bytes, torch.SymInt) and storage_bytes.node.maybe_as_int() is not None:
        storage_bytes = storage_bytes.node.maybe_as_int()  # a size the ShapeEnv has fixed: torch's arithmetic gives an int
    holder = torch.Tensor._make_wrapper_subclass(_StorageOfItsOwn, (0,), dtype=dtype, device="meta",
                                                 storage_size=storage_bytes)
    flat = torch.empty((0,), dtype=dtype, device="meta").set_(holder.untyped_storage(), 0, (0,), (1,))
    with below_autograd_views():
        return flat.as_strided(shape, strides)


def export_guards_code(module: torch.nn.Module) -> Any:
    """The code of the input guards torch.export's ``.module()`` calls first (its ``_guards_fn``:
    asserts on the inputs' sizes, generated from the program's range constraints), or None
    for any other module."""
    unlift = sys.modules.get("torch.export._unlift")  # not imported: no such module exists (and dynamo stays unimported)
    forward = module.__dict__.get("forward") if unlift is not None and type(module) is unlift.GuardsFn else None
    return inspect.unwrap(forward).__code__ if forward is not None else None


def storage_key(tensor: torch.Tensor) -> int:
    """A key that two views share exactly when they share a storage."""
    return tensor.untyped_storage()._cdata


def own_state(module: torch.nn.Module) -> tuple[dict, dict, dict]:
    """A module's own parameters, buffers and submodules by name, None entries (a bias=False) included."""
    return module._parameters, module._buffers, module._modules


def size_expression(size: Any) -> Any:
    """``size.node.expr``: a SymInt's (SymFloat's, SymBool's) expression after the ShapeEnv's
    replacements, without the property's walk of the whole expression (``is_number``) on every
    read: the node's own memo of it is read directly while it is current."""
    node = size.node
    env = node.shape_env
    if env is not None:
        version = env._replacements_version_counter
        if version == 0:
            return node._expr
        if node._expr_cache is not None and node._expr_ver == version:
            return node._expr_cache
    return node.expr


def has_symbolic_sizes(tensor: torch.Tensor) -> bool:
    """Whether any of the tensor's sizes, strides or offset is symbolic (one flag read, no scan)."""
    return tensor._has_symbolic_sizes_strides


def is_view(tensor: torch.Tensor) -> bool:
    return tensor._is_view()


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    return tensor._base


def creation_meta(view: torch.Tensor) -> Any:
    """How autograd made ``view``: ``DEFAULT``, or a way it restricts the view in place later (one of
    several outputs, as ``unbind``'s are, or one made under no_grad or inference mode); None for a
    tensor autograd does not call a view (an inference tensor's views have no autograd metadata)."""
    return torch._C._autograd._get_creation_meta(view) if view._is_view() else None


def autograd_restricts_in_place(view: torch.Tensor) -> bool:
    """Whether autograd refuses in-place use of ``view`` or of its base later, which a view made
    afresh of the same base may not. Whether either requires grad does not matter: an in-place op
    with an operand that does (``a.mul_(w)``) is refused all the same."""
    return creation_meta(view) not in (torch._C._autograd.CreationMeta.DEFAULT, None)


def function_mode_stack() -> list:
    """The TorchFunctionModes in effect (``with torch.device(...)`` is one)."""
    from torch.overrides import _get_current_function_mode_stack
    return _get_current_function_mode_stack()


def global_device_context() -> Any:
    """The mode `torch.set_default_device` installed, or None."""
    return getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)


def custom_op_without_fake(op: OpOverload) -> bool:
    """A `torch.library.custom_op` whose Meta kernel only raises "no fake impl registered"."""
    from torch._library import custom_ops, utils
    definition = custom_ops.OPDEFS.get(op._schema.name)
    return (definition is not None and definition._abstract_fn is None
            and not utils.can_generate_trivial_fake_impl(op))


def registered_fake(op: OpOverload) -> bool:
    """Whether ``op`` is a custom op with a fake (meta) implementation registered in python."""
    from torch._library import custom_ops, simple_registry
    definition = custom_ops.OPDEFS.get(op._schema.name)
    if definition is not None:
        return definition._abstract_fn is not None
    return simple_registry.singleton.find(op._schema.name).fake_impl.kernel is not None


@functools.lru_cache(maxsize=None)
def meta_kernel_takes_no_outs(op: OpOverload) -> bool:
    """Whether ``op``'s Meta kernel is a python function, registered for every overload of its
    packet, that has no parameter for the op's out= arguments (``embedding_dense_backward.out``):
    it refuses every call with a TypeError that real execution never raises. Such an op's out=
    kernel is CompositeExplicitAutograd (computes, then copies), and runs instead."""
    import inspect
    kernel = op.py_kernels.get(torch._C.DispatchKey.Meta)
    outs = [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    if kernel is None or not outs:
        return False
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return False
    return not all(name in parameters for name in outs)


# --- the device hint: meta kernels that lay results out per backend --------------------

_torch_device_hint = _meta_registrations.device_hint
_installed = False
_install_lock = threading.Lock()


def _device_hint(tensor) -> str:
    """torch's meta kernels choose some layouts by asking the device of a tensor, which is "cuda"
    for every plain meta tensor; while fxprop propagates a node, the node's logical device answers."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta" and not isinstance(tensor, FakeTensor):
        device = ambient.node_device()
        if device is not None and device.type != "meta":
            return device.type
    return _torch_device_hint(tensor)


# --- size relations torch's static evaluation leaves open ------------------------------

_torch_evaluate_expr = ShapeEnv._evaluate_expr


def _evaluate_expr(shape_env: ShapeEnv, orig_expr: Any, *args: Any, **kwargs: Any) -> Any:
    """torch's ``ShapeEnv._evaluate_expr``. Where it would refuse a relation on unbacked sizes that
    it cannot decide from ranges and matching, the symbolic session of the propagation in progress
    decides it if its truth is the same for every value of the sizes (`SymbolicSession.decide`);
    otherwise torch's refusal stands."""
    try:
        return _torch_evaluate_expr(shape_env, orig_expr, *args, **kwargs)
    except GuardOnDataDependentSymNode:
        session = ambient.symbols()
        if session is None or session.env is not shape_env or not isinstance(orig_expr, sympy.logic.boolalg.Boolean):
            raise
        decided = session.decide(orig_expr)
        if decided is None:
            raise
        return sympy.true if decided else sympy.false


def _runtime_assert_refuted_by_the_run(assert_or_defer: Callable) -> Callable:
    """torch's ``ShapeEnv.guard_or_defer_runtime_assert``, which returns False for a fact its static
    evaluation refutes (``torch._check`` then raises, fxprop's broadcasting names the contradiction);
    the symbolic session of the propagation in progress in that ShapeEnv also refutes a fact that no
    integer sizes satisfying what the run holds can meet (`SymbolicSession.refutes`), which torch
    would defer: ``x.view(-1, 2)`` then ``x[1:].view(-1, 2)`` of ``(B,)`` need B even, then B odd."""
    @functools.wraps(assert_or_defer)
    def method(self: ShapeEnv, orig_expr: Any, msg: str, fx_node: Any = None) -> Any:
        session = ambient.symbols()
        if (session is not None and session.env is self and isinstance(orig_expr, sympy.logic.boolalg.Boolean)
                and self._maybe_evaluate_static(orig_expr) is None and session.refutes(orig_expr)):
            return False
        return assert_or_defer(self, orig_expr, msg, fx_node)
    return method


# --- ATen's own composite where torch's python kernel lays results out otherwise ----------

DispatchKey = torch._C.DispatchKey


def _dropout_returns_its_input(input: Any, p: float, train: bool | None) -> bool:
    return not train or p == 0 or (isinstance(input, torch.Tensor)
                                   and any(type(size) is int and size == 0 for size in input.shape))


ATEN_COMPOSITE_OVER_PYTHON_KERNEL = {
    torch.ops.aten.dropout.default: (
        "with train=False or p=0 ATen's composite returns the input itself, torch's python kernel a clone "
        "(an expanded or sliced input loses its strides). In training it asks whether the input is empty "
        "(then it returns the input, whose strides address nothing): a size that is 0 makes it so on sight; "
        "one that may be 0 would be refused, where torch's python kernel (native_dropout) lays the result "
        "out as ATen's does otherwise",
        _dropout_returns_its_input),
}
"""CompositeImplicitAutograd ops whose python kernel (``py_impl``, which torch's python dispatcher
runs, and fxprop enables that dispatcher while sizes are symbolic) gives results other than
ATen's C++ composite, which real execution and propagations without symbols run: while fxprop
propagates, they run ATen's composite, with symbolic sizes too, for the calls the predicate
names (the reason, then the predicate of the call's arguments). Outside a propagation torch's
python kernel runs as before."""

PYTHON_KERNEL_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)


def _aten_composite_while_propagating(op: OpOverload, python_kernel: Callable, when: Callable) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if ambient.session() is None or not when(*args, **kwargs):
            return python_kernel(*args, **kwargs)
        return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
    return kernel


def _run_aten_composites() -> None:
    for op, (_, when) in ATEN_COMPOSITE_OVER_PYTHON_KERNEL.items():
        for key in PYTHON_KERNEL_KEYS:
            python_kernel = op.py_kernels.get(key)
            if python_kernel is not None:
                op.py_kernels[key] = _aten_composite_while_propagating(op, python_kernel, when)
        op._dispatch_cache.clear()


def install_patches() -> None:
    """Install the device hint, the evaluation of open size relations and of runtime asserts the run
    refutes, the guard log's tap and the bypass of torch's memoized evaluations
    (`decisions_held_apart`), and ATen's composites over torch's python kernels once per process
    (each reads the call in progress from `fxprop.ambient` or this thread)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            _meta_registrations.device_hint = _device_hint
            ShapeEnv._evaluate_expr = _evaluate_expr
            ShapeEnv._log_guard = _log_guard_held_apart
            ShapeEnv._inner_evaluate_expr = _uncached_while_held_apart(_torch_inner_evaluate_expr)
            ShapeEnv.guard_or_defer_runtime_assert = _runtime_assert_refuted_by_the_run(
                _uncached_while_held_apart(_torch_guard_or_defer_runtime_assert))
            _run_aten_composites()
            _python_kernels_without_importing_dynamo()
            _installed = True


def patched_names() -> dict[str, tuple[Any, str]]:
    """Each patched torch name: the module or class holding it and the attribute name (for the
    compat test; the python kernels of `ATEN_COMPOSITE_OVER_PYTHON_KERNEL` are checked on their own)."""
    return {"torch._meta_registrations.device_hint": (_meta_registrations, "device_hint"),
            "torch.fx.experimental.symbolic_shapes.ShapeEnv._evaluate_expr": (ShapeEnv, "_evaluate_expr"),
            "torch.fx.experimental.symbolic_shapes.ShapeEnv._log_guard": (ShapeEnv, "_log_guard"),
            "torch.fx.experimental.symbolic_shapes.ShapeEnv._inner_evaluate_expr": (ShapeEnv, "_inner_evaluate_expr"),
            "torch.fx.experimental.symbolic_shapes.ShapeEnv.guard_or_defer_runtime_assert":
                (ShapeEnv, "guard_or_defer_runtime_assert")}


# --- decisions in a caller's ShapeEnv -----------------------------------------------------

_torch_log_guard = ShapeEnv._log_guard
_torch_inner_evaluate_expr = ShapeEnv._inner_evaluate_expr
_torch_guard_or_defer_runtime_assert = ShapeEnv.guard_or_defer_runtime_assert
_holding = threading.local()


def _uncached_while_held_apart(cached: Any) -> Callable:
    """A ShapeEnv method torch memoizes per ShapeEnv and expression (``lru_cache``), computed afresh
    while this thread holds decisions apart from that ShapeEnv: a remembered answer skips the guard
    log, so a decision taken before (by an earlier propagation, or by torch under suppress_guards)
    would go unlisted in this run's assumptions, and an answer this run gives (a decision on what it
    holds apart, a runtime assert it did not install) must not be remembered for torch's later calls."""
    uncached = cached.__wrapped__

    @functools.wraps(uncached)
    def method(self: ShapeEnv, *args: Any, **kwargs: Any) -> Any:
        held = getattr(_holding, "apart", None)
        if held is not None and held[0] is self:
            return uncached(self, *args, **kwargs)
        return cached(self, *args, **kwargs)
    return method


def _log_guard_held_apart(self, prefix: str, guard: Any, forcing_spec: bool) -> None:
    held = getattr(_holding, "apart", None)
    if held is not None and held[0] is self and prefix.endswith("[guard suppressed]"):
        if prefix.startswith("runtime_assert") and _symbolic_shapes.free_unbacked_symbols(guard):
            with _guards_installed():
                self.guard_or_defer_runtime_assert(guard, "fxprop: a fact about a data-dependent value")
        else:
            held[1].append(guard)
    _torch_log_guard(self, prefix, guard, forcing_spec)


@contextlib.contextmanager
def _guards_installed():
    outer = ShapeEnv._suppress_guards_tls()
    _symbolic_shapes.TLS.suppress_guards = False
    try:
        yield
    finally:
        _symbolic_shapes.TLS.suppress_guards = outer


@contextlib.contextmanager
def decisions_held_apart(shape_env: ShapeEnv, decided: list):
    """Decide size conditions in ``shape_env`` (dynamo's, torch.export's) without installing a guard
    or a replacement on its sizes: each such decision this thread takes there is appended to
    ``decided`` instead (the guard it would have been). Decisions still follow the sizes' hints,
    as the guards would have. A fact about a data-dependent size (``torch._check(u0 >= 0)`` after
    ``.item()``) is no guard: it is asserted at run time, as the program asserts it, and later
    decisions build on it."""
    install_patches()
    outer = getattr(_holding, "apart", None)
    _holding.apart = (shape_env, decided)
    try:
        with shape_env.suppress_guards():
            yield
    finally:
        _holding.apart = outer


@contextlib.contextmanager
def decisions_installed():
    """Decide size conditions in fxprop's own ShapeEnv as guards, which later decisions build on
    and a contradiction is found against, even where this thread suppresses guards: torch's
    suppression is per thread, not per ShapeEnv, and a propagation nested in one that holds its
    decisions apart from a caller's ShapeEnv (a rule that propagates a graph of its own) would
    otherwise neither record nor list what it assumed."""
    outer = getattr(_holding, "apart", None)
    _holding.apart = None
    try:
        with _guards_installed():
            yield
    finally:
        _holding.apart = outer


def call_kernel(op: OpOverload, key: str, *args, **kwargs) -> Any:
    """Call ``op``'s kernel for dispatch key ``key`` (a `DispatchKey` name) directly."""
    return op._op_dk(getattr(DispatchKey, key), *args, **kwargs)


def overload_for_call(packet: OpOverloadPacket, args: tuple, kwargs: dict) -> OpOverload | None:
    """The overload of ``packet`` that torch's argument matching picks for this call, or None."""
    try:
        name = torch._C._jit_resolve_packet(packet._qualified_op_name, *args, **kwargs)
    except RuntimeError:
        return None
    return getattr(packet, name)


def is_unbacked_symbol(symbol: Any) -> bool:
    """Whether ``symbol`` is a data-dependent size (``u0``) rather than an input's (``s0``)."""
    return bool(_symbolic_shapes.free_unbacked_symbols(symbol))


def evaluate_statically(shape_env: ShapeEnv, expr: Any) -> Any:
    """What ``shape_env`` can decide about ``expr`` from its ranges alone, or None."""
    return shape_env._maybe_evaluate_static(expr)


def shape_env_version(shape_env: ShapeEnv) -> int:
    """A count that moves whenever ``shape_env`` learns something a static evaluation could read
    (the one its own memo of `evaluate_statically` is keyed by)."""
    return shape_env._version_counter


def constrain_size(shape_env: ShapeEnv, expr: Any, lower: int) -> None:
    """Mark the unbacked symbol ``expr`` as a size that is at least ``lower``."""
    shape_env._constrain_range_for_size(expr, min=lower)


def pytree_codegen(gm: torch.fx.GraphModule) -> Any:
    """The graph's pytree code generator (flattening inputs, rebuilding outputs), or None."""
    codegen = gm.graph._codegen
    return codegen if isinstance(codegen, PyTreeCodeGen) else None


def is_erased(node: torch.fx.Node) -> bool:
    """Whether ``Graph.erase_node`` removed the node (a pass may leave users pointing at it)."""
    return node._erased


def reset_dynamo() -> None:
    """Forget every compiled frame, so that the next torch.compile calls its backend afresh."""
    import torch._dynamo
    torch._dynamo.reset()


def import_dynamo() -> None:
    """Import torch._dynamo now: FakeTensorMode imports it lazily, which takes seconds."""
    import torch._dynamo  # noqa: F401


def _dynamo_imported() -> bool:
    return "torch._dynamo" in sys.modules


def container_fake_mode() -> FakeTensorMode:
    """A FakeTensorMode to hold the FakeTensors fxprop writes into ``node.meta["val"]``: one per
    thread, as long as the settings its constructor reads stay the same.

    FakeTensorMode's constructor imports torch._dynamo to read two settings, which costs a
    process that has not imported it yet ~0.4 s and ~45 MB. Until it is imported, the mode is
    built as the constructor builds it, those settings read from the environment as
    torch._dynamo.config reads them (`tests/test_structure.py` checks the two agree).
    """
    settings = _container_mode_settings()
    kept = getattr(_container_modes, "kept", None)
    if kept is not None and kept[0] == settings:
        return kept[1]
    mode = FakeTensorMode(allow_non_fake_inputs=True) if settings[0] else fake_mode_without_dynamo()
    _container_modes.kept = (settings, mode)
    return mode


_container_modes = threading.local()  # one per thread and settings: building one costs ~70 µs (it records its stack)


def _container_mode_settings() -> tuple:
    """What FakeTensorMode's constructor reads (torch._functorch.config, torch._dynamo.config)."""
    import os
    import torch._functorch.config as functorch_config
    imported = _dynamo_imported()
    dynamo = (torch._dynamo.config.fake_tensor_cache_enabled, torch._dynamo.config.fake_tensor_cache_crosscheck_enabled) \
        if imported else (os.environ.get("TORCH_FAKE_TENSOR_DISPATCH_CACHE", "1"),
                          os.environ.get("TORCH_FAKE_TENSOR_DISPATCH_CACHE_CROSSCHECK", "0"))
    return (imported, functorch_config.fake_tensor_propagate_real_tensors,
            functorch_config.fake_tensor_allow_unsafe_data_ptr_access, functorch_config.fake_tensor_allow_meta, *dynamo)


def fake_mode_without_dynamo() -> FakeTensorMode:
    """``FakeTensorMode(allow_non_fake_inputs=True)``, built without importing torch._dynamo."""
    import os
    import traceback
    import torch._functorch.config as functorch_config
    import torch.nested._internal.nested_tensor as nested_tensor
    from torch._subclasses.fake_tensor import FakeTensorConverter

    mode = FakeTensorMode.__new__(FakeTensorMode)
    TorchDispatchMode.__init__(mode)
    mode.allow_fallback_kernels = True
    mode.propagate_real_tensors = functorch_config.fake_tensor_propagate_real_tensors
    mode.fake_tensor_converter = FakeTensorConverter(copy_data=mode.propagate_real_tensors, export=False)
    mode.static_shapes = True
    mode.allow_scalar_outputs = False
    mode._allow_unsafe_data_ptr_access = functorch_config.fake_tensor_allow_unsafe_data_ptr_access
    mode.allow_meta = functorch_config.fake_tensor_allow_meta
    mode.cache_enabled = (os.environ.get("TORCH_FAKE_TENSOR_DISPATCH_CACHE", "1") == "1"
                          and not mode.propagate_real_tensors)
    mode.cache_crosscheck_enabled = os.environ.get("TORCH_FAKE_TENSOR_DISPATCH_CACHE_CROSSCHECK", "0") == "1"
    mode.allow_non_fake_inputs = True
    mode.in_kernel_invocation = False
    mode.enter_stack = []
    mode.shape_env = None
    mode._stack_trace = traceback.extract_stack()
    mode._stack = None
    mode._mode_key = torch._C._TorchDispatchModeKey.FAKE
    mode.nt_tensor_id_initial_count = nested_tensor._tensor_id_counter
    mode.nt_tensor_id_counter = mode.nt_tensor_id_initial_count
    return mode


def _dynamo_disabling_wrappers(roots: Iterable[Any]) -> Iterator[Callable]:
    """The ``torch._disable_dynamo`` wrappers inside ``roots``: each function, what it wraps and the
    functions its closure holds (python kernels nest torch's decorators several deep)."""
    inner_code = torch._disable_dynamo(lambda: None).__code__
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        function = stack.pop()
        if isinstance(function, functools.partial):
            function = function.func
        if not isinstance(function, types.FunctionType) or id(function) in seen:
            continue
        seen.add(id(function))
        if function.__code__ is inner_code:
            yield function
        stack.extend(cell.cell_contents for cell in function.__closure__ or () if _filled(cell))
        if hasattr(function, "__wrapped__"):
            stack.append(function.__wrapped__)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _call_without_dynamo_until_imported(wrapper: Callable) -> None:
    """``torch._disable_dynamo``'s wrapper imports torch._dynamo at its first call (~0.8 s and ~45 MB
    in a fresh process), then calls ``torch._dynamo.disable(fn)``. Until torch._dynamo is imported
    no frame can be traced, so calling ``fn`` itself is the same; once it is imported, the wrapper
    gets dynamo's disabled function as torch makes it."""
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))
    fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
    if getattr(fn, "__dynamo_disable", None) is not None:
        return

    def until_dynamo_is_imported(*args: Any, **kwargs: Any) -> Any:
        disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
        if disable is None:
            return fn(*args, **kwargs)
        disabled = disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = disabled
        return disabled(*args, **kwargs)

    _never_traced(until_dynamo_is_imported.__code__)
    fn.__dynamo_disable = until_dynamo_is_imported


def _never_traced(code: types.CodeType) -> None:
    """Dynamo runs frames of ``code`` without tracing them, as torch's own files (what
    ``torch._dynamo.eval_frame.skip_code`` does, without importing dynamo): a compiled function's
    graph break into a python reference must not meet a frame of fxprop's in between."""
    frames = torch._C._dynamo.eval_frame
    frames.set_code_exec_strategy(code, frames._FrameExecStrategy(frames._FrameAction.SKIP, frames._FrameAction.DEFAULT))


def dispatch_without_importing_dynamo(mode_type: type) -> None:
    """torch wraps every TorchDispatchMode's ``__torch_dispatch__`` so that dynamo never traces into
    it (`_call_without_dynamo_until_imported`); a subclass's method calls its bases' through super().
    Once per mode type: the wrappers keep what was set on them."""
    if mode_type in _modes_prepared:
        return
    methods = [cls.__dict__["__torch_dispatch__"] for cls in mode_type.__mro__ if "__torch_dispatch__" in cls.__dict__]
    for wrapper in _dynamo_disabling_wrappers(methods):
        _call_without_dynamo_until_imported(wrapper)
    _modes_prepared.add(mode_type)


_modes_prepared: set[type] = set()


def _python_kernels_without_importing_dynamo() -> None:
    """torch's python references wrap their type promotion in ``torch._disable_dynamo``, and serve as
    meta kernels and decompositions (hardtanh, clamp, where, ...)."""
    modules = [module for name, module in list(sys.modules.items())
               if module is not None and name.startswith(("torch._refs", "torch._prims", "torch._decomp"))]
    roots = [value for module in modules for value in list(vars(module).values())]
    roots += [*decomposition_table.values(), *_meta_registrations.meta_table.values()]
    for wrapper in _dynamo_disabling_wrappers(roots):
        _call_without_dynamo_until_imported(wrapper)


def lookup_compile_backend(name: str) -> Any:
    """The torch.compile backend registered under ``name`` ("inductor", "aot_eager", "eager", ...)."""
    from torch._dynamo import lookup_backend
    return lookup_backend(name)


def opinfo_database() -> list:
    """torch's OpInfo table (``op_db``, from its internal testing package; needs expecttest)."""
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def module_database() -> list:
    """torch's ModuleInfo table (``module_db``, from its internal testing package; needs expecttest)."""
    from torch.testing._internal.common_modules import module_db
    return module_db


def raises_in_forward(error_input: Any) -> bool:
    """Whether a ModuleInfo ``ErrorModuleInput`` fails in the forward (else in the constructor)."""
    from torch.testing._internal.common_modules import ModuleErrorEnum
    return error_input.error_on is ModuleErrorEnum.FORWARD_ERROR


def gradients(loss: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``torch.autograd.grad(loss, inputs)`` with the engine called directly. Called through torch
    function dispatch, as it is while a function mode is active, the engine would record the
    thread's state with the mode stack emptied by the dispatch, and code that the backward runs
    (activation checkpointing's recomputation) would run without the modes."""
    from torch.autograd.graph import _engine_run_backward
    return _engine_run_backward((loss,), (torch.ones_like(loss),), False, False, tuple(inputs), False, False)


@contextlib.contextmanager
def one_fake_mode_for_traced_values():
    """make_fx in real mode annotates each node with a fake copy of its value, made in a new
    FakeTensorMode unless one is ambient (``detect_fake_mode`` reads the TracingContext's), and
    each new mode records the Python stack: one ambient mode for the whole trace halves its time."""
    from torch._guards import TracingContext, tracing
    with tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True))):
        yield


@contextlib.contextmanager
def without_ambient_modes():
    """Leave every dispatch mode (a FakeTensorMode, a tracer's proxy mode...) and every
    TorchFunctionMode (``with torch.device(...)``) the caller has active; they come back after."""
    from torch._ops import _len_torch_dispatch_stack_pre_dispatch
    if not (torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack()
            or _len_torch_dispatch_stack_pre_dispatch()):
        yield  # none to leave
        return
    function_modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in reversed(function_modes):
            torch._C._push_on_torch_function_stack(mode)


def without_callers_python_dispatcher():
    """torch's python dispatcher off for a call whose caller left it on (AOTAutograd calls its
    compilers so): every op would pay a python-level kernel lookup, and the kernels are those of a
    call made anywhere else. A symbolic propagation turns it on where its kernels need it
    (`fxprop.symbolic.dispatcher`)."""
    return no_python_dispatcher() if _python_dispatcher_on() else contextlib.nullcontext()


def _python_dispatcher_on() -> bool:
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


def functorch_depth() -> int:
    """How many functorch transforms (vmap, grad, jvp levels) are active now."""
    return torch._C._functorch.get_dynamic_layer_stack_depth()


def functorch_unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor under a functorch transform's wrappers (vmap's batched tensors, grad's)."""
    while torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        tensor = torch._C._functorch.get_unwrapped(tensor)
    return tensor


def undo_functorch_to(depth: int) -> None:
    """Leave the functorch levels entered since ``depth``: a graph that increments vmap's nesting
    (dynamo inlines ``torch.vmap`` so) and fails before it decrements it leaves the process at the
    depth it started from, as dynamo does when a frame fails."""
    if functorch_depth() > depth:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)


class AutogradModes(NamedTuple):
    """The thread's autograd switches a graph can flip (dynamo inlines ``torch.func.jvp`` and
    ``grad`` as calls that set them) and the forward-AD level it may enter."""
    functorch_depth: int
    fwd_grad_enabled: bool
    saved_tensors_hooks_enabled: bool
    saved_tensors_hooks_message: str | None
    dual_level_free: int | None  # the level a graph entering forward AD gets, if it may enter one


def _enters_dual_level(gm: torch.fx.GraphModule) -> bool:
    from torch._functorch.predispatch import _enter_dual_level
    return any(node.target in (_enter_dual_level, torch._C._enter_dual_level) for node in gm.graph.nodes)


_dual_level_turn = threading.RLock()


@contextlib.contextmanager
def dual_level_turn(gm: torch.fx.GraphModule):
    """Forward-AD levels are process-wide (torch has one open at a time), so propagations of graphs
    that enter one take turns: two threads propagating jvp graphs at once would otherwise refuse
    each other ("Nested forward mode AD is not supported"). Yields whether ``gm`` enters one."""
    if not _enters_dual_level(gm):
        yield False
        return
    with _dual_level_turn:
        yield True


def autograd_modes(enters_dual_level: bool) -> AutogradModes:
    free = None
    if enters_dual_level:  # forward-AD levels are process-wide: asked only of graphs that enter one
        try:
            free = torch._C._enter_dual_level()
            torch._C._exit_dual_level(level=free)
        except RuntimeError:  # the caller is inside a level of its own
            free = None
    return AutogradModes(functorch_depth(), torch._C._is_fwd_grad_enabled(),
                         torch._C._autograd._saved_tensors_hooks_is_enabled(),
                         torch._C._autograd._saved_tensors_hooks_get_disabled_error_message(), free)


def restore_autograd_modes(modes: AutogradModes, failed: bool) -> None:
    """Undo what a graph left switched when it failed between the calls that set and reset them,
    as the context managers of ``torch.func`` would have on the way out (a forward-AD level only
    after a failure: another thread may hold one)."""
    undo_functorch_to(modes.functorch_depth)
    torch._C._set_fwd_grad_enabled(modes.fwd_grad_enabled)
    if modes.saved_tensors_hooks_enabled:
        torch._C._autograd._saved_tensors_hooks_enable()
    else:
        torch._C._autograd._saved_tensors_hooks_disable(modes.saved_tensors_hooks_message or "")
    if failed and modes.dual_level_free is not None:
        try:
            torch._C._exit_dual_level(level=modes.dual_level_free)
        except RuntimeError:
            pass  # the graph left no level open


def higher_order_ops() -> dict[str, HigherOrderOperator]:
    """Every higher-order operator torch has defined so far, by name."""
    from torch._ops import _higher_order_ops
    return dict(_higher_order_ops)


def auto_functionalized_kernels() -> tuple[Any, Any]:
    """torch's eager kernels of ``auto_functionalized`` and ``auto_functionalized_v2``: python over any
    tensors (clone the mutable arguments, call the op on the clones), which their fake kernels run too."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized_dense, auto_functionalized_v2_dense
    return auto_functionalized_dense, auto_functionalized_v2_dense


def functionalized_hop_call(kwargs: dict) -> tuple[tuple, dict, list]:
    """How ``auto_functionalized_v2`` of a higher-order op calls it, as its eager kernel does
    (``auto_functionalized_v2_dense``): the op's positional and keyword arguments, the mutated
    ones regenerated as views of clones of their bases (``_all_bases``), and those clones."""
    from torch._higher_order_ops.auto_functionalize import _generate_new_op_kwargs_from_bases
    kwargs = dict(kwargs)
    bases = kwargs.pop("_all_bases", [])
    only_clone = kwargs.pop("_only_clone_these_bases", None)
    schema = pytree.tree_unflatten([], kwargs.pop("_op_schema")).schema
    op_kwargs, cloned_bases = _generate_new_op_kwargs_from_bases(
        schema, kwargs, bases, tuple(range(len(bases))) if only_clone is None else only_clone, False)
    args = [op_kwargs[argument.name] for argument in schema.arguments if not argument.kwarg_only]
    keywords = {argument.name: op_kwargs[argument.name] for argument in schema.arguments if argument.kwarg_only}
    if schema.tree_spec is not None:
        args, keywords = pytree.tree_unflatten([*args, *keywords.values()], schema.tree_spec)
    return tuple(args), keywords, cloned_bases


def autocast_region_calls() -> tuple[Any, Any]:
    """The functions torch.export calls to open and close an autocast region that holds a higher-order op
    (``torch.amp.autocast_mode._enter_autocast`` / ``_exit_autocast``)."""
    from torch.amp import autocast_mode
    return autocast_mode._enter_autocast, autocast_mode._exit_autocast


def flat_apply_kernel() -> Any:
    """torch's kernel of the ``flat_apply`` higher-order op: ``func(*args, **kwargs)``, the arguments
    rebuilt from their flat form (python over any tensors)."""
    from torch._higher_order_ops.flat_apply import impl
    return impl


_ALLOCATION_RECORDING = torch.autograd.profiler_legacy.profile(profile_memory=True).config()


def allocations_measurable() -> bool:
    """Whether `peak_allocated_bytes` can read a call's allocations on this thread (no profiler runs)."""
    return not torch.autograd._profiler_enabled()


def peak_allocated_bytes(fn) -> tuple[Any, int | None]:
    """``fn()`` and the most bytes the CPU allocator held for it at once (temporaries and
    results; what it held before is not counted), read from the legacy profiler's
    allocation records, which cost microseconds and are kept per thread. None where a
    profiler already runs on this thread: there is then no record of our own to read."""
    if not allocations_measurable():
        return fn(), None
    torch.autograd._enable_profiler_legacy(_ALLOCATION_RECORDING)
    try:
        result = fn()
    finally:
        records = torch.autograd._disable_profiler_legacy()
    live = peak = 0
    for record in sorted((r for thread in records for r in thread if r.kind() == "memory_alloc"),
                         key=lambda record: record.start_us()):
        live += record.cpu_memory_usage()
        peak = max(peak, live)
    return result, peak


# --- torch.distributed: opaque objects, the functional collectives, the fake process group ---

def distributed_available() -> bool:
    """Whether this torch build has torch.distributed (its ops and its process groups)."""
    return torch.distributed.is_available()


def is_opaque(value: Any) -> bool:
    """Whether ``value`` is an object a graph passes whole to custom ops, never looked into: a
    TorchScript object, an instance of a type registered with ``register_opaque_type`` (a
    DeviceMesh, a ProcessGroup), or the FakeScriptObject AOT autograd wraps either in."""
    if isinstance(value, torch.ScriptObject):
        return True
    from torch._library.fake_class_registry import FakeScriptObject
    from torch._library.opaque_object import is_opaque_value
    return isinstance(value, FakeScriptObject) or is_opaque_value(value)


def register_collective_meta_kernels() -> None:
    """Import ``torch.distributed._functional_collectives``: it registers the Meta kernels of the
    ``_c10d_functional`` ops (defined in C++, whose only other kernels run real collectives)."""
    if distributed_available():
        import torch.distributed._functional_collectives  # noqa: F401


def register_dtensor_fake_kernels() -> None:
    """Import ``torch.distributed.tensor._collective_utils``: it registers the fake kernel of
    ``_dtensor::shard_dim_alltoall`` (whose fake resolves the group by name to learn its size)."""
    import torch.distributed.tensor._collective_utils  # noqa: F401


def register_fake_process_group_backend() -> None:
    """Register torch's ``"fake"`` process group backend (a FakeProcessGroup: every collective
    completes at once on this process, as a mesh of N ranks would, without moving data). Its
    creator lives in ``torch.testing._internal.distributed.fake_pg``, torch's own tool for this."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


# --- DTensor: its local tensor and spec, its planner's redistributions, local shapes per rank ---

def dtensor_type() -> type | None:
    """The DTensor class, or None where its module is not imported (no DTensor can exist then)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module.DTensor if module is not None else None


def local_tensor_of(dtensor: Any) -> torch.Tensor:
    """A DTensor's local shard, the tensor itself (``to_local()`` would go through autograd)."""
    return dtensor._local_tensor


def dtensor_spec_of(dtensor: Any) -> Any:
    return dtensor._spec


def make_dtensor(local: torch.Tensor, spec: Any, requires_grad: bool) -> Any:
    """A DTensor of ``spec`` (mesh, placements, global shape and stride) around ``local``, built as
    DTensor's own ops build their results: no collective, no check of the local shape."""
    from torch.distributed.tensor import DTensor
    return DTensor(local, spec, requires_grad=requires_grad)


def dtensor_spec(mesh: Any, placements: tuple, shape: tuple, stride: tuple, dtype: torch.dtype) -> Any:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    return DTensorSpec(mesh, tuple(placements), tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), dtype))


def local_shape_at(global_shape: tuple, mesh_shape: tuple, coordinate: tuple, placements: tuple) -> tuple[int, ...]:
    """The local shard's shape of a DTensor of ``global_shape`` at mesh ``coordinate``: DTensor's
    own arithmetic (uneven splits, ``_StridedShard`` included)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    shape, _ = _compute_local_shape_and_global_offset(global_shape, mesh_shape, list(coordinate), placements,
                                                      skip_offset=True)
    return tuple(shape)


def group_name_of(group: Any) -> str:
    return group.group_name


def transformers_tp_plan(model: Any, tp_size: int) -> dict[str, str]:
    """A transformers model's tensor-parallel plan for ``tp_size`` ranks, one entry per module and
    parameter, as ``from_pretrained(distributed_config=...)`` resolves it (transformers' private
    ``_resolve_parallel_plans``: its torch-level neighbour here, as the one private name it reads)."""
    from transformers.distributed.configuration_utils import DistributedConfig
    plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp_size))
    return plan


def process_group_of(script_object: Any) -> Any:
    """The ``ProcessGroup`` a graph holds as a TorchScript object (the argument of a ``c10d`` op)."""
    from torch.distributed import ProcessGroup
    return ProcessGroup.unbox(script_object)


_redistribution_lock = threading.RLock()


@contextlib.contextmanager
def observing_redistributions(observe):
    """While the block runs, each call of DTensor's ``redistribute_local_tensor`` (implicit, from
    an op's sharding, or explicit, ``DTensor.redistribute``) runs inside ``observe(local, current_spec,
    target_spec, transform_infos, explicit)``, a context manager
    whose value is a list the result is appended to; ``transform_infos`` are the steps of its
    planner. torch binds the function by name in two modules: both are replaced for the block."""
    import torch.distributed.tensor._api as api
    import torch.distributed.tensor._dispatch as dispatch
    import torch.distributed.tensor._redistribute as redistribute
    original = redistribute.redistribute_local_tensor

    @functools.wraps(original)
    def observed(local_tensor, current_spec, target_spec, *args, **kwargs):
        steps = redistribute._gen_transform_infos(current_spec, target_spec)
        with observe(local_tensor, current_spec, target_spec, steps, kwargs.get("is_explicit", False)) as result:
            output = original(local_tensor, current_spec, target_spec, *args, **kwargs)
            result.append(output)
            return output
    modules = (redistribute, dispatch, api)
    with _redistribution_lock:
        saved = [module.redistribute_local_tensor for module in modules]
        for module in modules:
            module.redistribute_local_tensor = observed
        try:
            yield
        finally:
            for module, function in zip(modules, saved):
                module.redistribute_local_tensor = function


def transform_steps(infos: Any) -> list[tuple[int, Any, Any]]:
    """The planner's steps as (mesh dim, from placement, to placement)."""
    return [(info.mesh_dim, *info.src_dst_placements) for info in infos]


def group_size_of(group_name: str) -> int:
    """The size of the process group a functional collective names."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name).size()


def has_forward_hooks(module: torch.nn.Module) -> bool:
    """Whether the module has forward hooks or forward pre-hooks of its own (a parallel style's)."""
    return bool(module._forward_pre_hooks or module._forward_hooks)


def strided_shard(dim: int, split_factor: int) -> Any:
    """The placement FSDP2 gives dim ``dim`` on its mesh dim when tensor parallelism already shards
    that dim ``split_factor`` ways: gathering it on the FSDP dim alone is one all-gather."""
    from torch.distributed.tensor.placement_types import _StridedShard
    return _StridedShard(dim, split_factor=split_factor)


def forget_dtensor_caches() -> None:
    """Clear DTensor's caches of sharding decisions and redistribution plans. They are keyed by
    meshes that compare equal across process groups (same shape, same names), and hold the
    meshes (and group names) of the first: after a simulated world is replaced, a plan cached
    for the old one would name groups that no longer exist."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    _clear_sharding_prop_cache()
    clear_redistribute_planner_cache()


# --- FSDP2 (fully_shard): its state, read (never changed) to emulate its forward hooks ---

class FsdpParameter(NamedTuple):
    """One parameter an FSDP group manages."""
    sharded: torch.nn.Parameter  # the sharded DTensor FSDP registers between forwards
    owners: tuple  # each (module, name) FSDP registers it on (tied parameters have several)
    unsharded_mesh: Any  # the mesh of the unsharded parameter, a DTensor there (TP); None: a plain tensor
    padded_numel: int  # elements of the rank's shard, padded as FSDP pads it (its all-gather input)
    origin: int  # FSDP's id of the parameter it sharded: one parameter managed by two groups has it twice


class FsdpGroup(NamedTuple):
    """An FSDP parameter group: all-gathered in one collective."""
    parameters: tuple  # FsdpParameter
    shard_dim: int | None  # the mesh dim of the sharded parameters' mesh FSDP shards on (None: replicate)
    reshard_after_forward: bool | int  # True, False, or the world size of a smaller post-forward mesh
    unsharded: bool  # gathered now (a forward that kept it: a root's)
    released: bool  # its process group is no longer the one registered under its name (its world was destroyed)


class FsdpState(NamedTuple):
    """What `fully_shard` set up for one module (or one list of modules, grouped)."""
    modules: tuple
    groups: tuple  # FsdpGroup
    pre_hook_ids: frozenset  # FSDP's forward pre-hooks, by handle id in the modules' hook dicts
    post_hook_ids: frozenset
    is_root: bool | None  # as its lazy initialization decided; None before its first forward
    auto_reshard_after_forward: bool  # reshard_after_forward=None: a root keeps its parameters gathered
    param_dtype: torch.dtype | None
    output_dtype: torch.dtype | None
    cast_forward_inputs: bool
    spmd_mesh: bool  # fully_shard(dp_mesh_dims=...): FSDP on dims of a full SPMD mesh


def fsdp_states() -> list[FsdpState]:
    """Every FSDP state alive in this process (torch keeps them in a registry of composable states)."""
    if "torch.distributed.fsdp._fully_shard._fsdp_state" not in sys.modules:
        return []
    from torch.distributed._composable_state import _module_state_mapping
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    found: dict[int, Any] = {}
    for reference in list(_module_state_mapping.values()):
        state = reference()
        if isinstance(state, FSDPState):
            found.setdefault(id(state), state)
    return [_fsdp_state(state) for state in found.values()]


def _fsdp_state(state: Any) -> FsdpState:
    hooks = [state._pre_forward_hook_handle, state._post_forward_hook_handle]
    handles = [inner for handle in hooks for inner in getattr(handle, "handles", (handle,))]
    pre_ids = frozenset(h.id for h in handles if any(h.id in module._forward_pre_hooks for module in state._modules))
    post_ids = frozenset(h.id for h in handles) - pre_ids
    policy = state._mp_policy
    groups = tuple(_fsdp_group(group) for group in state._fsdp_param_groups)
    spmd = any(group.mesh_info.is_spmd_mesh for group in state._fsdp_param_groups)
    return FsdpState(tuple(state._modules), groups, pre_ids, post_ids, state._is_root,
                     bool(state._auto_reshard_after_forward), policy.param_dtype, policy.output_dtype,
                     policy.cast_forward_inputs, spmd)


def _fsdp_group(group: Any) -> FsdpGroup:
    parameters = []
    for fsdp_param in group.fsdp_params:
        info = fsdp_param._module_info
        owners = ((info.module, info.param_name), *zip(info.shared_modules, info.shared_param_names))
        spec = fsdp_param._unsharded_dtensor_spec
        parameters.append(FsdpParameter(fsdp_param.sharded_param, owners, spec.mesh if spec is not None else None,
                                        fsdp_param.padded_sharded_param_size.numel(), fsdp_param._orig_param_uid))
    after = group.post_forward_mesh_info
    if after is None:
        reshard: bool | int = False
    elif after == group.mesh_info:
        reshard = True
    else:
        reshard = after.shard_mesh_size
    return FsdpGroup(tuple(parameters), group.mesh_info.shard_mesh_dim, reshard, group.is_unsharded,
                     _released(getattr(group.mesh_info, "shard_process_group", None)))


def _released(process_group: Any) -> bool:
    from torch.distributed.distributed_c10d import _resolve_process_group
    if process_group is None:
        return False
    try:
        return _resolve_process_group(process_group.group_name) is not process_group
    except (RuntimeError, ValueError):
        return True


def forward_hook_dicts(module: torch.nn.Module) -> tuple[dict, dict]:
    """A module's forward pre-hooks and forward hooks, by handle id (the dicts its handles remove from)."""
    return module._forward_pre_hooks, module._forward_hooks
