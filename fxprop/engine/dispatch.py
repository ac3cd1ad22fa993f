"""Running ops on meta tensors with fxprop's rules in charge of every aten op they reach.

`RuleDispatch` is a TorchDispatchMode: autograd runs above it (so ``requires_grad`` comes out
as torch computes it), and each aten op that arrives is resolved by `fxprop.resolve.order.resolve`
and run by its kind. Rules whose own ops must be resolved again (python rules,
decompositions, composite kernels) run with the mode re-entered, one level deeper; the
node's record notes the kinds of the ops reached at the top level (a composite's parts) and
the fallback bytes of every level.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from .. import symbolic
from . import value_flow
from .session import Session
from . import session as context
from ..devices import META, merge_devices, tag
from ..call import Call
from ..errors import UnsupportedError
from ..aten.host_dtypes import check_cpu_kernel_dtypes, refusal_type_on_the_host
from ..aten.host_overlap import check_overlapping_writes
from ..aten.in_place import reshapes_in_place, written_arguments
from ..aten.index_values import check_known_indices
from ..kinds import Kind, Rule
from ..kinds.decomposition import run_composite_kernel, run_decomposition
from ..kinds.fallback import refuse_without_kernel_for, run_on_host
from ..kinds.meta import run_meta
from ..resolve.order import resolve_op
from .inputs import to_internal
from ..torch_compat import DATA_DEPENDENT_ERRORS, FakeTensor, TorchDispatchMode, dtensor_type, schema_of, storage_key


class RuleDispatch(TorchDispatchMode):
    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self.symbols = symbolic.current()
        self.depth = 0
        self.noted_depth = 0  # the record notes the ops at depths up to this: a node's parts, and a composite's
        self.in_progress: tuple = ()
        self.pushed = False  # whether the mode is on torch's dispatch stack now (torch pops it while it dispatches)

    def __enter__(self):
        self.pushed = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.pushed = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        was_pushed, self.pushed = self.pushed, False
        try:
            return self.dispatch(func, args, kwargs or {})
        finally:
            self.pushed = was_pushed

    def dispatch(self, func, args: tuple, kwargs: dict) -> Any:
        args, kwargs = _onto_meta(args, kwargs)
        call = Call(func, args, kwargs)
        if any(t.device.type != "meta" for t in call.tensors):
            call = Call(func, *self.constants_onto_meta(args, kwargs))
            node_device = context.node_device()
            if torch.Tag.pointwise in func.tags and node_device is not None:
                merge_devices([*call.tensors, tag(torch.empty((1,), device="meta"), node_device)])
        if self.symbols.active and torch.Tag.pointwise in func.tags and not schema_of(func).is_mutable:
            broadcast = symbolic.broadcast_inputs(call.args, call.kwargs)
            if broadcast[0] is not call.args or broadcast[1] is not call.kwargs:
                call = Call(func, *broadcast)
        rule = resolve_op(call, in_progress=self.in_progress)
        if self.depth <= self.noted_depth:
            self.session.record.note(rule.kind, rule.name)
        if not self.symbols.active:
            return self.run(rule, call)
        try:
            with symbolic.python_dispatcher():
                return self.run(rule, call)
        except DATA_DEPENDENT_ERRORS as error:
            raise symbolic.undecidable(func, call.args, call.kwargs, error) from error

    def constants_onto_meta(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A real tensor reaching an op here is the user's own constant (a module-level tensor
        read by a wrapped function): it takes part as a meta tensor on its device, its values known."""
        real_values = self.session.real_values

        def onto_meta(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                return to_internal(value, "a tensor constant", real_values)
            if isinstance(value, (list, tuple)):
                return type(value)(onto_meta(item) for item in value)
            return value
        return onto_meta(args), {key: onto_meta(value) for key, value in kwargs.items()}

    def run(self, rule: Rule, call: Call) -> Any:
        func, args, kwargs = call.target, call.args, call.kwargs
        known = self.session.real_values
        # Copies of the inputs' known values, taken before an in-place op forgets what it writes.
        host_inputs = value_flow.host_inputs(call, known)
        if self.session.storages_of_calls and reshapes_in_place(func) and self.reshapes_a_given_tensor(func, args, kwargs):
            self.session.reshaped_in_place += 1
        if known and schema_of(func).is_mutable:
            for written in written_arguments(func, args, kwargs):
                known.forget_written(written)
        if kwargs.get("generator") is not None:
            # A generator decides values only. torch's python kernels refuse one, and the fallback
            # must not draw from the user's (it takes its own).
            kwargs = {**kwargs, "generator": None}
        if self.depth == 0:  # the node's own op; a decomposition's parts may use other dtypes
            refuse_without_kernel_for(func, context.node_device())
            check_overlapping_writes(func, args, kwargs)
            try:
                result = self.run_kind(func, rule, args, kwargs)
            except (RuntimeError, IndexError, ValueError, TypeError, AssertionError, OverflowError) as refusal:
                refusal_type_on_the_host(func, args, kwargs, refusal)
                raise
            # The kernel's dtype dispatch comes after its shape and type checks, which the call passed.
            check_cpu_kernel_dtypes(func, args, kwargs, result)
        else:
            result = self.run_kind(func, rule, args, kwargs)
        if known:  # the kernel reads the indices after the checks the call passed
            check_known_indices(func, args, kwargs, known)
        if host_inputs is not None:
            value_flow.learn(func, args, kwargs, result, host_inputs, known)
        return result

    def reshapes_a_given_tensor(self, func, args: tuple, kwargs: dict) -> bool:
        """Whether ``func`` reshapes in place a tensor over the storage of one given to a call being
        computed (not one the call made itself: ``gru`` transposes its own output)."""
        written = written_arguments(func, args, kwargs) or [arg for arg in args[:1] if isinstance(arg, torch.Tensor)]
        return any(storage_key(tensor) in self.session.storages_of_calls for tensor in written)

    def run_kind(self, func, rule: Rule, args: tuple, kwargs: dict) -> Any:
        kind = rule.kind
        if kind is Kind.META:
            return run_meta(func, args, kwargs)
        if kind is Kind.FALLBACK:
            refuse_without_kernel_for(func, context.node_device())
            result, used = run_on_host(func, args, kwargs, limit_bytes=self.session.fallback_limit_bytes,
                                       real_values=self.session.real_values)
            self.session.record.fallback_bytes += used
            return result
        if kind is Kind.UNSUPPORTED:
            raise UnsupportedError(rule.name)
        with self.running(func, composite=rule.composite):
            if kind is Kind.PYTHON:
                return rule.fn(*args, **kwargs)
            if isinstance(rule.fn, str):  # a C++ composite kernel, named by its dispatch key
                return run_composite_kernel(func, rule.fn, args, kwargs)
            return run_decomposition(func, rule.fn, args, kwargs)

    @contextlib.contextmanager
    def outermost(self):
        """A frame of its own for a subgraph's nodes, run while a higher-order op's node runs: each
        enters the dispatch afresh, at depth 0, with nothing in progress; the outer frame comes back after."""
        saved = (self.depth, self.noted_depth, self.in_progress, self.pushed)
        self.depth = self.noted_depth = 0
        self.in_progress = ()
        try:
            yield
        finally:
            self.depth, self.noted_depth, self.in_progress, self.pushed = saved

    @contextlib.contextmanager
    def running(self, target: Any, composite: bool = False):
        """Run a rule whose own ops are resolved again: one level deeper, ``target`` in progress. The
        parts of a composite the node reached directly count towards the node's kind."""
        outer, outer_noted = self.in_progress, self.noted_depth
        if composite and self.depth == self.noted_depth:
            self.noted_depth += 1
        self.depth += 1
        self.in_progress = (*outer, target)
        try:
            if self.pushed:
                yield
            else:
                with self:
                    yield
        finally:
            self.depth -= 1
            self.in_progress, self.noted_depth = outer, outer_noted


class DTensorDispatch(RuleDispatch):
    """`RuleDispatch` for graphs with DTensor values (`fxprop.distributed.dtensors`): an op on a DTensor is
    DTensor's (its sharding propagator and redistribute planner run, and the local ops and
    collectives they issue come back here); every op on local tensors is recorded for the node.
    Graphs without DTensors use `RuleDispatch` itself, so this costs them nothing."""

    def __init__(self, session: Session, recorder: Any):
        super().__init__(session)
        self.recorder = recorder
        self.dtensor = dtensor_type()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtensor = self.dtensor
        if any(issubclass(t, dtensor) for t in types):
            return NotImplemented
        result = super().__torch_dispatch__(func, types, args, kwargs)
        if not any(issubclass(t, FakeTensor) for t in types):
            # on FakeTensors: DTensor's sharding propagator computing global metadata (FakeTensorMode,
            # an infra mode, comes after this one), not the rank's work
            self.recorder.local_op(func, args, kwargs or {}, result, self.depth)
        return result


def _onto_meta(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Device arguments become "meta" and pinning is dropped: results are computed on meta."""
    if any(isinstance(a, torch.device) for a in args):
        args = tuple(META if isinstance(a, torch.device) else a for a in args)
    device = kwargs.get("device")
    if (device is not None and device != META) or kwargs.get("pin_memory"):
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = META
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
    return args, kwargs
