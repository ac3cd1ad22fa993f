"""`TensorSpec`: a tensor described by its metadata alone, and the conversion of user inputs.

Every input becomes a fresh meta tensor tagged with its logical device. Real input data is
never copied; the user's tensors are only read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from ..torch_compat import FakeTensor, is_opaque

from .. import symbolic
from ..devices import device_of, normalize_device, tag
from ..errors import InputError
from .known_values import KnownValues
from ..distributed.dtensors import dtensor_from_spec, internal_dtensor, is_dtensor


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
        raise InputError(f"unknown dtype {dtype!r}: expected a torch dtype name such as 'float32' or 'int64'")
    raise InputError(f"expected a torch.dtype or a dtype name, got {type(dtype).__name__}: {dtype!r}")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor known only by its metadata.

    >>> TensorSpec((8, 512), dtype=torch.int64, device="cuda:0")
    TensorSpec(shape=(8, 512), dtype=torch.int64, device=device(type='cuda', index=0), stride=None, requires_grad=False, mesh=None, placements=None)

    With ``mesh`` (a `DeviceMesh`) and ``placements`` (one per mesh dim: ``Shard(0)``,
    ``Replicate()``...), it is a DTensor of global ``shape`` whose local tensor is this rank's
    shard, as ``distribute_tensor`` would cut it (see docs/guides/distributed.md); its device is
    the mesh's device type, whatever ``device`` says.

    Dims may be symbolic: a string ("B", "2*T") or a sympy symbol or expression. The same
    name is the same size everywhere, and sizes are positive integers unless the sympy symbol
    is declared ``integer=True, nonnegative=True``; a symbol declared with assumptions must be
    declared an integer (see docs/concepts/symbolic.md).
    """
    shape: Sequence[int | str | Any]
    dtype: torch.dtype | str = torch.float32
    device: torch.device | str = "cpu"
    stride: Sequence[int] | None = None
    requires_grad: bool = False
    mesh: Any = None
    placements: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shape, (int, str)) or not isinstance(self.shape, Sequence):
            raise InputError(f"TensorSpec shape must be a sequence of dims, got {self.shape!r}")
        shape = tuple(self.shape)
        for dim in shape:
            _check_dim(dim, shape)
        object.__setattr__(self, "shape", shape)
        concrete = [dim for dim in shape if type(dim) is int]
        if math.prod(concrete) > _MAX_NUMEL and all(concrete):
            raise InputError(f"TensorSpec shape {shape} has more elements than an int64 can count")
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        if self.dtype in _UNSUPPORTED_DTYPES:
            raise InputError(f"TensorSpec dtype {self.dtype} is not supported: quantized and bit-packed tensors "
                             "have no meta kernels to propagate them")
        if self.mesh is not None and self.placements is not None:
            object.__setattr__(self, "placements", _checked_placements(self.mesh, self.placements, len(shape)))
        object.__setattr__(self, "device", normalize_device(self.device if self.mesh is None else self.mesh.device_type))
        if self.stride is not None:
            stride = tuple(self.stride)
            if len(stride) != len(shape) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in stride):
                raise InputError(f"TensorSpec stride {self.stride!r} must hold one non-negative int per dim of shape {shape}")
            object.__setattr__(self, "stride", stride)
        if not isinstance(self.requires_grad, bool):
            raise InputError(f"TensorSpec requires_grad must be a bool, got {self.requires_grad!r}")
        if self.requires_grad and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise InputError(f"only floating point and complex tensors can require gradients, got {self.dtype}")
        if (self.mesh is None) != (self.placements is None):
            raise InputError("TensorSpec: mesh and placements go together (a DTensor), got "
                             f"{'a mesh without placements' if self.placements is None else 'placements without a mesh'}")
        if self.mesh is not None:
            placements = tuple(self.placements)
            if len(placements) != self.mesh.ndim:
                raise InputError(f"TensorSpec: one placement per mesh dim, got {len(placements)} placements "
                                 f"for a mesh of shape {tuple(self.mesh.shape)}")
            if self.stride is not None or not all(type(dim) is int for dim in shape):
                raise InputError("TensorSpec: a DTensor spec takes concrete sizes and contiguous strides")
            object.__setattr__(self, "placements", placements)

    def to_meta(self) -> torch.Tensor:
        if self.mesh is not None:
            return dtensor_from_spec(self.mesh, self.placements, self.shape, self.dtype, self.requires_grad)
        if not all(type(dim) is int for dim in self.shape):
            meta = symbolic.spec_to_meta(self.shape, self.stride, self.dtype)
            meta.requires_grad_(self.requires_grad)
            return tag(meta, self.device)
        stride = self.stride if self.stride is not None else symbolic.contiguous_strides(self.shape)
        meta = torch.empty_strided(self.shape, stride, dtype=self.dtype, device="meta")
        meta.requires_grad_(self.requires_grad)
        return tag(meta, self.device)


_MAX_NUMEL = (1 << 63) - 1


def _checked_placements(mesh: Any, placements: Any, ndim: int) -> tuple:
    """A DTensor spec's placements, as torch's `Placement`s with shard dims normalized as
    ``DTensor.from_local`` normalizes them; InputError for a mesh or placements torch would not take."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement, Shard
    if not isinstance(mesh, DeviceMesh):
        raise InputError(f"TensorSpec mesh must be a DeviceMesh, got {type(mesh).__name__}: {mesh!r}")
    if isinstance(placements, (Placement, str)) or not isinstance(placements, Sequence):
        raise InputError(f"TensorSpec placements must be a sequence of placements, one per mesh dim, got {placements!r}")
    checked = []
    for placement in placements:
        if not isinstance(placement, Placement):
            raise InputError(f"TensorSpec placements must be torch Placements (Shard(0), Replicate(), Partial()), "
                             f"got {placement!r}")
        if isinstance(placement, Shard):
            if not -ndim <= placement.dim < ndim:
                raise InputError(f"TensorSpec placement {placement!r}: dim out of range for a tensor of {ndim} dims")
            if placement.dim < 0 and type(placement) is Shard:
                placement = Shard(placement.dim + ndim)
        checked.append(placement)
    return tuple(checked)
_UNSUPPORTED_DTYPES = {dtype for name, dtype in vars(torch).items() if isinstance(dtype, torch.dtype)
                       and name.startswith(("quint", "qint", "bits"))}


def _check_dim(dim: Any, shape: tuple) -> None:
    if symbolic.is_symbolic_dim(dim):
        return symbolic.check_dim(dim, shape)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise InputError(f"TensorSpec dims must be non-negative ints, got {dim!r} in shape {shape}")
    if dim < 0:
        raise InputError(f"TensorSpec dims must be non-negative, got {dim} in shape {shape}")
    if dim > _MAX_NUMEL:
        raise InputError(f"TensorSpec dim {dim} does not fit in an int64, in shape {shape}")


def traced_example(placeholder: torch.fx.Node, value: Any) -> Any:
    """The input a placeholder stands for. A graph from torch.compile with ``dynamic=True`` is
    handed real tensors whose placeholders were traced with symbolic sizes (``example_value``,
    FakeTensors of dynamo's ShapeEnv): the traced sizes are the ones the graph is valid for,
    so they are propagated, as long as the real tensor is one of their instances.

    A TensorSpec with symbolic dims for a placeholder torch.export traced (``meta["val"]``, a
    FakeTensor of export's ShapeEnv, not one of fxprop's own) is computed in that ShapeEnv, its
    names bound to the traced symbols (`SymbolicSession.bind_traced`)."""
    if isinstance(value, TensorSpec) and any(type(dim) is not int for dim in value.shape):
        exported = placeholder.meta.get("val")
        if isinstance(exported, FakeTensor) and symbolic.is_callers_env(exported.fake_mode.shape_env):
            symbolic.current().bind_traced(tuple(value.shape), exported)
        return value
    traced = placeholder.meta.get("example_value")
    if not (isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and isinstance(traced, FakeTensor)):
        return value
    sizes = (*traced.shape, *traced.stride())
    if not any(isinstance(size, torch.SymInt) for size in sizes) or traced.dtype != value.dtype:
        return value
    hints = tuple(size.node.hint if isinstance(size, torch.SymInt) else size for size in sizes)
    if hints != (*value.shape, *value.stride()):
        return value
    return traced


def _is_symbolic_spec(value: Any) -> bool:
    from .inputs import TensorSpec
    return isinstance(value, TensorSpec) and any(type(dim) is not int for dim in value.shape)


def meta_like(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fresh meta tensor with ``tensor``'s metadata, tagged with ``device``. A tensor that
    requires grad and is not a leaf (the output of an earlier op) stays a non-leaf, since
    autograd treats the two differently (an in-place op on a leaf that requires grad raises)."""
    offset = tensor.storage_offset()
    if tensor.requires_grad and not tensor.is_leaf:
        extent = offset + 1 + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if s)
        leaf = torch.empty(extent, dtype=tensor.dtype, device="meta", requires_grad=True)
        with torch.enable_grad():
            meta = leaf.clone().as_strided(tensor.shape, tensor.stride(), offset)
    elif offset:
        extent = offset + 1 + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if s)
        meta = torch.empty(extent, dtype=tensor.dtype, device="meta").as_strided(tensor.shape, tensor.stride(), offset)
    else:
        meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    if tensor.requires_grad and meta.is_leaf:
        meta.requires_grad_(True)
    return tag(meta, device)


_SCALARS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def values_worth_knowing(value: torch.Tensor) -> bool:
    """Whether fxprop keeps a real tensor's values: indices, counts and python numbers wrapped as
    tensors (integer tensors up to 65536 elements, and 0-dim ones), which rules and ``.item()`` read."""
    return value.device.type != "meta" and (value.dim() == 0 or (
        not (value.dtype.is_floating_point or value.dtype.is_complex) and value.numel() <= 1 << 16))


def to_internal(value: Any, where: str, real_values: KnownValues) -> Any:
    """Turn one user input (possibly nested) into fxprop's internal form."""
    if isinstance(value, TensorSpec):
        return value.to_meta()
    if isinstance(value, FakeTensor):
        symbolic_sizes = [s for s in (*value.shape, *value.stride(), value.storage_offset())
                          if isinstance(s, torch.SymInt)]
        if symbolic_sizes:
            symbolic.current().adopt_env(symbolic_sizes[0].node.shape_env, value.fake_mode)
        return meta_like(value, normalize_device(value.device))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        symbolic.current().adopt_env(value.node.shape_env)
        return value
    if isinstance(value, torch.Tensor):
        if is_dtensor(value):
            return internal_dtensor(value, meta_like)
        if value.is_nested:
            raise InputError(f"{where}: nested tensors are not supported (their sizes vary per component)")
        if value.layout is not torch.strided:
            raise InputError(f"{where}: only strided tensors are supported, got layout {value.layout}")
        if value.is_quantized or value.dtype in _UNSUPPORTED_DTYPES:
            raise InputError(f"{where}: {value.dtype} tensors are not supported: quantized and bit-packed "
                             "tensors have no meta kernels to propagate them")
        meta = meta_like(value, value.device)
        if values_worth_knowing(value):
            real_values.remember(meta, value)
        return meta
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, torch.Size):
        return value
    if is_opaque(value):
        return value  # a DeviceMesh, a ProcessGroup, a script object: passed whole to the ops that take it
    if isinstance(value, (list, tuple)):
        converted = [to_internal(item, f"{where}[{i}]", real_values) for i, item in enumerate(value)]
        if isinstance(value, list):
            return converted
        return type(value)(*converted) if hasattr(value, "_fields") else tuple(converted)
    if isinstance(value, dict):
        return {key: to_internal(item, f"{where}[{key!r}]", real_values) for key, item in value.items()}
    raise InputError(
        f"{where}: unsupported input type {type(value).__module__}.{type(value).__qualname__}; expected a "
        "torch.Tensor (real, meta or fake), fxprop.TensorSpec, a python scalar, an opaque object (a script "
        "object, a DeviceMesh), or a tuple/list/dict of those"
        + (" (convert an array with torch.from_numpy)" if type(value).__module__ == "numpy" else ""))


__all__ = ["TensorSpec", "device_of", "meta_like", "parse_dtype", "to_internal"]
