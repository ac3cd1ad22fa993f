"""Prove that fxprop's annotations match real execution.

`assert_matches_real` propagates a graph, runs a copy of it for real, and compares every
node; `check_rule` does the same for one op. Both raise `AssertionError` with a per-node diff.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from .containers import map_structure
from .engine import propagate
from .specs import TensorSpec


@dataclass(frozen=True)
class Mismatch:
    node: str
    op: str
    field: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        return f"%{self.node} ({self.op}): {self.field} expected {self.expected}, got {self.got}"


def real_value(value: Any, *, generator: torch.Generator | None = None) -> Any:
    """A real tensor standing in for a spec, a fake or a meta tensor; real tensors are cloned."""
    def make(shape, stride, dtype, device, requires_grad):
        device = torch.device(device)
        if device.type not in ("cpu", "meta") and not _device_available(device):
            device = torch.device("cpu")
        if device.type == "meta":
            device = torch.device("cpu")
        base = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        if dtype.is_floating_point or dtype.is_complex:
            base.copy_(torch.randn(shape, generator=generator).to(dtype))
        elif dtype == torch.bool:
            base.copy_(torch.randint(0, 2, shape, generator=generator).bool())
        else:
            base.copy_(torch.randint(0, 2, shape, generator=generator).to(dtype))
        return base.requires_grad_(requires_grad)

    if isinstance(value, TensorSpec):
        stride = value.stride or torch.empty(value.shape, device="meta").stride()
        return make(value.shape, stride, value.dtype, value.device, value.requires_grad)
    if isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.device.type == "meta"):
        return make(value.shape, value.stride(), value.dtype, value.device, value.requires_grad)
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.preserve_format).requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(real_value(v, generator=generator) for v in value)
    if isinstance(value, dict):
        return {k: real_value(v, generator=generator) for k, v in value.items()}
    return value


def _device_available(device: torch.device) -> bool:
    module = getattr(torch, device.type, None)
    return bool(module and hasattr(module, "is_available") and module.is_available())


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, node):
        result = super().run_node(node)
        self.values[node.name] = map_structure(lambda t: _Observed.of(t), result)
        return result


@dataclass(frozen=True)
class _Observed:
    shape: tuple
    dtype: torch.dtype
    stride: tuple
    device: torch.device
    requires_grad: bool

    @staticmethod
    def of(tensor: torch.Tensor) -> "_Observed":
        return _Observed(tuple(tensor.shape), tensor.dtype, tensor.stride(), tensor.device, tensor.requires_grad)


def compare_nodes(gm: torch.fx.GraphModule, observed: dict[str, Any], *, check_strides: bool = True,
                  check_device: bool = True) -> list[Mismatch]:
    mismatches: list[Mismatch] = []
    for node in gm.graph.nodes:
        if node.op == "output" or node.name not in observed:
            continue
        _compare(node, node.meta.get("val"), observed[node.name], mismatches, check_strides, check_device, "")
    return mismatches


def _compare(node, got, expected, out: list, check_strides: bool, check_device: bool, path: str) -> None:
    op = f"{node.op} {node.target}" if node.op != "call_function" else f"{getattr(node.target, '__name__', node.target)}"
    if isinstance(expected, _Observed):
        if not isinstance(got, torch.Tensor):
            out.append(Mismatch(node.name, op, f"value{path}", "a tensor", type(got).__name__))
            return
        checks = [("shape", expected.shape, tuple(got.shape)), ("dtype", expected.dtype, got.dtype),
                  ("requires_grad", expected.requires_grad, got.requires_grad)]
        if check_strides and _strides_matter(expected):
            checks.append(("stride", expected.stride, got.stride()))
        if check_device:
            checks.append(("device", expected.device, got.device))
        for field, want, have in checks:
            if want != have:
                out.append(Mismatch(node.name, op, f"{field}{path}", want, have))
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            out.append(Mismatch(node.name, op, f"structure{path}", _shape_of(expected), _shape_of(got)))
            return
        for i, (e, g) in enumerate(zip(expected, got)):
            _compare(node, g, e, out, check_strides, check_device, f"{path}[{i}]")
        return
    if isinstance(expected, (int, float, bool, torch.Size, torch.dtype, torch.device, str, type(None))):
        if type(expected) is not type(got) and not (isinstance(expected, torch.Size) and isinstance(got, tuple)):
            out.append(Mismatch(node.name, op, f"value{path}", repr(expected), repr(got)))
        elif expected != got and not (isinstance(expected, float) and expected != expected):
            out.append(Mismatch(node.name, op, f"value{path}", repr(expected), repr(got)))


def _strides_matter(observed: _Observed) -> bool:
    return all(size > 0 for size in observed.shape)


def _shape_of(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


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
    """
    generator = torch.Generator().manual_seed(0)
    real_inputs = real_value(inputs, generator=generator)
    propagate(gm, *inputs, **options)
    observed = run_real(gm, *real_inputs)
    if check_device is None:
        check_device = _all_devices_real(inputs)
    mismatches = compare_nodes(gm, observed, check_strides=check_strides, check_device=check_device)
    if mismatches:
        raise AssertionError("fxprop disagrees with real execution on "
                             f"{len(mismatches)} value(s):\n" + "\n".join(f"  {m}" for m in mismatches))


def _all_devices_real(inputs: Any) -> bool:
    devices = []
    map_structure(lambda t: devices.append(t.device), [i for i in inputs if isinstance(i, torch.Tensor)])
    devices += [i.device for i in inputs if isinstance(i, TensorSpec)]
    return all(d.type == "cpu" or _device_available(d) for d in devices)
