"""Prove that fxprop's annotations match real execution.

Four tools, all raising `AssertionError` with one line per disagreement (node, op, field,
expected vs got):

- `assert_matches_real(gm, *inputs)` propagates a graph, runs a copy of it for real, and
  compares every node.
- `assert_matches_traced(gm, *inputs)` propagates a graph a tracer annotated (AOT autograd's
  graphs, dynamo's, an ExportedProgram's) and compares every node with the tracer's own
  ``meta["val"]``, symbolic sizes as expressions in the tracer's symbols.
- `check_rule(target, *args, **kwargs)` does the same for one op: it builds a one-node graph
  calling ``target`` and checks it.
- the ``fxprop_check`` pytest fixture (`fxprop.pytest_plugin`, enabled automatically once
  fxprop is installed) hands both to a backend's own test suite.

Strides are compared where they address memory: a dimension of size 1 may carry any stride
(torch's meta kernels and real kernels differ there freely), and a tensor with no elements
has no layout to compare; this is `torch._prims_common.check_significant_strides`'s rule.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from ..torch_compat import FakeTensor, pytree, version_counter

from ..engine.metadata import map_structure
from ..engine.propagation import propagate
from .mismatches import Mismatch, op_label, paired_items, render_mismatches, shape_of
from .traced import assert_matches_traced, compare_with_traced, traced_values  # noqa: F401  (part of the kit)
from ..resolve.call_graphs import call_graph  # noqa: F401  (part of the kit: the one-node graphs check_rule builds)
from ..errors import FxpropError, PropagationError
from ..resolve.registry import target_name
from ..engine.inputs import TensorSpec


def real_value(value: Any, *, generator: torch.Generator | None = None) -> Any:
    """A real tensor standing in for a spec, a fake or a meta tensor, laid out alike (strides,
    storage offset, overlap); real tensors are copied storage and all."""
    def make(shape, stride, offset, dtype, device, requires_grad):
        device = torch.device(device)
        if device.type not in ("cpu", "meta") and not _device_available(device):
            device = torch.device("cpu")
        if device.type == "meta":
            device = torch.device("cpu")
        extent = offset + 1 + sum((size - 1) * step for size, step in zip(shape, stride)) if all(shape) else 0
        storage = torch.empty(extent, dtype=dtype, device=device)  # filled whole: a view may overlap itself
        if dtype.is_floating_point or dtype.is_complex:
            storage.copy_(torch.randn(extent, generator=generator).to(dtype))
        else:
            storage.copy_(torch.randint(0, 2, (extent,), generator=generator).to(dtype))
        return storage.as_strided(shape, stride, offset).requires_grad_(requires_grad)

    if isinstance(value, TensorSpec):
        stride = value.stride or torch.empty(value.shape, device="meta").stride()
        return make(value.shape, stride, 0, value.dtype, value.device, value.requires_grad)
    if isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.device.type == "meta"):
        return make(value.shape, value.stride(), value.storage_offset(), value.dtype, value.device,
                    value.requires_grad)
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            return value.detach().clone().requires_grad_(value.requires_grad)
        copy = torch.empty(0, dtype=value.dtype, device=value.device)
        copy.set_(value.detach().untyped_storage().clone(), value.storage_offset(), value.shape, value.stride())
        return copy.requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(real_value(v, generator=generator) for v in value)
    if isinstance(value, dict):
        return {k: real_value(v, generator=generator) for k, v in value.items()}
    return value


def meta_devices_not_asked_for(gm: torch.fx.GraphModule, staged: dict | None = None,
                               default_device: torch.device | None = None) -> list[str]:
    """The nodes whose annotated value lies on ``meta`` although nothing the user gave is there: no
    meta input, no meta parameter or buffer, no ``"meta"`` device argument, no meta default device.
    (fxprop computes on meta tensors; a logical device of ``meta`` anywhere else is a leak.)
    ``staged`` maps nodes to the values about to be written; by default each node's
    ``meta["val"]`` is read."""
    values = ({node: entry[0] for node, entry in staged.items()} if staged is not None
              else {node: node.meta.get("val") for node in gm.graph.nodes})

    def on_meta(value: Any) -> bool:
        return any(isinstance(leaf, torch.Tensor) and leaf.device.type == "meta" for leaf in pytree.tree_leaves(value))

    def says_meta(node: torch.fx.Node) -> bool:
        return any(leaf == "meta" or (isinstance(leaf, torch.device) and leaf.type == "meta")
                   for leaf in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(leaf, (str, torch.device)))

    asked = ((default_device is not None and torch.device(default_device).type == "meta")
             or any(on_meta(value) for node, value in values.items() if node.op in ("placeholder", "get_attr"))
             or any(says_meta(node) for node in values)
             or any(t.device.type == "meta" for t in (*gm.parameters(), *gm.buffers())))
    return [] if asked else [node.name for node, value in values.items() if on_meta(value)]


def _device_available(device: torch.device) -> bool:
    module = getattr(torch, device.type, None)
    return bool(module and hasattr(module, "is_available") and module.is_available())


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, node):
        result = super().run_node(node)
        self.values[node.name] = observe(result)
        return result


@dataclass(frozen=True)
class Observed:
    """The metadata of one real tensor, kept after the tensor itself is freed."""
    shape: tuple
    dtype: torch.dtype
    stride: tuple | None
    device: torch.device
    requires_grad: bool
    layout: torch.layout = torch.strided

    @staticmethod
    def of(tensor: torch.Tensor) -> "Observed":
        stride = tensor.stride() if tensor.layout is torch.strided else None
        return Observed(tuple(tensor.shape), tensor.dtype, stride, tensor.device, tensor.requires_grad, tensor.layout)


def observe(value: Any) -> Any:
    """``value`` with every tensor replaced by its `Observed` metadata."""
    return map_structure(Observed.of, value)


def compare_values(got: Any, expected: Any, *, node: str, op: str, check_strides: bool = True,
                   check_device: bool = True) -> list[Mismatch]:
    """Every field where ``got`` (fxprop's value) differs from ``expected`` (`observe` of a real value)."""
    out: list[Mismatch] = []
    _compare(got, expected, out, node, op, check_strides, check_device, "")
    return out


def compare_nodes(gm: torch.fx.GraphModule, observed: dict[str, Any], *, check_strides: bool = True,
                  check_device: bool = True) -> list[Mismatch]:
    """Compare each node's ``meta["val"]`` with what `run_real` observed for it."""
    mismatches: list[Mismatch] = []
    for node in gm.graph.nodes:
        if node.op == "output" or node.name not in observed:
            continue
        mismatches += compare_values(node.meta.get("val"), observed[node.name], node=node.name, op=op_label(node),
                                     check_strides=check_strides, check_device=check_device)
    return mismatches


def _compare(got, expected, out: list, node: str, op: str, check_strides: bool, check_device: bool,
             path: str) -> None:
    if isinstance(expected, Observed):
        if not isinstance(got, torch.Tensor):
            out.append(Mismatch(node, op, f"value{path}", "a tensor", type(got).__name__))
            return
        shape_differs = _sizes_differ(expected.shape, tuple(got.shape))
        checks = [("shape", shape_differs), ("dtype", expected.dtype != got.dtype),
                  ("requires_grad", expected.requires_grad != got.requires_grad), ("layout", expected.layout != got.layout)]
        if check_strides and expected.stride is not None and got.layout is torch.strided and not shape_differs:
            checks.append(("stride", _sizes_differ(significant_strides(expected.shape, expected.stride),
                                                   significant_strides(tuple(got.shape), got.stride()))))
        if check_device:
            checks.append(("device", expected.device != got.device))
        values = {"shape": (expected.shape, tuple(got.shape)), "dtype": (expected.dtype, got.dtype),
                  "requires_grad": (expected.requires_grad, got.requires_grad), "layout": (expected.layout, got.layout),
                  "stride": (expected.stride, got.stride() if got.layout is torch.strided else None),
                  "device": (expected.device, got.device)}
        for name, differs in checks:
            if differs:
                out.append(Mismatch(node, op, f"{name}{path}", *values[name]))
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        for item_path, e, g in paired_items(expected, got, out, node, op, path):
            _compare(g, e, out, node, op, check_strides, check_device, item_path)
        return
    if isinstance(got, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not is_concrete(got):
        if not isinstance(expected, {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(got)]):
            out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))
        return
    if isinstance(expected, (int, float, bool, torch.Size, torch.dtype, torch.device, str, type(None))):
        if isinstance(expected, torch.Size) and isinstance(got, tuple):
            if _sizes_differ(tuple(expected), tuple(got)):
                out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))
        elif type(expected) is not type(got):
            out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))
        elif expected != got and not (isinstance(expected, float) and expected != expected):
            out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))


def is_concrete(value: Any) -> bool:
    """False for a symbolic size (e.g. the unbacked count of a data-dependent op)."""
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or value.node.is_constant()


def _sizes_differ(expected: tuple | None, got: tuple | None) -> bool:
    """Whether two shapes (or stride tuples) differ; a symbolic or masked (None) entry matches anything."""
    if expected is None or got is None:  # an empty tensor has no layout to compare
        return False
    if len(expected) != len(got):
        return True
    return any(e is not None and g is not None and is_concrete(g) and int(g) != e for e, g in zip(expected, got))


def significant_strides(shape: tuple, stride: tuple) -> tuple | None:
    """The strides that address memory: None for an empty tensor, size-1 (and symbolic) entries masked out."""
    if any(is_concrete(size) and size == 0 for size in shape):
        return None
    return tuple(int(st) if is_concrete(size) and size != 1 and is_concrete(st) else None
                 for size, st in zip(shape, stride))


def run_real(gm: torch.fx.GraphModule, *real_inputs: Any) -> dict[str, Any]:
    """Run a deep copy of ``gm`` for real and record every node's result's metadata."""
    recorder = _Recorder(copy.deepcopy(gm))
    recorder.run(*real_inputs)
    return recorder.values


def assert_matches_real(gm: torch.fx.GraphModule, *inputs: Any, check_strides: bool = True,
                        check_device: bool | None = None, **options: Any) -> None:
    """Propagate ``gm`` on ``inputs`` and assert every node matches a real run.

    Specs, meta and fake inputs are materialized with random data on their device (the CPU
    when that device is absent; devices are then not compared). Real inputs are cloned.
    ``options`` go to `fxprop.propagate` (e.g. ``param_device``). Propagation must leave the
    module, the inputs and the RNG untouched (`assert_no_side_effects`).

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 2))
    >>> assert_matches_real(gm, TensorSpec((3, 4)))
    """
    generator = torch.Generator().manual_seed(0)
    real_inputs = real_value(inputs, generator=generator)
    with assert_no_side_effects(gm, *inputs):
        propagate(gm, *inputs, **options)
    observed = run_real(gm, *real_inputs)
    if check_device is None:
        check_device = _all_devices_real(inputs)
    mismatches = compare_nodes(gm, observed, check_strides=check_strides, check_device=check_device)
    if mismatches:
        raise AssertionError(render_mismatches(mismatches))


def check_rule(target: Any, *sample_args: Any, check_strides: bool = True, **kwargs: Any) -> Any:
    """Assert that fxprop's rule for ``target`` matches real execution on these arguments.

    ``sample_args``/``kwargs`` are what the op is called with: real tensors (propagated as
    given, run on clones), `TensorSpec`, fake or meta tensors (run on random data), and any
    other values. Returns fxprop's result (FakeTensors).

    When real execution raises, fxprop must raise a `PropagationError` carrying the same
    exception type (``error.error_type``), and that error is re-raised for the caller to check
    (``pytest.raises(fxprop.PropagationError)``). The assertion fails when only one of the two
    raises, when the types differ, and when fxprop fails on its own (`InternalError`,
    `UnsupportedError`): fxprop's failure is never the model's error.

    >>> import torch
    >>> out = check_rule(torch.ops.aten.cat.default, [TensorSpec((2, 3)), TensorSpec((4, 3))], 0)
    >>> tuple(out.shape)
    (6, 3)
    """
    gm, tensors = call_graph(target, sample_args, kwargs)
    real_inputs = real_value(tensors, generator=torch.Generator().manual_seed(0))
    label = target_name(target)
    try:
        observed = run_real(gm, *real_inputs)
    except Exception as real_error:
        real = f"{type(real_error).__name__}: {_first_line(real_error)}"
        try:
            propagate(gm, *tensors)
        except PropagationError as error:
            if error.refuses_like(real_error):
                raise
            raise AssertionError(f"{label}: real execution raised {real}, but fxprop refused with "
                                 f"{error.error_type.__name__}: {error}") from error
        except FxpropError as error:
            raise AssertionError(f"{label}: real execution raised {real}, but fxprop failed on its own: "
                                 f"{error}") from error
        raise AssertionError(f"{label}: real execution raised {real}, but fxprop propagated a result") from real_error
    try:
        result = propagate(gm, *tensors)
    except FxpropError as error:
        raise AssertionError(f"{label}: real execution succeeded, but fxprop raised: {error}") from error
    mismatches = compare_nodes(gm, observed, check_strides=check_strides, check_device=_all_devices_real(tensors))
    if mismatches:
        raise AssertionError(render_mismatches(mismatches))
    return result


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _all_devices_real(inputs: Any) -> bool:
    devices: list[torch.device] = []
    map_structure(lambda t: devices.append(t.device), list(inputs))
    devices += [i.device for i in inputs if isinstance(i, TensorSpec)]
    return all(d.type == "cpu" or _device_available(d) for d in devices)


@dataclass
class RealRun:
    """What `run_real_until_error` saw: every node's metadata up to the node that raised, if any."""
    values: dict[str, Any]
    failed_node: str | None = None
    error: BaseException | None = None


def run_real_until_error(gm: torch.fx.GraphModule, *real_inputs: Any) -> RealRun:
    """Like `run_real`, but a node that raises ends the run instead of the test: the run names it."""
    recorder = _Recorder(copy.deepcopy(gm))
    try:
        recorder.run(*real_inputs)
    except Exception as error:
        failed = next((n.name for n in recorder.graph.nodes if n.name not in recorder.values), None)
        return RealRun(recorder.values, failed, error)
    return RealRun(recorder.values)


@contextlib.contextmanager
def assert_no_side_effects(gm: torch.nn.Module, *inputs: Any):
    """Assert that the block leaves ``gm`` and ``inputs`` exactly as they were.

    Checked on exit: parameters, buffers and tensor constants bit for bit (and their version
    counters, strides, ``requires_grad``, ``.grad``); every input tensor the same way, with no
    autograd history attached; torch's global RNG state (CPU, and CUDA when initialized);
    grad mode; the graph's code.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 2))
    >>> with assert_no_side_effects(gm, TensorSpec((3, 4))):
    ...     _ = propagate(gm, TensorSpec((3, 4)))
    """
    before = _SideEffectSnapshot.take(gm, inputs)
    yield
    problems = before.differences(_SideEffectSnapshot.take(gm, inputs))
    if problems:
        raise AssertionError("side effects on the caller's state:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass
class _TensorState:
    tensor: torch.Tensor
    bits: bytes | None
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    requires_grad: bool
    version: int
    grad_fn: Any
    grad: Any
    cls: type

    @staticmethod
    def of(tensor: torch.Tensor) -> "_TensorState":
        if isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
            # A lazy module's parameter before its first call: no data or metadata to read yet, so
            # its class (materializing turns it into a Parameter) and its placeholder shape stand for it.
            return _TensorState(tensor, None, "uninitialized", None, None, None, None, None, None, type(tensor))
        bits = None
        if tensor.device.type != "meta" and not isinstance(tensor, FakeTensor) and tensor.layout is torch.strided:
            with torch.no_grad():
                bits = bytes(tensor.detach().cpu().clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8).clone().untyped_storage())
        return _TensorState(tensor, bits, tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.requires_grad,
                            version_counter(tensor), tensor.grad_fn, tensor.grad if tensor.is_leaf else None,
                            type(tensor))

    def differences(self, after: "_TensorState", where: str) -> list[str]:
        fields = ("cls", "bits", "shape", "stride", "dtype", "requires_grad", "version", "grad_fn", "grad")
        return [f"{where}: {name} changed" + ("" if name == "bits" else f" ({getattr(self, name)!r} -> {getattr(after, name)!r})")
                for name in fields if not _same(getattr(self, name), getattr(after, name))]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or callable(a) or callable(b):
        return a is b
    return a == b


@dataclass
class _SideEffectSnapshot:
    tensors: dict[str, _TensorState]
    rng: torch.Tensor
    cuda_rng: list | None
    code: str | None
    grad_enabled: bool

    @staticmethod
    def take(gm: torch.nn.Module, inputs: tuple) -> "_SideEffectSnapshot":
        tensors: dict[str, _TensorState] = {}
        for name, tensor in gm.named_parameters(remove_duplicate=False):
            tensors[f"parameter {name}"] = _TensorState.of(tensor)
        for name, tensor in gm.named_buffers(remove_duplicate=False):
            tensors[f"buffer {name}"] = _TensorState.of(tensor)
        for prefix, module in gm.named_modules():
            for key, item in vars(module).items():
                if isinstance(item, torch.Tensor):
                    tensors[f"constant {prefix + '.' if prefix else ''}{key}"] = _TensorState.of(item)
        leaves = []
        map_structure(leaves.append, list(inputs))
        for i, tensor in enumerate(leaves):
            tensors[f"input tensor {i}"] = _TensorState.of(tensor)
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        code = gm.code if isinstance(gm, torch.fx.GraphModule) else None
        return _SideEffectSnapshot(tensors, torch.get_rng_state(), cuda_rng, code, torch.is_grad_enabled())

    def differences(self, after: "_SideEffectSnapshot") -> list[str]:
        problems = []
        for where, state in self.tensors.items():
            now = after.tensors.get(where)
            if now is None or now.tensor is not state.tensor:
                problems.append(f"{where}: replaced or removed")
            else:
                problems += state.differences(now, where)
        problems += [f"{where}: added" for where in after.tensors if where not in self.tensors]
        if not torch.equal(self.rng, after.rng):
            problems.append("torch's CPU RNG state changed")
        if self.cuda_rng is not None and (after.cuda_rng is None or any(
                not torch.equal(a, b) for a, b in zip(self.cuda_rng, after.cuda_rng))):
            problems.append("torch's CUDA RNG state changed")
        if self.code != after.code:
            problems.append("the graph's code changed")
        if self.grad_enabled != after.grad_enabled:
            problems.append(f"grad mode changed ({self.grad_enabled} -> {after.grad_enabled})")
        return problems
