"""Property-based fuzzing: random FX graphs, propagated and compared with real execution.

Hypothesis builds a graph op by op from a pool of ~140 ops (elementwise, broadcasting, views,
reductions, matmul/linear/conv, indexing, cat/stack/split, casts, factories, a few in-place
methods), on inputs of random shape, dtype, strides and storage offset, and with arguments
that are sometimes invalid. Each op is run for real while the graph is built, so later ops
see the real shapes; the first op that raises ends the graph. Then, for every graph:

- fxprop matches real execution on every node (`fxprop.testing.compare_nodes`), or
- fxprop raises `PropagationError` at the node where real execution raised, with the same
  exception type (`PropagationError.error_type`);
- nothing else: no other exception, no hang, no change to the graph, the module, the inputs
  or the RNG (`fxprop.testing.assert_no_side_effects`).

The CI slice is derandomized. The long campaign (see docs/reliability.md, "Fuzz commands")::

    FXPROP_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest -q tests/test_fuzz.py -k random_graphs \\
        -p no:cacheprovider --hypothesis-seed=1
    .venv/bin/python tools/fuzz_campaign.py --minutes 30
"""
from __future__ import annotations

import copy
import math
import operator
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import sympy
import torch
import torch.fx
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import fxprop
from fxprop.testing import Observed, assert_no_side_effects, compare_nodes, render_mismatches, run_real_until_error

EXAMPLES = int(os.environ.get("FXPROP_FUZZ_EXAMPLES", "0"))
CAMPAIGN = EXAMPLES > 0
MAX_SECONDS_PER_GRAPH = 60.0  # CPU seconds for one propagate of a graph of <= 12 small nodes

DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SCALARS = [0, 1, 2, -3, 0.5, -1.5, True, False, math.inf, -math.inf, math.nan, 1e30]
LAYOUTS = ["contiguous", "contiguous", "permuted", "padded", "offset", "broadcast", "channels_last"]


# --- inputs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputRecipe:
    """One graph input: fresh identical copies can be made for fxprop, the builder and the real run."""
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    requires_grad: bool
    as_spec: bool
    seed: int

    def make(self) -> torch.Tensor:
        extent = self.offset + 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride) if s)
        generator = torch.Generator().manual_seed(self.seed)
        if self.dtype.is_floating_point or self.dtype.is_complex:
            base = torch.randn(extent, generator=generator).to(self.dtype)
        elif self.dtype == torch.bool:
            base = torch.randint(0, 2, (extent,), generator=generator).bool()
        else:  # never zero, so that integer division by an input is defined
            base = torch.randint(1, 4, (extent,), generator=generator).to(self.dtype)
        return base.as_strided(self.shape, self.stride, self.offset).detach().requires_grad_(self.requires_grad)

    def for_fxprop(self) -> Any:
        if self.as_spec:
            return fxprop.TensorSpec(self.shape, self.dtype, stride=self.stride, requires_grad=self.requires_grad)
        return self.make()


def contiguous_strides(shape) -> tuple:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


@st.composite
def input_recipes(draw, seed: int) -> InputRecipe:
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 0, 5]), min_size=ndim, max_size=ndim)))
    layout = draw(st.sampled_from(LAYOUTS))
    stride, offset = contiguous_strides(shape), 0
    if layout == "permuted" and ndim >= 2:
        order = draw(st.permutations(range(ndim)))
        inner = contiguous_strides([shape[d] for d in order])
        stride = tuple(inner[order.index(d)] for d in range(ndim))
    elif layout == "padded" and ndim >= 1:
        stride = tuple(s * 2 for s in contiguous_strides(shape[:-1] + (shape[-1],)))
    elif layout == "offset":
        offset = draw(st.integers(1, 3))
    elif layout == "broadcast" and ndim >= 1:
        dim = draw(st.integers(0, ndim - 1))
        stride = stride[:dim] + (0,) + stride[dim + 1:]
    elif layout == "channels_last" and ndim == 4:
        n, c, h, w = shape
        stride = (h * w * c, 1, w * c, c)
    dtype = draw(st.sampled_from(DTYPES))
    requires_grad = (dtype.is_floating_point or dtype.is_complex) and draw(st.booleans())
    as_spec = offset == 0 and draw(st.integers(0, 3)) == 0
    return InputRecipe(shape, stride, offset, dtype, requires_grad, as_spec, seed)


# --- the graph builder -------------------------------------------------------------------

class Builder:
    """Builds a graph op by op, running each op for real so later draws see real shapes."""

    def __init__(self, draw: Callable, recipes: list[InputRecipe]):
        self.draw = draw
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()  # owns the submodules and parameters the graph reaches
        self.real: dict[torch.fx.Node, Any] = {}
        self.tensors: list[torch.fx.Node] = []
        self.ints: list[torch.fx.Node] = []
        self.failed: torch.fx.Node | None = None
        self.attributes: dict[str, torch.Tensor] = {}  # the builder's copies of the root's tensors
        for i, recipe in enumerate(recipes):
            node = self.graph.placeholder(f"x{i}")
            self.add(node, recipe.make())

    def add(self, node: torch.fx.Node, value: Any) -> None:
        self.real[node] = value
        if isinstance(value, torch.Tensor):
            self.tensors.append(node)
        elif isinstance(value, int) and not isinstance(value, bool):
            self.ints.append(node)

    # draws --------------------------------------------------------------------------------

    def tensor(self, floating: bool = False) -> torch.fx.Node:
        choices = self.tensors
        if floating:
            choices = [n for n in self.tensors if self.real[n].dtype.is_floating_point] or self.tensors
        return self.draw(st.sampled_from(choices))

    def value(self, node: torch.fx.Node) -> Any:
        return self.real[node]

    def dim(self, node: torch.fx.Node) -> int:
        ndim = max(self.value(node).dim(), 1)
        if self.draw(st.integers(0, 15)) == 0:  # sometimes out of range
            return self.draw(st.sampled_from([ndim, -ndim - 1, ndim + 2]))
        return self.draw(st.integers(-ndim, ndim - 1))

    def size(self) -> int:
        return self.draw(st.sampled_from([0, 1, 2, 3, 4]))

    def scalar(self) -> Any:
        return self.draw(st.sampled_from(SCALARS))

    def dtype(self) -> torch.dtype:
        return self.draw(st.sampled_from(DTYPES))

    def operand(self, node: torch.fx.Node) -> Any:
        """A second operand for a binary op: a broadcastable tensor, any tensor, or a scalar."""
        kind = self.draw(st.integers(0, 5))
        if kind <= 2:
            return self.tensor()
        if kind == 3:
            shape = tuple(self.value(node).shape)
            trimmed = shape[self.draw(st.integers(0, len(shape))):]
            keep_ones = tuple(1 if self.draw(st.booleans()) else s for s in trimmed)
            return self.call("call_function", torch.ones, (keep_ones,), {"dtype": self.value(node).dtype})
        return self.scalar()

    def new_shape(self, node: torch.fx.Node) -> tuple:
        shape = list(self.value(node).shape)
        numel = self.value(node).numel()
        options = [(-1,), (numel,), tuple(reversed(shape)), (1, *shape), (-1, shape[-1] if shape else 1),
                   (2, -1), tuple(self.draw(st.lists(st.integers(-1, 4), max_size=3)))]
        if self.ints:
            options.append((self.draw(st.sampled_from(self.ints)), -1))
        return self.draw(st.sampled_from(options))

    # graph --------------------------------------------------------------------------------

    def call(self, kind: str, target: Any, args: tuple, kwargs: dict | None = None) -> torch.fx.Node | None:
        """Add a node and run it for real; a node that raises is dropped, or kept to end the graph."""
        if self.failed is not None:
            return None
        kwargs = kwargs or {}
        node = self.graph.create_node(kind, target, args, kwargs)
        real_args = torch.fx.node.map_arg(args, self.value)
        real_kwargs = torch.fx.node.map_arg(kwargs, self.value)
        try:
            if kind == "call_method":
                value = getattr(real_args[0], target)(*real_args[1:], **real_kwargs)
            elif kind == "call_module":
                value = self.root.get_submodule(target)(*real_args, **real_kwargs)
            elif kind == "get_attr":
                value = self.attribute(target)
            else:
                value = target(*real_args, **real_kwargs)
        except Exception:
            if self.draw(st.integers(0, 3)) > 0:  # mostly drop the invalid op and build on, so graphs grow deep
                self.graph.erase_node(node)
                return None
            self.failed = node
            return node
        self.add(node, value)
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            index = self.draw(st.integers(-len(value), len(value) - 1))
            self.call("call_function", operator.getitem, (node, index))
        return node

    def attribute(self, name: str) -> torch.Tensor:
        """The builder's own copy of one of the root's tensors, the same copy every time: an op run
        while building (an in-place add of an input that requires grad) must leave the root as the
        graph will find it."""
        if name not in self.attributes:
            original = getattr(self.root, name)
            copied = original.detach().clone()
            if isinstance(original, torch.nn.Parameter):
                copied = torch.nn.Parameter(copied, requires_grad=original.requires_grad)
            self.attributes[name] = copied
        return self.attributes[name]

    def fn(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node | None:
        return self.call("call_function", target, args, kwargs)

    def method(self, name: str, *args: Any, **kwargs: Any) -> torch.fx.Node | None:
        return self.call("call_method", name, args, kwargs)


# --- the op pool -------------------------------------------------------------------------

OPS: dict[str, Callable[[Builder], Any]] = {}


def op(*names: str):
    def register(make: Callable[[Builder], Any]):
        for name in names:
            assert name not in OPS, name
            OPS[name] = make
        return make
    return register


UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "sign": torch.sign,
    "reciprocal": torch.reciprocal, "erf": torch.erf, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not, "isnan": torch.isnan, "square": torch.square, "gelu": F.gelu,
    "silu": F.silu, "softplus": F.softplus, "trunc": torch.trunc, "frac": torch.frac, "angle": torch.angle,
    "nan_to_num": torch.nan_to_num, "signbit": torch.signbit, "real": torch.real,
}
for _name, _target in UNARY.items():
    OPS[_name] = (lambda target: lambda b: b.fn(target, b.tensor()))(_target)

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum, "pow": torch.pow, "atan2": torch.atan2, "eq": torch.eq, "lt": torch.lt,
    "ge": torch.ge, "logical_and": torch.logical_and, "bitwise_and": torch.bitwise_and, "hypot": torch.hypot,
    "op_add": operator.add, "op_mul": operator.mul, "op_truediv": operator.truediv, "op_matmul": operator.matmul,
}
for _name, _target in BINARY.items():
    OPS[_name] = (lambda target: lambda b: (lambda x: b.fn(target, x, b.operand(x)))(b.tensor()))(_target)


@op("add_alpha")
def _add_alpha(b):
    x = b.tensor()
    return b.fn(torch.add, x, b.operand(x), alpha=b.scalar())


@op("where")
def _where(b):
    x = b.tensor()
    cond = b.fn(torch.gt, x, 0) if b.draw(st.booleans()) else b.tensor()
    return b.fn(torch.where, cond, x, b.operand(x))


@op("masked_fill")
def _masked_fill(b):
    x = b.tensor()
    mask = b.fn(torch.lt, x, 0) if b.draw(st.booleans()) else b.tensor()
    return b.method("masked_fill", x, mask, b.scalar())


@op("clamp")
def _clamp(b):
    return b.fn(torch.clamp, b.tensor(), min=b.scalar(), max=b.draw(st.sampled_from([None, 1, 2.5])))


@op("leaky_relu")
def _leaky(b):
    return b.fn(F.leaky_relu, b.tensor(), b.scalar())


@op("lerp")
def _lerp(b):
    x = b.tensor()
    return b.fn(torch.lerp, x, b.operand(x), 0.25)


@op("addcmul")
def _addcmul(b):
    x = b.tensor()
    return b.fn(torch.addcmul, x, b.operand(x), b.operand(x), value=0.5)


# views and reshapes

@op("view")
def _view(b):
    x = b.tensor()
    return b.method("view", x, b.new_shape(x))


@op("reshape")
def _reshape(b):
    x = b.tensor()
    return b.fn(torch.reshape, x, b.new_shape(x))


@op("flatten")
def _flatten(b):
    x = b.tensor()
    return b.fn(torch.flatten, x, b.dim(x), b.draw(st.sampled_from([-1, 1])))


@op("unsqueeze")
def _unsqueeze(b):
    x = b.tensor()
    return b.method("unsqueeze", x, b.draw(st.integers(-b.value(x).dim() - 2, b.value(x).dim() + 1)))


@op("squeeze")
def _squeeze(b):
    x = b.tensor()
    return b.fn(torch.squeeze, x, b.dim(x)) if b.draw(st.booleans()) else b.fn(torch.squeeze, x)


@op("permute")
def _permute(b):
    x = b.tensor()
    ndim = b.value(x).dim()
    order = list(b.draw(st.permutations(range(ndim))))
    if b.draw(st.integers(0, 9)) == 0:
        order = order[:-1] if order else [0]
    return b.method("permute", x, *order)


@op("transpose")
def _transpose(b):
    x = b.tensor()
    return b.fn(torch.transpose, x, b.dim(x), b.dim(x))


@op("t")
def _t(b):
    return b.method("t", b.tensor())


@op("expand")
def _expand(b):
    x = b.tensor()
    shape = tuple(b.value(x).shape)
    target = tuple(b.draw(st.sampled_from([s, -1, 3])) if s == 1 else b.draw(st.sampled_from([s, -1, s, 2]))
                   for s in shape)
    return b.method("expand", x, *(b.draw(st.sampled_from([(), (2,)])) + target))


@op("contiguous")
def _contiguous(b):
    return b.method("contiguous", b.tensor())


@op("narrow")
def _narrow(b):
    x = b.tensor()
    return b.fn(torch.narrow, x, b.dim(x), b.draw(st.integers(0, 2)), b.draw(st.integers(0, 2)))


@op("select")
def _select(b):
    x = b.tensor()
    return b.fn(torch.select, x, b.dim(x), b.draw(st.integers(-2, 2)))


@op("getitem_slices")
def _getitem(b):
    x = b.tensor()
    item = b.draw(st.sampled_from([
        (slice(None), 0), (slice(1, None),), (slice(None, None, 2),), (Ellipsis, None), (None, slice(0, 1)),
        (Ellipsis, -1), (0,), (slice(None), slice(None, None, -1))]))
    return b.fn(operator.getitem, x, item)


@op("movedim")
def _movedim(b):
    x = b.tensor()
    return b.fn(torch.movedim, x, b.dim(x), b.dim(x))


@op("unflatten")
def _unflatten(b):
    x = b.tensor()
    return b.fn(torch.unflatten, x, b.dim(x), b.draw(st.sampled_from([(-1, 1), (1, -1), (2, -1), (3, 2)])))


@op("diagonal")
def _diagonal(b):
    x = b.tensor()
    return b.fn(torch.diagonal, x, b.draw(st.integers(-1, 1)), b.dim(x), b.dim(x))


@op("repeat")
def _repeat(b):
    x = b.tensor()
    reps = tuple(b.draw(st.lists(st.integers(1, 2), min_size=max(b.value(x).dim() - 1, 0), max_size=b.value(x).dim() + 1)))
    return b.method("repeat", x, *reps) if reps else b.method("repeat", x, ())


@op("flip")
def _flip(b):
    x = b.tensor()
    return b.fn(torch.flip, x, (b.dim(x),))


@op("roll")
def _roll(b):
    x = b.tensor()
    return b.fn(torch.roll, x, 1, b.dim(x))


@op("tril")
def _tril(b):
    return b.fn(torch.tril, b.tensor(), b.draw(st.integers(-1, 1)))


@op("expand_as")
def _expand_as(b):
    return b.method("expand_as", b.tensor(), b.tensor())


@op("as_strided")
def _as_strided(b):
    x = b.tensor()
    return b.fn(torch.as_strided, x, (2, 2), b.draw(st.sampled_from([(1, 1), (2, 1), (0, 1), (1, 0)])))


# reductions

def _reduction(target, floating_only=False):
    def make(b):
        x = b.tensor(floating=floating_only)
        form = b.draw(st.integers(0, 2))
        if form == 0:
            return b.fn(target, x)
        return b.fn(target, x, b.dim(x), keepdim=b.draw(st.booleans()))
    return make


for _name, _target in {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "prod": torch.prod,
                       "std": torch.std, "var": torch.var, "logsumexp": torch.logsumexp, "any": torch.any,
                       "all": torch.all, "argmax": torch.argmax, "max_dim": torch.max, "norm": torch.norm}.items():
    OPS[_name] = _reduction(_target, floating_only=_name in ("mean", "std", "var", "logsumexp", "norm"))


@op("cumsum")
def _cumsum(b):
    x = b.tensor()
    return b.fn(torch.cumsum, x, b.dim(x))


@op("softmax", "log_softmax")
def _softmax(b):
    x = b.tensor(floating=True)
    return b.fn(b.draw(st.sampled_from([F.softmax, F.log_softmax])), x, b.dim(x))


@op("sum_dtype")
def _sum_dtype(b):
    x = b.tensor()
    return b.fn(torch.sum, x, (b.dim(x),), dtype=b.dtype())


@op("topk")
def _topk(b):
    x = b.tensor()
    return b.fn(torch.topk, x, b.draw(st.integers(0, 3)), b.dim(x))


@op("sort")
def _sort(b):
    x = b.tensor()
    return b.fn(torch.sort, x, b.dim(x), descending=b.draw(st.booleans()))


# matmul, linear, conv, normalization

@op("matmul")
def _matmul(b):
    return b.fn(torch.matmul, b.tensor(), b.tensor())


@op("mm")
def _mm(b):
    return b.fn(torch.mm, b.tensor(), b.tensor())


@op("bmm")
def _bmm(b):
    return b.fn(torch.bmm, b.tensor(), b.tensor())


@op("linear")
def _linear(b):
    x = b.tensor(floating=True)
    features = b.value(x).shape[-1] if b.value(x).dim() else 1
    if b.draw(st.integers(0, 7)) == 0:
        features += 1
    weight = b.fn(torch.ones, (3, features), dtype=b.value(x).dtype)
    bias = b.draw(st.sampled_from([None, "bias"]))
    if bias:
        bias = b.fn(torch.zeros, (3,), dtype=b.value(x).dtype)
    return b.fn(F.linear, x, weight, bias)


@op("addmm")
def _addmm(b):
    x = b.tensor()
    return b.fn(torch.addmm, b.operand(x), b.tensor(), b.tensor(), beta=b.draw(st.sampled_from([1, 0.5])))


@op("conv1d", "conv2d")
def _conv(b):
    x = b.tensor(floating=True)
    value = b.value(x)
    spatial = b.draw(st.sampled_from([1, 2]))
    channels = value.shape[1] if value.dim() >= 2 else 1
    groups = b.draw(st.sampled_from([1, 1, 2]))
    kernel = (3,) * spatial if b.draw(st.booleans()) else (1,) * spatial
    weight = b.fn(torch.ones, (2, max(channels // groups, 1), *kernel), dtype=value.dtype)
    if b.draw(st.booleans()):
        weight = b.method("contiguous", weight, memory_format=torch.channels_last) if spatial == 2 else weight
    target = F.conv2d if spatial == 2 else F.conv1d
    return b.fn(target, x, weight, None, b.draw(st.sampled_from([1, 2])), b.draw(st.sampled_from([0, 1])),
                1, groups)


@op("max_pool2d")
def _max_pool(b):
    return b.fn(F.max_pool2d, b.tensor(floating=True), b.draw(st.sampled_from([1, 2])))


@op("avg_pool2d")
def _avg_pool(b):
    return b.fn(F.avg_pool2d, b.tensor(floating=True), 2, ceil_mode=b.draw(st.booleans()))


@op("layer_norm")
def _layer_norm(b):
    x = b.tensor(floating=True)
    shape = tuple(b.value(x).shape[-1:]) or (1,)
    return b.fn(F.layer_norm, x, shape if b.draw(st.integers(0, 5)) else (7,))


@op("pad")
def _pad(b):
    return b.fn(F.pad, b.tensor(), b.draw(st.sampled_from([(1, 1), (0, 2, 1, 0), (-1, 1), (1,)])),
                value=b.draw(st.sampled_from([0.0, -math.inf])))


@op("dropout")
def _dropout(b):
    return b.fn(F.dropout, b.tensor(), 0.5, True)


@op("interpolate")
def _interpolate(b):
    return b.fn(F.interpolate, b.tensor(floating=True), scale_factor=2.0,
                mode=b.draw(st.sampled_from(["nearest", "bilinear"])))


# indexing

@op("index_select")
def _index_select(b):
    x = b.tensor()
    d = b.dim(x)
    size = b.value(x).shape[d] if -b.value(x).dim() <= d < b.value(x).dim() else 1
    index = b.fn(torch.arange, b.draw(st.integers(0, size + 2)))  # past the end too: fxprop knows arange's values
    return b.fn(torch.index_select, x, d, index)


@op("gather")
def _gather(b):
    x = b.tensor()
    index = b.fn(torch.zeros, tuple(b.value(x).shape), dtype=torch.int64)
    return b.fn(torch.gather, x, b.dim(x), index)


@op("getitem_tensor")
def _getitem_tensor(b):
    x = b.tensor()
    leading = b.draw(st.booleans())
    shape = b.value(x).shape or (1,)
    index = b.fn(torch.arange, b.draw(st.integers(0, (shape[0] if leading else shape[-1]) + 1)))
    return b.fn(operator.getitem, x, (index,) if leading else (Ellipsis, index))


@op("embedding")
def _embedding(b):
    weight = b.tensor()
    rows = b.value(weight).shape[0] if b.value(weight).dim() else 0
    index = b.fn(torch.arange, b.draw(st.integers(0, rows + 1)))
    if b.draw(st.booleans()):
        index = b.fn(operator.add, index, b.draw(st.integers(-2, 2)))
    return b.fn(F.embedding, index, weight)


@op("index_put")
def _scatter(b):
    x = b.tensor()
    index = b.fn(torch.zeros, tuple(b.value(x).shape), dtype=torch.int64)
    return b.fn(torch.scatter, x, b.dim(x), index, b.scalar())


# cat, stack, split

@op("cat")
def _cat(b):
    x = b.tensor()
    return b.fn(torch.cat, [x, b.tensor()], b.dim(x))


@op("stack")
def _stack(b):
    x = b.tensor()
    return b.fn(torch.stack, (x, b.tensor()), b.draw(st.integers(-1, 1)))


@op("split")
def _split(b):
    x = b.tensor()
    sizes = b.draw(st.sampled_from([1, 2, [1, 1], [2, -1]]))
    return b.fn(torch.split, x, sizes, b.dim(x))


@op("chunk")
def _chunk(b):
    x = b.tensor()
    return b.method("chunk", x, b.draw(st.integers(0, 3)), b.dim(x))


@op("unbind")
def _unbind(b):
    x = b.tensor()
    return b.fn(torch.unbind, x, b.dim(x))


# casts

@op("to_dtype")
def _to(b):
    return b.method("to", b.tensor(), b.dtype())


@op("float", "long", "half", "bool")
def _cast(b):
    return b.method(b.draw(st.sampled_from(["float", "long", "half", "bool"])), b.tensor())


@op("type_as")
def _type_as(b):
    return b.method("type_as", b.tensor(), b.tensor())


@op("channels_last")
def _channels_last(b):
    return b.method("contiguous", b.tensor(), memory_format=torch.channels_last)


@op("clone_preserve")
def _clone(b):
    return b.fn(torch.clone, b.tensor(), memory_format=b.draw(st.sampled_from(
        [torch.preserve_format, torch.contiguous_format, torch.channels_last])))


@op("view_dtype")
def _view_dtype(b):
    return b.method("view", b.tensor(), b.dtype())


# factories

@op("zeros", "ones", "empty")
def _factory(b):
    target = b.draw(st.sampled_from([torch.zeros, torch.ones, torch.empty]))
    shape = b.draw(st.sampled_from([(2, 3), (0,), (), (1, 4, 1)]))
    if b.ints and b.draw(st.booleans()):
        shape = (b.draw(st.sampled_from(b.ints)), 2)
    return b.fn(target, shape, dtype=b.dtype())


@op("full")
def _full(b):
    return b.fn(torch.full, b.draw(st.sampled_from([(2,), (3, 1)])), b.scalar())


@op("arange")
def _arange(b):
    return b.fn(torch.arange, b.draw(st.sampled_from([0, 3, 5])), dtype=b.draw(st.sampled_from([None, torch.float32])))


@op("zeros_like", "ones_like", "rand_like")
def _like(b):
    return b.fn(b.draw(st.sampled_from([torch.zeros_like, torch.ones_like, torch.rand_like])), b.tensor())


@op("randn")
def _randn(b):
    return b.fn(torch.randn, b.draw(st.sampled_from([(2, 2), (3,), (1, 2, 3)])))


@op("new_full")
def _new_full(b):
    return b.method("new_full", b.tensor(), (2, b.size()), b.scalar())


@op("eye", "linspace")
def _eye(b):
    return (b.fn(torch.eye, b.size()) if b.draw(st.booleans())
            else b.fn(torch.linspace, 0.0, 1.0, b.size()))


@op("full_nan_size")
def _bad_size(b):
    return b.fn(torch.zeros, (b.draw(st.sampled_from([math.nan, math.inf, 2.5, -1])), 2))


# sizes as python values

@op("size")
def _size(b):
    x = b.tensor()
    return b.method("size", x, b.dim(x))


@op("numel_dim")
def _numel(b):
    return b.method(b.draw(st.sampled_from(["numel", "dim"])), b.tensor())


@op("size_arith")
def _size_arith(b):
    if not b.ints:
        return None
    return b.fn(b.draw(st.sampled_from([operator.mul, operator.floordiv, operator.add])),
                b.draw(st.sampled_from(b.ints)), b.draw(st.sampled_from([1, 2])))


# in-place methods: on an input they must not change the user's tensor

@op("add_", "mul_", "relu_", "copy_")
def _inplace(b):
    x = b.tensor()
    name = b.draw(st.sampled_from(["add_", "mul_", "relu_", "copy_"]))
    if name == "relu_":
        return b.method(name, x)
    return b.method(name, x, b.operand(x))


@op("inplace_on_view")
def _inplace_on_view(b):
    """An in-place op through a view, then the base read again: the write must reach the base
    (its requires_grad, its version) as torch's views make it."""
    x = b.tensor()
    value = b.value(x)
    views = [("unsqueeze", (0,)), ("view", (-1,)), ("t", ())] + ([("select", (0, 0)), ("narrow", (0, 0, 1))]
                                                                  if value.dim() and value.shape[0] else [])
    name, arguments = b.draw(st.sampled_from(views))
    view = b.method(name, x, *arguments)
    if view is None or b.failed is not None:  # a view real execution refused ends the graph there
        return None
    write = b.draw(st.sampled_from(["add_", "mul_", "zero_", "copy_"]))
    written = b.method(write, view) if write == "zero_" else b.method(write, view, b.operand(view))
    if written is None:
        return None
    return b.method("clone", x)


@op("size_from_real_int")
def _size_from_real_int(b):
    """A size read off an integer input passed for real (its value known to fxprop) or as a spec
    (an unbacked symbol): ``.item()`` feeding a factory and a slice."""
    counts = [n for n in b.tensors if n.op == "placeholder" and not b.value(n).dtype.is_floating_point
              and not b.value(n).dtype.is_complex and b.value(n).dtype != torch.bool and b.value(n).numel() == 1]
    if not counts:
        return None
    count = b.method("item", b.draw(st.sampled_from(counts)))
    if count is None:
        return None
    if b.draw(st.booleans()):
        return b.fn(torch.zeros, (count, 2))
    x = b.tensor()
    return b.fn(operator.getitem, x, (slice(None, count),)) if b.value(x).dim() else b.fn(torch.ones, (count,))


# modules and attributes: their state must come out of propagate untouched

@op("module")
def _module(b):
    x = b.tensor(floating=True)
    value = b.value(x)
    features = value.shape[-1] if value.dim() else 1
    channels = value.shape[1] if value.dim() >= 2 else 1
    make = b.draw(st.sampled_from([
        lambda: torch.nn.Linear(features, 3),
        lambda: torch.nn.Linear(features + 1, 3),
        lambda: torch.nn.BatchNorm1d(channels).train(),
        lambda: torch.nn.BatchNorm2d(channels).eval(),
        lambda: torch.nn.LayerNorm(features),
        lambda: torch.nn.Conv2d(channels, 2, 1),
        lambda: torch.nn.Dropout(0.5).train(),
        lambda: torch.nn.GELU(),
        lambda: torch.nn.Embedding(4, 3),
    ]))
    module = make()
    if (value.dtype.is_floating_point or value.dtype.is_complex) and b.draw(st.booleans()):
        module = module.to(value.dtype)
    name = f"m{len(b.root._modules)}"
    b.root.add_module(name, module)
    if isinstance(module, torch.nn.Embedding):
        x = b.fn(torch.zeros, tuple(value.shape), dtype=torch.int64)
    return b.call("call_module", name, (x,))


@op("get_attr")
def _get_attr(b):
    name = f"p{len(b.root._parameters) + len(b.root._buffers)}"
    shape = b.draw(st.sampled_from([(3,), (2, 3), (1,), ()]))
    if b.draw(st.booleans()):
        b.root.register_parameter(name, torch.nn.Parameter(torch.randn(shape), requires_grad=b.draw(st.booleans())))
    else:
        b.root.register_buffer(name, torch.randint(1, 4, shape, dtype=b.draw(st.sampled_from([torch.int64, torch.float32]))))
    return b.call("get_attr", name, ())


assert len(OPS) >= 60, len(OPS)


# --- the property ------------------------------------------------------------------------

# Errors that real kernels raise and that fxprop, by design, does not model: it computes
# metadata as torch's meta kernels (and FakeTensorProp) do, for any target device. After such
# an error fxprop may go on, so only the nodes before it are compared. Reviewed; one reason each.
UNMODELED_REAL_ERRORS = {
    r"not implemented for '": "which dtypes a backend's kernels implement is asked of the CPU's own kernel for "
                              "elementwise ops only (fxprop/aten/host_dtypes.py); for other ops meta kernels accept "
                              "every dtype, and the answer differs per device (CPU vs CUDA)",
    r"without overflow": "whether a python scalar fits the tensor's dtype is checked by the compute kernels "
                         "only (a value check, not a shape check)",
    r"Boolean alpha only supported|For integral input tensors, argument alpha must not be a floating point":
        "the type of `alpha` is checked by the CPU kernel, not by aten's meta function",
    r"setStorage: .* out of bounds": "as_strided is checked against the real storage's size; fxprop's inputs "
                                     "carry their view's extent, not the size of the user's storage",
    r"not supported for complex|does not support complex|not implemented for complex|Boolean inputs not supported"
    r"|with a bool tensor is not supported|with two bool tensors is not supported|only support floating point"
    r"|not intended to support complex"
    r"|not supported for (?:bool|Bool)|does not support bool|must be a floating point|only supports floating-point":
        "dtype validity checked only inside the compute kernels (relu on bool, floor on complex, std on ints); "
        "aten's meta functions and decompositions accept these dtypes",
    r"can't be cast to the desired output type": "in-place ops check that the result type casts to self's dtype "
                                                 "in TensorIterator at run time; meta kernels skip it",
    r"Input and output sizes should be greater than 0": "upsampling refuses empty spatial sizes in its kernels only",
    r"mixed dtype \(CPU\)": "the CPU normalization kernels' rules for parameters of another dtype than the input "
                            "(CUDA's differ); meta kernels accept any",
    r"more than one element of the written-to tensor refers to a single memory location"
    r"|some elements of the input tensor and the written-to tensor refer to a single memory location":
        "writes into self-overlapping (expanded) tensors, and inputs partially overlapping the output, are "
        "refused as TensorIterator refuses them for elementwise ops and copy_ (fxprop/aten/in_place.py), but not "
        "for other kernels' own checks",
}


# The other way round: where an operand is empty, some CPU kernels return before their dtype
# checks (bmm of float by bool batches of size 0 "succeeds", with batch2's dtype). Where every
# tensor an aten op is given is empty, fxprop asks the CPU kernel itself (there are no values to
# stand in for); but a torch-level call can reach other ops when dispatched than when it runs
# eagerly: eager ``matmul`` of an empty float (2, 1, 0) by an empty int (1, 0, 1) runs bmm and
# succeeds, while under any dispatch mode (FakeTensorMode, FlopCounterMode, fxprop's) it folds to
# mm, which refuses the dtypes. fxprop keeps that refusal: the program is wrong for every
# non-empty input.
STRICTER_ON_EMPTY = (r"expected scalar type|(must|to) have the same dtype|bool tensors? is not supported"
                     r"|not implemented for|not supported for complex|only support floating point")


def stricter_on_empty(gm: torch.fx.GraphModule, real: Any, error: fxprop.PropagationError) -> bool:
    node = next(n for n in gm.graph.nodes if n.name == error.node_name)
    seen = [real.values.get(arg.name) for arg in node.all_input_nodes]
    empty = any(isinstance(value, Observed) and 0 in value.shape for value in seen)
    return empty and re.search(STRICTER_ON_EMPTY, error.reason) is not None


# Open findings, reviewed, one reason each: strides not yet compared for these targets.
def unmodeled(error: BaseException | None) -> str | None:
    text = str(error)
    return next((reason for pattern, reason in UNMODELED_REAL_ERRORS.items() if re.search(pattern, text)), None)


def assumption_fails(gm: torch.fx.GraphModule, real: Any) -> bool:
    """Honest too: fxprop propagated under an assumption it states (``fxprop.assumptions``) on a
    value it was not given (an ``.item()`` of a spec), and the value real execution read breaks it
    (``torch.ones(x.item()) * y`` assumes the two sizes broadcast)."""
    summary = gm.meta.get("fxprop", {})
    values = {info.symbol: real.values.get(info.node) for info in summary.get("symbols", {}).values()
              if info.kind == "value"}
    values = {symbol: v for symbol, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
    return any(assumption.free_symbols & set(values) and assumption.free_symbols <= set(values)
               and sympy.sympify(assumption).subs(values) == sympy.false for assumption in summary.get("assumptions", []))


@st.composite
def graphs(draw):
    """(graph module, input recipes, node that raised when run for real or None)."""
    count = draw(st.integers(1, 3))
    recipes = [draw(input_recipes(seed=i)) for i in range(count)]
    builder = Builder(draw, recipes)
    for _ in range(draw(st.integers(1, 16 if CAMPAIGN else 10))):
        make = OPS[draw(st.sampled_from(sorted(OPS)))]
        make(builder)
        if builder.failed is not None:
            break
    last = builder.failed or next(reversed(builder.graph.nodes))
    builder.graph.output(last)
    gm = torch.fx.GraphModule(builder.root, builder.graph)
    return gm, recipes


def placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [node for node in gm.graph.nodes if node.op == "placeholder"]


def check_graph(gm: torch.fx.GraphModule, recipes: list[InputRecipe], cache: Any = True) -> None:
    """The fuzzing property for one graph (see the module docstring)."""
    note(gm.code)
    note(repr(recipes))
    real_inputs = [recipe.make() for recipe in recipes]
    versions = [t._version if isinstance(t, torch.Tensor) else None for t in real_inputs]
    real = run_real_until_error(gm, *real_inputs)
    written = {node for node, tensor, version in zip(placeholders(gm), real_inputs, versions)
               if isinstance(tensor, torch.Tensor) and tensor._version != version}
    inputs = [recipe.for_fxprop() for recipe in recipes]
    code = gm.code
    start = time.process_time()  # CPU seconds: a starved process is slow, not hung
    try:
        with assert_no_side_effects(gm, *inputs):
            fxprop.propagate(gm, *inputs, cache=cache)
    except fxprop.PropagationError as error:
        order = [node.name for node in gm.graph.nodes]
        if stricter_on_empty(gm, real, error) and (
                real.failed_node is None or order.index(error.node_name) < order.index(real.failed_node)):
            return
        assert real.failed_node is not None, f"real execution succeeded, but fxprop raised:\n{error}"
        assert error.node_name == real.failed_node or (
            unmodeled(real.error) and order.index(error.node_name) > order.index(real.failed_node)), (
            f"real execution raised at %{real.failed_node} ({type(real.error).__name__}: "
            f"{str(real.error).splitlines()[0] if str(real.error) else ''}), fxprop at %{error.node_name}:\n{error}")
        if error.node_name == real.failed_node:
            assert error.refuses_like(real.error), (
                f"real execution raised {type(real.error).__name__} at %{real.failed_node}, fxprop refused with "
                f"{error.error_type.__name__}:\n{error}")
        assert all("fxprop" not in node.meta for node in gm.graph.nodes), "a failed propagate wrote metadata"
    except fxprop.DataDependentError as error:
        # Honest only where the graph reads a value fxprop was not given: .item() of an input
        # passed as a spec, or of one the graph wrote in place (its values end at the write),
        # upstream of the node that needed it.
        unknown = {node for node, recipe in zip(placeholders(gm), recipes) if recipe.as_spec} | written
        reads = [node for node in gm.graph.nodes if node.op == "call_method" and node.target in ("item", "tolist")
                 and node.args[0] in unknown]
        assert reads, f"fxprop says the answer depends on data the graph has:\n{error}"
        event("data-dependent: fxprop says it cannot answer")
        assert all("fxprop" not in node.meta for node in gm.graph.nodes), "a failed propagate wrote metadata"
    else:
        if (real.failed_node is None or not unmodeled(real.error)) and assumption_fails(gm, real):
            event("propagated under an assumption that these values break")
            return
        assert real.failed_node is None or unmodeled(real.error), (
            f"real execution raised at %{real.failed_node}: {type(real.error).__name__}: {real.error}\n"
            "but fxprop propagated the graph")
        mismatches = compare_nodes(gm, real.values)
        assert not mismatches, render_mismatches(mismatches)
        if isinstance(cache, fxprop.RuleCache):
            check_replay(gm, inputs, cache, real.values)
    finally:
        assert gm.code == code
        assert time.process_time() - start < MAX_SECONDS_PER_GRAPH, "propagate took too long (hung?)"


def check_replay(gm: torch.fx.GraphModule, inputs: list, cache: fxprop.RuleCache, observed: dict) -> None:
    """The graph twice more, on copies: kept at its second sighting, replayed whole at its third
    (where it may be); each annotated exactly as the walk annotated ``gm``, and as real execution."""
    walked = layouts(gm)
    for _ in range(2):
        copied = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        fxprop.propagate(copied, *inputs, cache=cache)
        assert layouts(copied) == walked, "a kept or replayed propagation differs from the walk"
        mismatches = compare_nodes(copied, observed)
        assert not mismatches, render_mismatches(mismatches)
    event("replayed whole" if cache.stats()["replays"] else "walked on every call (not replayable)")


def layouts(gm: torch.fx.GraphModule) -> list:
    """Every node's annotation, storages named by the order they are first met."""
    storages: dict[int, int] = {}

    def described(value):
        if isinstance(value, torch.Tensor):
            storage = storages.setdefault(value.untyped_storage()._cdata, len(storages))
            return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                    value.requires_grad, value.is_conj(), value.is_neg(), storage, value.untyped_storage().nbytes())
        if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
            return (type(value), tuple(described(item) for item in value))
        if isinstance(value, dict):
            return (dict, tuple(value), tuple(described(item) for item in value.values()))
        return (type(value), "nan") if isinstance(value, float) and value != value else (type(value), value)
    return [(node.name, described(node.meta.get("val")), node.meta.get("tensor_meta"), node.meta.get("type"),
             node.meta.get("fxprop")) for node in gm.graph.nodes]


@settings(max_examples=EXAMPLES or 150, derandomize=not CAMPAIGN, deadline=None, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(graphs(), st.sampled_from([True, False, "own"]))
def test_random_graphs(case, cache):
    gm, recipes = case
    check_graph(gm, recipes, cache=fxprop.RuleCache(64) if cache == "own" else cache)


def test_building_a_graph_leaves_the_module_state_as_the_graph_finds_it():
    """Campaign finding: the builder ran ``p0.add_(x0)`` on the root's own buffer, with an ``x0``
    that requires grad; the buffer became a non-leaf and the check's copy of the module failed."""
    def no_draws(strategy):
        raise AssertionError("this graph needs no draw")

    recipes = [InputRecipe((), (), 0, torch.float32, True, True, 0)]
    builder = Builder(no_draws, recipes)
    builder.root.register_buffer("p0", torch.ones(()))
    p0 = builder.call("get_attr", "p0", ())
    builder.method("add_", p0, next(iter(builder.graph.nodes)))
    builder.graph.output(next(reversed(builder.graph.nodes)))
    assert builder.root.p0.is_leaf and builder.root.p0.item() == 1.0
    gm = torch.fx.GraphModule(builder.root, builder.graph)

    @settings(max_examples=1, database=None)
    @given(st.just(gm))
    def the_property(graph):  # check_graph notes what it checks, as in a hypothesis test
        check_graph(graph, recipes, cache=fxprop.RuleCache(64))
    the_property()


def test_the_pool_covers_every_family():
    families = {"elementwise": "sigmoid", "broadcasting": "add", "views": "view", "reductions": "sum",
                "matmul": "matmul", "linear": "linear", "conv": "conv2d", "indexing": "index_select",
                "cat": "cat", "stack": "stack", "split": "split", "casts": "to_dtype", "factories": "zeros"}
    assert set(families.values()) <= set(OPS) and len(OPS) >= 60


# --- regressions: every finding of the fuzzer, fixed, stays fixed -------------------------

def channels_last(*shape):
    return torch.randn(shape).contiguous(memory_format=torch.channels_last)


# (finding, target, args, whether real execution -- and so fxprop -- raises)
REGRESSIONS = [
    ("where takes a uint8 condition (the meta kernel refused it)", torch.where,
     (torch.tensor([1, 0], dtype=torch.uint8), torch.ones(2), torch.zeros(3, 2)), False),
    ("max over an empty dim", torch.max, (torch.zeros(0, 3), 0), True),
    ("min over an empty dim, negative", torch.min, (torch.zeros(0, 3), -2), True),
    ("max over a non-empty dim of an empty tensor", torch.max, (torch.zeros(0, 3), 1), False),
    ("max of an empty tensor", torch.max, (torch.zeros(0),), True),
    ("median over an empty dim", torch.median, (torch.zeros(3, 0), 1), True),
    ("median of an empty tensor is nan, not an error", torch.median, (torch.zeros(0, 3),), False),
    ("mode reduces the last dim by default", torch.mode, (torch.zeros(0, 3),), False),
    ("mode over an empty last dim", torch.mode, (torch.zeros(3, 0),), True),
    ("softmax dim out of range", F.softmax, (torch.zeros(3, dtype=torch.float16), 3), True),
    ("log_softmax dim out of range", F.log_softmax, (torch.zeros(3, 1), -3), True),
    ("softmax of a 0-dim tensor on dim -1", F.softmax, (torch.zeros(()), -1), False),
    ("index_select dim out of range on a 0-dim tensor", torch.index_select,
     (torch.zeros(()), 1, torch.arange(0)), True),
    ("index_select of no index into a 0-dim tensor", torch.index_select, (torch.zeros(()), 0, torch.arange(0)), True),
    ("index_select of one index into a 0-dim tensor", torch.index_select,
     (torch.zeros(()), -1, torch.zeros(1, dtype=torch.int64)), False),
    ("conv over an empty spatial dim", F.conv1d, (torch.zeros(3, 4, 0), torch.ones(2, 4, 3), None, 1, 1), True),
    ("conv over a zero batch", F.conv2d, (torch.zeros(0, 4, 5, 5), torch.ones(2, 4, 3, 3)), False),
    ("conv over zero channels", F.conv2d, (torch.zeros(2, 0, 5, 5), torch.ones(2, 0, 3, 3)), False),
    ("roll of an empty tensor ignores dims", torch.roll, (torch.zeros(0), 1, 1), False),
    ("roll along a dim keeps channels_last", torch.roll, (channels_last(1, 2, 1, 2), 1, 1), False),
    ("roll along two dims rolls one at a time", torch.roll, (channels_last(1, 2, 1, 3), (1, 2), (0, 1)), False),
    ("roll of a transposed tensor", torch.roll, (torch.randn(1, 1, 2, 2).transpose(1, 3), 1, -1), False),
    ("roll with no dims flattens", torch.roll, (channels_last(2, 3, 2, 2), 5), False),
    ("roll dim out of range", torch.roll, (torch.zeros(2, 3), 1, 2), True),
    ("sort dim out of range", torch.sort, (torch.zeros(3, 4, 2, dtype=torch.int8), 3), True),
    ("sort of a 0-dim tensor on dim 1", torch.sort, (torch.zeros(()), 1), True),
    ("sort on the last dim by default", torch.sort, (torch.zeros(2, 3),), False),
    ("an integer tensor to a negative integer power", torch.pow, (torch.ones(2, dtype=torch.int64), -3), True),
    ("a bool tensor to a negative integer power", torch.pow, (torch.ones(2, dtype=torch.bool), -1), True),
    ("a bool tensor to a bool power stays bool (campaign seed 1796217677)", torch.pow,
     (torch.ones(2, dtype=torch.bool), True), False),
    ("a bool tensor to an int power is int64", torch.pow, (torch.ones(2, dtype=torch.bool), 2), False),
    ("an integer tensor to a negative float power", torch.pow, (torch.ones(2, dtype=torch.int64), -1.0), False),
    ("linear of bfloat16 input by float32 weights", F.linear,
     (torch.zeros(5, 5, dtype=torch.bfloat16), torch.zeros(3, 5), torch.zeros(3)), True),
    ("linear without bias, mixed dtypes", F.linear, (torch.zeros(2, 5, 5, dtype=torch.float64), torch.zeros(3, 5)), True),
    ("mm of int64 by int32", torch.mm, (torch.zeros(5, 5, dtype=torch.int64), torch.zeros(5, 3, dtype=torch.int32)), True),
    ("addmm with a bias of another dtype", torch.addmm,
     (torch.zeros(3, dtype=torch.bfloat16), torch.zeros(5, 5), torch.zeros(5, 3)), True),
    ("addmm of a float 0-dim bias and int64 matrices (campaign seed 1796215017)", torch.addmm,
     (torch.zeros(()), torch.ones(1, 1, dtype=torch.int64), torch.ones(1, 1, dtype=torch.int64)), True),
    ("addmm with a bias that does not broadcast to the product", torch.addmm,
     (torch.zeros(0, 1), torch.zeros(1, 2), torch.zeros(2, 1)), True),
    ("addmm with a bias of the wrong width", torch.addmm, (torch.zeros(3), torch.zeros(2, 2), torch.zeros(2, 1)), True),
    ("addmm with a row bias", torch.addmm, (torch.zeros(1, 3), torch.zeros(2, 2), torch.zeros(2, 3)), False),
    ("addbmm with a bias that does not broadcast", torch.addbmm,
     (torch.zeros(4), torch.zeros(2, 5, 5), torch.zeros(2, 5, 3)), True),
    ("mv of mixed dtypes", torch.mv, (torch.zeros(5, 5, dtype=torch.bfloat16), torch.zeros(5)), True),
    ("addbmm of mixed dtypes", torch.addbmm,
     (torch.zeros(5, 3), torch.zeros(2, 5, 5, dtype=torch.bfloat16), torch.zeros(2, 5, 3)), True),
    ("conv of bfloat16 input by float32 weights", F.conv2d,
     (torch.zeros(1, 2, 5, 5, dtype=torch.bfloat16), torch.zeros(3, 2, 3, 3)), True),
    ("nearest upsampling of an empty batch (torch's meta kernel died with a TypeError)", F.interpolate,
     (torch.zeros(0, 2, 2, 5, dtype=torch.uint8), None, 2.0), False),
    ("nearest upsampling of an empty sample", F.interpolate, (torch.zeros(0, 2, 0, 5), None, 2.0), True),
    ("nearest-exact upsampling of an empty 3d batch", F.interpolate,
     (torch.zeros(0, 1, 2, 2, 2), None, 2.0, "nearest-exact"), False),
    ("a float64 conv keeps a channels_last input channels_last on the CPU (slow 2d kernel)", F.conv2d,
     (channels_last(5, 4, 5, 4).double(), torch.ones(2, 4, 3, 3, dtype=torch.float64)), False),
    ("an int32 conv keeps a channels_last weight channels_last", F.conv2d,
     (torch.ones(2, 4, 3, 1, dtype=torch.int32),
      torch.ones(4, 4, 1, 1, dtype=torch.int32).contiguous(memory_format=torch.channels_last)), False),
    ("a float64 transposed conv of a channels_last input", F.conv_transpose2d,
     (channels_last(2, 4, 3, 3).double(), torch.ones(4, 2, 1, 1, dtype=torch.float64)), False),
    ("conv of an empty batch skips the dtype check", F.conv2d,
     (torch.zeros(0, 2, 5, 5, dtype=torch.bfloat16), torch.zeros(3, 2, 3, 3)), False),
    ("conv with a float64 bias", F.conv2d, (torch.zeros(1, 2, 5, 5), torch.zeros(3, 2, 3, 3), torch.zeros(3, dtype=torch.float64)), True),
    ("linear of matching bfloat16", F.linear, (torch.zeros(2, 5, 5, dtype=torch.bfloat16), torch.zeros(3, 5, dtype=torch.bfloat16)), False),
    ("a half conv3d of a channels_last_3d input, laid out as this host's backend choice", F.conv3d,
     (torch.randn(1, 3, 4, 4, 4, dtype=torch.half).contiguous(memory_format=torch.channels_last_3d),
      torch.randn(2, 3, 2, 2, 2, dtype=torch.half)), False),
    ("a float conv3d of one sample takes the slow kernel (contiguous), as the host chooses", F.conv3d,
     (torch.randn(1, 3, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d), torch.randn(2, 3, 2, 2, 2)), False),
    ("a batched float conv3d keeps channels_last_3d where the host picks oneDNN", F.conv3d,
     (torch.randn(17, 3, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d), torch.randn(2, 3, 2, 2, 2)), False),
    ("bilinear upsampling of zero channels (the CPU kernel refuses an empty sample)", F.interpolate,
     (torch.zeros(1, 0, 3, 3), None, 2.0, "bilinear"), True),
    ("bicubic upsampling of an empty batch", F.interpolate, (torch.zeros(0, 2, 3, 3), None, 2.0, "bicubic"), False),
    ("linear upsampling of an empty sample", F.interpolate, (torch.zeros(2, 0, 3), None, 2.0, "linear"), True),
    ("a bool tensor to a bool power, in place, stays bool", torch.Tensor.pow_, (torch.tensor([True, False]), True), False),
    ("an int tensor to a negative int power, in place", torch.Tensor.pow_, (torch.tensor([1, 2]), -1), True),
    ("angle of a complex tensor is contiguous (campaign seed 1796225002)", torch.angle,
     (torch.randn(4, dtype=torch.complex64).as_strided((1, 1, 2, 2), (4, 1, 1, 2)),), False),
    ("angle of a transposed complex tensor", torch.angle, (torch.randn(3, 4, dtype=torch.complex64).t(),), False),
]


@pytest.mark.parametrize("target, args, raises", [entry[1:] for entry in REGRESSIONS],
                         ids=[entry[0] for entry in REGRESSIONS])
def test_fixed_findings(target, args, raises):
    import warnings
    from fxprop.testing import check_rule
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # where's uint8 deprecation
        if raises:
            with pytest.raises(fxprop.PropagationError):
                check_rule(target, *args)
        else:
            check_rule(target, *args)


def test_a_fresh_rule_cache_is_used():
    """Finding: ``cache=RuleCache()`` was ignored while empty (an empty cache is falsy)."""
    cache = fxprop.RuleCache()
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
    fxprop.propagate(gm, fxprop.TensorSpec((2, 4)), cache=cache)
    assert len(cache) > 0 and cache.stats()["misses"] > 0
    for _ in range(2):  # the same graph again: kept at its second sighting, replayed whole at its third
        fxprop.propagate(gm, fxprop.TensorSpec((2, 4)), cache=cache)
    assert cache.stats()["replays"] > 0 and gm.meta["fxprop"]["cache"]["replays"] > 0


def test_unmodeled_real_errors_are_a_reviewed_table():
    assert all(isinstance(reason, str) and len(reason) > 30 for reason in UNMODELED_REAL_ERRORS.values())
    for pattern in UNMODELED_REAL_ERRORS:
        re.compile(pattern)


def test_aten_ops_of_only_empty_tensors_answer_as_the_cpu_kernel():
    """Campaign findings: bmm of empty float by bool batches, log_softmax of an empty bool tensor
    succeed for real; every tensor empty, the CPU kernel answers (provenance: fallback, 0 bytes)."""
    from fxprop.testing import assert_matches_real
    bmm = torch.fx.symbolic_trace(lambda a, b: torch.bmm(a, b))
    empty = (torch.zeros(0, 3, 3), torch.zeros(0, 3, 3, dtype=torch.bool))
    assert_matches_real(bmm, *empty)
    provenance = next(n for n in bmm.graph.nodes if n.op == "call_function").meta["fxprop"]
    assert provenance.kind == "fallback" and provenance.fallback_bytes == 0
    assert_matches_real(torch.fx.symbolic_trace(lambda x: F.log_softmax(x, 0)), torch.zeros(0, dtype=torch.bool))
    transposed = torch.zeros(3, 0).t()
    assert_matches_real(torch.fx.symbolic_trace(lambda x: torch.ops.aten.mean.dim(x, [0])), transposed)
    with pytest.raises(fxprop.PropagationError) as caught:  # as real: bmm checks the dtypes of non-empty batches
        fxprop.propagate(bmm, torch.zeros(1, 3, 3), torch.zeros(1, 3, 3, dtype=torch.bool))
    assert caught.value.error_type is RuntimeError


def test_an_assumption_the_real_values_break_is_accepted_only_when_they_break_it():
    """Campaign finding (seed 1796322147): ``ones(x0.item())`` broadcast against a (2,) tensor, x0 a
    spec: fxprop propagates assuming the item is 1 or 2; real execution, where it is 3, refuses."""
    def program(x0, x2):
        return torch.addcmul(x0, x2, torch.ones((x0.item(),)), value=0.5)
    gm = torch.fx.symbolic_trace(program)
    fxprop.propagate(gm, fxprop.TensorSpec((), dtype=torch.int64), fxprop.TensorSpec((2,)))
    assert assumption_fails(gm, run_real_until_error(gm, torch.tensor(3), torch.randn(2)))
    assert not assumption_fails(gm, run_real_until_error(gm, torch.tensor(2), torch.randn(2)))


def test_values_that_break_an_assumption_of_a_run_real_execution_completes_are_not_compared():
    """Campaign finding: ``torch.ones(x2.item()).expand_as(x0)`` with x0 of size 2 propagates under
    ``Eq(u0, 2)`` (torch's size-oblivious choice: an unbacked size is not 1), strides (1,); real
    execution with the value 1 completes too, with strides (0,). Those values break the stated
    assumption, so the run is no evidence against the answer, as when real execution raises."""
    def program(x0, x2):
        return torch.ones((x2.item(),)).expand_as(x0)
    gm = torch.fx.symbolic_trace(program)
    out = fxprop.propagate(gm, fxprop.TensorSpec((2,)), fxprop.TensorSpec((), dtype=torch.int64))
    assert out.stride() == program(torch.randn(2), torch.tensor(2)).stride()
    assert assumption_fails(gm, run_real_until_error(gm, torch.randn(2), torch.tensor(1)))
    assert not assumption_fails(gm, run_real_until_error(gm, torch.randn(2), torch.tensor(2)))


def test_empty_operands_the_meta_kernel_accepts_never_reach_the_host():
    """Adversary findings: ``mm`` of (n, 0) by (0, m) specs made n x m zeros on the host (576 MB),
    and ``fallback_limit_bytes=0`` refused empty calls the meta kernel answers."""
    mm = torch.fx.symbolic_trace(lambda a, b: torch.mm(a, b))
    out = fxprop.propagate(mm, fxprop.TensorSpec((12000, 0)), fxprop.TensorSpec((0, 12000)), fallback_limit_bytes=0)
    assert out.shape == (12000, 12000)
    assert all(n.meta["fxprop"].fallback_bytes == 0 for n in mm.graph.nodes)
    std = torch.fx.symbolic_trace(lambda x: torch.linalg.det(x) + x.std())
    fxprop.propagate(std, fxprop.TensorSpec((0, 0)), fallback_limit_bytes=0)
    big = torch.fx.symbolic_trace(lambda a, b: torch.bmm(a, b))  # refused by the meta kernel, too large to ask
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(big, torch.zeros(1000, 1000, 0), torch.zeros(1000, 0, 1000, dtype=torch.bool))


def test_stricter_on_empty_operands_is_accepted_only_for_dtype_checks():
    """Campaign finding (30-minute run): eager matmul of empty float (2, 1, 0) by empty int64
    (1, 0, 1) succeeds; dispatched, it reaches mm, which refuses: accepted as stricter on empty."""
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output(graph.call_function(torch.matmul, (a, b)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    empty = (torch.zeros(2, 1, 0), torch.zeros(1, 0, 1, dtype=torch.int64))
    real = run_real_until_error(gm, *empty)
    assert real.failed_node is None
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, *empty)
    assert stricter_on_empty(gm, real, caught.value)
    full = (torch.zeros(1, 3, 3), torch.zeros(1, 4, 3))
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, *full)
    assert not stricter_on_empty(gm, run_real_until_error(gm, *full), caught.value)


class _InPlaceOnAView(torch.nn.Module):
    def forward(self, x, w):
        return x.unsqueeze(0).add_(w)


class _InPlaceThroughAnAlias(torch.nn.Module):
    def forward(self, x, w):
        y = x.contiguous()  # x itself, when x is contiguous
        y.add_(w)           # so x now requires grad
        return x * 2


@pytest.mark.parametrize("cache", [False, True], ids=["no_cache", "cache"])
def test_cached_results_keep_their_aliasing(cache):
    """Finding: a memoized view came back as a fresh tensor, so on the second call an in-place op
    on a view of a leaf requiring grad passed, and an in-place op through an alias no longer made
    its base require grad. Results aliasing an input are not memoized."""
    gm = torch.fx.symbolic_trace(_InPlaceOnAView())
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError, match="view of a leaf Variable"):
            fxprop.propagate(gm, fxprop.TensorSpec((3,), requires_grad=True), fxprop.TensorSpec((3,)), cache=cache)
    gm = torch.fx.symbolic_trace(_InPlaceThroughAnAlias())
    for _ in range(2):
        out = fxprop.propagate(gm, fxprop.TensorSpec((3,)), fxprop.TensorSpec((3,), requires_grad=True), cache=cache)
        assert out.requires_grad


@pytest.mark.parametrize("mkldnn", [True, False])
@pytest.mark.parametrize("shape,stride,weight", [((1, 1, 2), (2, 1, 1), (2, 1, 1)), ((2, 1, 3), (3, 1, 1), (3, 1, 2)),
                                                 ((1, 1, 2), (2, 1, 1), (2, 1, 2)), ((2, 3, 5), (15, 1, 3), (4, 3, 2))])
def test_conv1d_lays_out_as_the_2d_convolution_aten_runs(shape, stride, weight, mkldnn):
    """Finding (campaign seed 1796322163): a (1, 1, 2) input with strides (2, 1, 1) reads as
    channels_last once ATen views the 1-d convolution as a 2-d one; the output was laid out
    contiguous."""
    from fxprop.testing import assert_matches_real
    gm = torch.fx.symbolic_trace(lambda x, w: torch.conv1d(x, w))
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        assert_matches_real(gm, torch.randn(40).as_strided(shape, stride), torch.randn(weight), cache=False)


def test_stack_of_an_elementwise_result_in_size_one_dims():
    """Finding (campaign seed 1796217672): the CPU lays out ``abs`` of a (1, 1, 2, 1) tensor with strides
    (2, 1, 1, 1) as (2, 2, 1, 1), torch's python meta kernels as (2, 1, 1, 1); stacking the two along a
    middle dim made the difference significant. Elementwise results now follow TensorIterator
    (fxprop/aten/layout.py)."""
    from fxprop.testing import assert_matches_real
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.stack, ((x, graph.call_function(torch.abs, (x,))), 1)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert_matches_real(gm, torch.randn(4).as_strided((1, 1, 2, 1), (2, 1, 1, 1)))


def test_batch_norm_of_a_transposed_input_is_contiguous_on_the_cpu():
    """Finding (campaign seed 1796218399): the CPU lays batch norm's output out in the input's suggested
    memory format; the meta kernel copied the input's strides (fxprop/rules/normalization.py)."""
    from fxprop.testing import assert_matches_real
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.BatchNorm1d(2)))
    assert_matches_real(gm, torch.randn(4).as_strided((1, 2, 2), (4, 1, 2)))


def test_a_value_torch_cannot_hold_is_the_nodes_error():
    """Finding (campaign seed 1796218407): an int tensor multiplied in place by a float requiring grad came
    out as an int tensor requiring grad; building its FakeTensor raised a bare RuntimeError out of
    propagate. Now it is a PropagationError at that node, where real execution raises too."""
    class MulInPlace(torch.nn.Module):
        def forward(self, x, w):
            return x.mul_(w)

    gm = torch.fx.symbolic_trace(MulInPlace())
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((3,), dtype=torch.int64), fxprop.TensorSpec((3,), requires_grad=True))
    assert caught.value.node_name == "mul_"
    assert run_real_until_error(gm, torch.ones(3, dtype=torch.int64),
                                torch.ones(3, requires_grad=True)).failed_node == "mul_"


# --- repropagate: after a random edit, the same annotations as a fresh propagate ------------

_INSERTED = {
    "relu": lambda graph, node: graph.call_method("relu", (node,)),
    "neg": lambda graph, node: graph.call_function(operator.neg, (node,)),
    "clone": lambda graph, node: graph.call_method("clone", (node,)),
    "double": lambda graph, node: graph.call_function(operator.mul, (node, 2)),
    "unsqueeze": lambda graph, node: graph.call_method("unsqueeze", (node, 0)),
    "sum": lambda graph, node: graph.call_method("sum", (node, -1)),
    "transpose": lambda graph, node: graph.call_method("transpose", (node, 0, -1)),
    "float": lambda graph, node: graph.call_method("float", (node,)),
    "unsqueeze_": lambda graph, node: graph.call_method("unsqueeze_", (node, 0)),
}


def _described(value: Any) -> Any:
    def one(tensor):
        return (tuple(map(str, tensor.shape)), tensor.dtype, tensor.device, tuple(map(str, tensor.stride())),
                tensor.requires_grad)
    if isinstance(value, torch.Tensor):
        return one(value)
    if isinstance(value, (tuple, list)):
        return tuple(_described(item) for item in value)
    return repr(value)


def _annotations(gm: torch.fx.GraphModule) -> dict:
    """Each node's annotation, sizes as text with data-dependent symbols renamed by order of first
    appearance (a repropagate names the symbols it makes after the graph's earlier ones)."""
    described = {node.name: (_described(node.meta.get("val")), node.meta["fxprop"].kind if "fxprop" in node.meta else None)
                 for node in gm.graph.nodes}
    names: dict[str, str] = {}
    text = re.sub(r"\bu\d+\b", lambda m: names.setdefault(m.group(0), f"u#{len(names)}"), repr(described))
    return {"annotations": text} if names else described


@st.composite
def edited_graphs(draw):
    gm, recipes = draw(graphs())
    inputs = [recipe.for_fxprop() for recipe in recipes]
    try:
        fxprop.propagate(gm, *inputs)
    except fxprop.FxpropError:
        return gm, recipes, None, []
    calls = [node for node in gm.graph.nodes if node.op.startswith("call")
             and isinstance(node.meta.get("val"), torch.Tensor)]
    if not calls:
        return gm, recipes, None, []
    target = draw(st.sampled_from(calls))
    how = draw(st.sampled_from(["insert", "rewire"]))
    graph = gm.graph
    if how == "insert":
        name = draw(st.sampled_from(sorted(_INSERTED)))
        with graph.inserting_after(target):
            new = _INSERTED[name](graph, target)
        target.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        edited = []
        how = f"insert {name} after %{target.name}"
    else:
        earlier = [node for node in graph.nodes if node is not target and isinstance(node.meta.get("val"), torch.Tensor)
                   and list(graph.nodes).index(node) < list(graph.nodes).index(target)]
        tensor_args = [i for i, arg in enumerate(target.args) if isinstance(arg, torch.fx.Node)]
        if not earlier or not tensor_args:
            return gm, recipes, None, []
        position = draw(st.sampled_from(tensor_args))
        replacement = draw(st.sampled_from(earlier))
        args = list(target.args)
        args[position] = replacement
        target.args = tuple(args)
        edited = [target]
        how = f"rewire %{target.name} arg {position} to %{replacement.name}"
    gm.recompile()
    return gm, recipes, how, edited


@settings(max_examples=int(os.environ.get("FXPROP_REPROPAGATE_EXAMPLES", "0")) or 60, derandomize=not CAMPAIGN,
          deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)
@given(edited_graphs())
def test_repropagate_after_a_random_edit_equals_a_fresh_propagate(case):
    import copy
    gm, recipes, how, edited = case
    if how is None:
        event("no edit (the graph failed or has no call)")
        return
    event(f"edit: {how.split()[0]}")
    note(how)
    note(gm.code)
    fresh = copy.deepcopy(gm)
    try:
        fxprop.propagate(fresh, *[recipe.for_fxprop() for recipe in recipes])
        expected = _annotations(fresh)
    except fxprop.FxpropError as error:
        expected = type(error)
    before = _annotations(gm)
    try:
        fxprop.repropagate(gm, edited)
        got = _annotations(gm)
    except fxprop.FxpropError as error:
        got = type(error)
        assert _annotations(gm) == before, "a failed repropagate changed annotations"
    if isinstance(expected, type) or isinstance(got, type):
        assert expected == got, f"{how}: propagate gave {expected}, repropagate {got}"
    else:
        differing = {name: (expected[name], got.get(name)) for name in expected if expected[name] != got.get(name)}
        assert not differing, f"{how}: {differing}"
