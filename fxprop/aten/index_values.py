"""Bounds on the values of integer index tensors built with ``arange``, checked where they index.

Shapes say nothing about a tensor's values, but ``arange(start, end, step)`` holds exactly
``start, start + step, ...``: its smallest and largest values are expressions of its
arguments and its length. Carried through ops that keep values (views, copies, casts,
adding a number), such bounds reach the ops that index a dim with them -- embedding,
index_select, indexing -- and become conditions on sizes. A GPT's ``wpe(arange(T))`` needs
``T <= block_size``: with concrete sizes fxprop raises where real execution would raise, with
symbolic sizes the condition is one of the run's assumptions. Other index tensors (data) are
not tracked, and bounds end where the tensor, or a view of it, is written in place.

An index tensor whose values are known (a real one the user passed in, `fxprop.known_values`) is
checked where it reaches an op that indexes with it (`check_known_indices`), inside a module's
forward too: its smallest and largest values are its bounds.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, NamedTuple

import torch
from ..engine.known_values import KnownValues
from ..torch_compat import check, check_index, statically_known_true, version_counter

aten = torch.ops.aten

Bounds = tuple[Any, Any]  # (smallest, largest): ints or SymInts


def _arange_bounds(args: tuple, kwargs: dict, value: Any) -> Bounds | None:
    numbers = list(args[:3])
    if len(numbers) == 1:
        numbers = [0, numbers[0]]
    start = kwargs.get("start", numbers[0] if numbers else 0)
    step = kwargs.get("step", numbers[2] if len(numbers) > 2 else 1)
    integral = (int, torch.SymInt)
    if not (isinstance(start, integral) and isinstance(step, int) and step != 0 and isinstance(value, torch.Tensor)
            and value.dim() == 1 and not value.dtype.is_floating_point and not value.dtype.is_complex):
        return None
    last = start + step * (value.shape[0] - 1)
    return (start, last) if step > 0 else (last, start)


def _shifted(sign: int) -> Callable:
    def shift(bounds: Bounds, args: tuple, kwargs: dict) -> Bounds | None:
        numbers = [a for a in args if isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool)]
        if len(args) != 2 or len(numbers) != 1 or kwargs.get("alpha", 1) != 1:
            return None
        if sign < 0 and not isinstance(args[0], torch.Tensor):
            return None  # number - index reverses the order; not tracked
        return bounds[0] + sign * numbers[0], bounds[1] + sign * numbers[0]
    return shift


def _same(bounds: Bounds, args: tuple, kwargs: dict) -> Bounds:
    return bounds


def _viewed(bounds: Bounds, args: tuple, kwargs: dict) -> Bounds | None:
    """``view(sizes)`` keeps the values; ``view(dtype)`` reinterprets their bits."""
    return None if any(isinstance(a, torch.dtype) for a in (*args[1:], *kwargs.values())) else bounds


# Integer dtypes that hold any index of a real tensor: a narrower cast may wrap values around.
_WIDE_ENOUGH = (torch.int64, torch.int32)

_ARANGE = {torch.arange, aten.arange.default, aten.arange.start, aten.arange.start_step}

# Ops whose result holds (some of) the values of their first argument, each mapping its bounds.
_KEEPS_VALUES: dict[Any, Callable] = {
    **dict.fromkeys(
        ["unsqueeze", "reshape", "expand", "expand_as", "to", "long", "int", "contiguous", "flatten",
         "squeeze", "clone", "repeat", "view_as", "reshape_as", "detach", "t", "transpose", "permute",
         torch.unsqueeze, torch.reshape, torch.flatten, torch.squeeze, torch.clone, torch.t, torch.transpose,
         torch.permute, torch.detach, operator.getitem,
         aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten.expand.default, aten._to_copy.default,
         aten.clone.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
         aten.select.int, aten.permute.default, aten.t.default, aten.transpose.int, aten.detach.default,
         aten.alias.default, aten._unsafe_view.default, aten.lift_fresh_copy.default], _same),
    "view": _viewed,
    **dict.fromkeys([operator.add, torch.add, "add", aten.add.Tensor, aten.add.Scalar], _shifted(+1)),
    **dict.fromkeys([operator.sub, torch.sub, "sub", aten.sub.Tensor, aten.sub.Scalar], _shifted(-1)),
}


def _is_zero(count: Any) -> bool:
    return statically_known_true(count == 0) if isinstance(count, torch.SymInt) else count == 0


def index_select_range_check(source: torch.Tensor, dim: int) -> Callable:
    """How index_select's CPU kernel refuses an index out of range, for a tensor of two or more
    dims: along dim 1, or anywhere in an empty tensor, with a RuntimeError ("INDICES element is out
    of DATA bounds"); every other path with an IndexError."""
    if source.dim() > 1 and (dim % source.dim() == 1 or _is_zero(source.numel())):
        return check
    return check_index


def _check_index(bounds: Bounds, index: torch.Tensor, size: Any, negative_allowed: bool,
                 selects: bool = False, range_check: Callable = check_index) -> None:
    """Every value of ``index`` addresses one of ``size`` entries; an empty index addresses none.
    ``selects``: index_select of a tensor of two or more dims (and embedding, which calls it)
    refuses an empty dim first, with a RuntimeError; ``range_check`` raises for values out of range."""
    count = index.numel()
    if not (statically_known_true(count >= 1) if isinstance(count, torch.SymInt) else count >= 1):
        return  # no index, nothing addressed
    if selects:
        check(not _is_zero(size), lambda: "index_select(): self indexing axis dim should be positive")
    smallest, largest = bounds
    range_check(largest < size, lambda: f"index out of range in self: index {largest} >= dim size {size}")
    lowest = -size if negative_allowed else 0
    range_check(smallest >= lowest, lambda: f"index out of range in self: index {smallest} < {lowest}")


class _Held(NamedTuple):
    bounds: Bounds
    tensor: torch.Tensor  # the node's value: its bounds hold until it, or a view of it, is written in place
    version: int


class IndexValues:
    """The bounds known for one propagate run, by node."""

    def __init__(self) -> None:
        self.bounds: dict[torch.fx.Node, _Held] = {}

    def observe(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict, value: Any) -> None:
        """Check ``node``'s use of known index values, then record the bounds of its own value."""
        is_arange, keep = target in _ARANGE, _KEEPS_VALUES.get(target)  # FX targets are hashable
        if not self.bounds and not is_arange:
            return
        self._check_uses(node, target, args, kwargs)
        if is_arange:
            bounds = _arange_bounds(args, kwargs, value)
        else:
            source = self.known(node.args[0]) if keep is not None and node.args else None
            if source is None and keep is not None and len(node.args) > 1 and target in (operator.add, torch.add,
                                                                                         "add", aten.add.Tensor):
                source, args = self.known(node.args[1]), (args[1], args[0])  # number + index
            bounds = keep(source, args, kwargs) if source is not None else None
        if bounds is not None and isinstance(value, torch.Tensor) and value.dtype in _WIDE_ENOUGH:
            self.bounds[node] = _Held(bounds, value, version_counter(value))

    def known(self, argument: Any) -> Bounds | None:
        held = self.bounds.get(argument) if isinstance(argument, torch.fx.Node) else None
        if held is None or version_counter(held.tensor) != held.version:
            return None
        return held.bounds

    def _check_uses(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> None:
        def selected(position: int, name: str, size: Any, range_check: Callable = check_index,
                     empty_dim_first: bool = True) -> None:
            in_node = node.args[position] if position < len(node.args) else node.kwargs.get(name)
            bounds = self.known(in_node)
            if bounds is not None:
                _check_index(bounds, _arg(args, kwargs, position, name), size, False, selects=empty_dim_first,
                             range_check=range_check)

        # embedding is index_select of the weight's rows: the same CPU paths refuse it
        if isinstance(target, type) and issubclass(target, torch.nn.Embedding):
            weight = self._module(node).weight
            selected(0, "input", weight.shape[0], index_select_range_check(weight, 0))
        elif target in (torch.nn.functional.embedding,):
            weight = _arg(args, kwargs, 1, "weight")
            selected(0, "input", weight.shape[0], index_select_range_check(weight, 0))
        elif target is aten.embedding.default:
            selected(1, "indices", args[0].shape[0], index_select_range_check(args[0], 0))
        elif target in (torch.index_select, "index_select", aten.index_select.default):
            source, dim = args[0], _arg(args, kwargs, 1, "dim")
            selected(2, "index", source.shape[dim] if source.dim() else 1, index_select_range_check(source, dim),
                     empty_dim_first=source.dim() > 1)
        elif target in (operator.getitem, aten.index.Tensor) and isinstance(args[0], torch.Tensor) \
                and len(node.args) > 1:
            if target is operator.getitem:
                entries = zip(_indexed_dims(node.args[1], args[0].dim()), _indexed_dims(args[1], args[0].dim()))
            else:  # aten.index: one entry per dim, None keeping the dim whole
                entries = (((entry, dim), (value, dim))
                           for dim, (entry, value) in enumerate(zip(node.args[1], args[1])))
            source = args[0]
            for (in_node, dim), (index, _) in entries:
                bounds = self.known(in_node)
                # Indexing gathers nothing from an empty tensor, and checks nothing -- unless the
                # indexed dim itself has no entries.
                if bounds is not None and not (_is_zero(source.numel()) and not _is_zero(source.shape[dim])):
                    _check_index(bounds, index, source.shape[dim], negative_allowed=True)

    def _module(self, node: torch.fx.Node) -> torch.nn.Module:
        return node.graph.owning_module.get_submodule(str(node.target))


def _indexed_dims(index: Any, ndim: int) -> list[tuple[Any, int]]:
    """``x[index]``'s entries paired with the dim of ``x`` each one indexes: entries before an
    Ellipsis count from the front, entries after it from the back; None indexes no dim."""
    entries = list(index) if isinstance(index, tuple) else [index]
    ellipsis = next((i for i, entry in enumerate(entries) if entry is Ellipsis), None)
    front = entries if ellipsis is None else entries[:ellipsis]
    back = [] if ellipsis is None else entries[ellipsis + 1:]
    pairs, dim = [], 0
    for entry in front:
        if entry is not None:
            pairs.append((entry, dim))
            dim += 1
    dim = ndim - 1
    for entry in reversed(back):
        if entry is not None:
            pairs.append((entry, dim))
            dim -= 1
    return [(entry, dim) for entry, dim in pairs if 0 <= dim < ndim]


def _arg(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    return args[position] if position < len(args) else kwargs[name]


def _value_bounds(index: Any, known: KnownValues) -> Bounds | None:
    """The smallest and largest of a known integer index tensor's values (None: not known, or empty)."""
    if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point or index.dtype.is_complex \
            or index.dtype in (torch.bool, torch.uint8):
        return None
    real = known.get(index)
    if real is None or real.numel() == 0:
        return None
    return int(real.min()), int(real.max())


# ops that index ``self`` along ``dim`` with an index tensor: (dim's position, index's position,
# how the CPU kernel refuses an index out of range, whether a negative index counts from the end)
_INDEXING_ALONG_A_DIM = {
    aten.gather.default: (1, 2, check, False),
    aten.scatter.value: (1, 2, check, False), aten.scatter.src: (1, 2, check, False),
    aten.scatter_.value: (1, 2, check, False), aten.scatter_.src: (1, 2, check, False),
    aten.scatter_add.default: (1, 2, check, False), aten.scatter_add_.default: (1, 2, check, False),
    aten.scatter_reduce.two: (1, 2, check, False), aten.scatter_reduce_.two: (1, 2, check, False),
    aten.index_add.default: (1, 2, check_index, False), aten.index_add_.default: (1, 2, check_index, False),
    aten.index_copy.default: (1, 2, check_index, False), aten.index_copy_.default: (1, 2, check_index, False),
    aten.index_fill.int_Scalar: (1, 2, check_index, True), aten.index_fill_.int_Scalar: (1, 2, check_index, True),
    aten.index_fill.int_Tensor: (1, 2, check_index, True), aten.index_fill_.int_Tensor: (1, 2, check_index, True),
}


def check_known_indices(func: Any, args: tuple, kwargs: dict, known: KnownValues) -> None:
    """Refuse, as the CPU kernel does, an op that indexes with known values out of range: embedding,
    index_select, advanced indexing and ``index_put`` (``x[i] = v``), ``take``, and the ops that
    gather or scatter along a dim."""
    along = _INDEXING_ALONG_A_DIM.get(func)
    if along is not None:
        dim_at, index_at, range_check, negative_allowed = along
        source, dim, index = args[0], args[dim_at], args[index_at]
        bounds = _value_bounds(index, known)
        if bounds is not None and source.dim():
            _check_index(bounds, index, source.shape[dim], negative_allowed, range_check=range_check)
        return
    if func is aten.take.default:
        bounds = _value_bounds(_arg(args, kwargs, 1, "index"), known)
        if bounds is not None:
            _check_index(bounds, args[1], args[0].numel(), negative_allowed=True)
        return
    if func in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        func = aten.index.Tensor  # indexes as x[indices] does
    if func is aten.embedding.default:
        weight, indices = args[0], _arg(args, kwargs, 1, "indices")
        bounds = _value_bounds(indices, known)
        if bounds is not None:
            _check_index(bounds, indices, weight.shape[0], False, selects=True,
                         range_check=index_select_range_check(weight, 0))
    elif func is aten.index_select.default:
        source, dim, index = args[0], _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index")
        bounds = _value_bounds(index, known)
        if bounds is not None:
            size = source.shape[dim] if source.dim() else 1
            _check_index(bounds, index, size, False, selects=source.dim() > 1,
                         range_check=index_select_range_check(source, dim))
    elif func is aten.index.Tensor:
        source, indices = args[0], _arg(args, kwargs, 1, "indices")
        dim = 0
        for entry in indices:
            if isinstance(entry, torch.Tensor) and entry.dtype in (torch.bool, torch.uint8):
                dim += entry.dim()  # a mask indexes as many dims as it has
                continue
            bounds = _value_bounds(entry, known)
            if bounds is not None and dim < source.dim() \
                    and not (_is_zero(source.numel()) and not _is_zero(source.shape[dim])):
                _check_index(bounds, entry, source.shape[dim], negative_allowed=True)
            dim += 1
