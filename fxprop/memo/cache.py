"""Memoized rule results: a bounded, thread-safe cache keyed by everything a result depends on.

A key holds the call's target and a signature of every argument -- for tensors the shape,
strides, storage offset, dtype, logical device, ``requires_grad``, whether it is a leaf and
its conj/neg bits; for python values their type and value -- and the environment the rules
read (`fxprop.memo.backend_flags`: grad mode, default dtype, the oneDNN, cuDNN and SDPA backend
flags), the default device and the rule registry's generation. Calls that mutate (in-place ops, ``out=``,
``inplace=True``), calls with side effects, calls on inputs whose values are known (a rule
may read them) and calls by targets the user defined (a cache entry would keep them alive)
are never memoized (`fxprop.memo.purity`). Calls with symbolic sizes are memoized within their own propagation only,
keyed by their sizes' expressions (`symbolic_signature`), and never when they create symbols.

A hit replays what the call cost: fallback bytes count against the call's cap again. With
``cache="verify"`` (or ``FXPROP_CACHE_VERIFY=1``) every hit is recomputed and compared.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any, Hashable

import torch

from ..devices import device_of, tag
from ..call import Call, tensors_of
from .purity import is_pure, returns_several_views
from ..errors import FallbackLimitError
from ..torch_compat import (DelayedError, allocations_measurable, autograd_restricts_in_place,
                            creation_meta, functorch_depth, has_symbolic_sizes, is_view, meta_over_storage_of,
                            storage_key, view_base)

from .signatures import _SYMBOLIC_SCALARS, Uncacheable, _expression, signature

VERIFY_ENVIRONMENT_VARIABLE = "FXPROP_CACHE_VERIFY"

# --- the cache ---------------------------------------------------------------------------

MAX_GRAPHS = 64
MAX_GRAPH_NODES = 1 << 16
MAX_SIGHTINGS = 1 << 12


class RuleCache:
    """A bounded map from call signatures to recorded results; the oldest entries go first.
    It also keeps whole graphs' results for replay (`fxprop.memo.replay`), cleared with it.

    First-in-first-out rather than least-recently-used: a hit then costs one hash of its key,
    and the entries a graph keeps hitting (its repeated blocks) are re-added as soon as they
    are evicted.
    """

    def __init__(self, max_entries: int = 8192):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            from ..errors import InputError
            raise InputError(f"RuleCache max_entries must be a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._graphs: dict[Hashable, Any] = {}  # whole graphs (`fxprop.memo.replay`), oldest first
        self._graph_nodes = 0
        self._sighted: dict[Hashable, None] = {}  # graphs' sizes propagated so far, oldest first
        self.replays = 0

    def get(self, key: Hashable) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            return entry

    def put(self, key: Hashable, entry: Any) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]

    def graph(self, key: Hashable) -> Any:
        """What a propagation of the graph under ``key`` staged (`fxprop.memo.replay`), or None."""
        with self._lock:
            entry = self._graphs.get(key)
            if entry is not None:
                self.replays += 1
            return entry

    def seen_before(self, sighting: Hashable) -> bool:
        """Whether a graph like this (``sighting``: its size) was propagated before; notes it if not."""
        with self._lock:
            if sighting in self._sighted:
                return True
            self._sighted[sighting] = None
            if len(self._sighted) > MAX_SIGHTINGS:
                del self._sighted[next(iter(self._sighted))]
            return False

    def keep_graph(self, key: Hashable, entry: Any) -> None:
        """Keep a whole graph's entry; the oldest go first beyond `MAX_GRAPHS` graphs or
        `MAX_GRAPH_NODES` nodes in all (an entry costs about a kilobyte per node)."""
        size = len(entry.nodes)
        if size > MAX_GRAPH_NODES:
            return
        with self._lock:
            previous = self._graphs.pop(key, None)
            if previous is not None:
                self._graph_nodes -= len(previous.nodes)
            self._graphs[key] = entry
            self._graph_nodes += size
            while len(self._graphs) > MAX_GRAPHS or self._graph_nodes > MAX_GRAPH_NODES:
                oldest = next(iter(self._graphs))
                self._graph_nodes -= len(self._graphs.pop(oldest).nodes)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._graphs.clear()
            self._sighted.clear()
            self._graph_nodes = 0
            self.hits = self.misses = self.replays = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": len(self._entries),
                    "max_entries": self.max_entries, "graphs": len(self._graphs), "replays": self.replays}


rule_cache = RuleCache()


def verify_by_default() -> bool:
    return os.environ.get(VERIFY_ENVIRONMENT_VARIABLE, "") not in ("", "0")


# --- recipes: results stored without holding any tensor -----------------------------------------

@dataclass(frozen=True)
class TensorRecord:
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    requires_grad: bool
    device: torch.device
    # with symbolic sizes, the bytes of the recorded result's storage; no part of the record's identity
    storage_bytes: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AliasRecord:
    """A result that is an input itself (``view`` None) or a view of one: rebuilt as a view of
    the new call's input, so that autograd and in-place ops see the alias as torch would.
    ``creation``: how autograd made the view (`creation_meta`), which a rebuild must match, as it
    decides what autograd refuses in place later."""
    index: int
    view: TensorRecord | None
    creation: Any = None


@dataclass(frozen=True)
class SequenceRecord:
    kind: type
    parts: tuple


@dataclass(frozen=True)
class Entry:
    """A memoized result and what the call cost."""
    recipe: Any
    provenance: Any
    mentions_alias: bool
    unlinked_grad: bool  # rebuilding it makes a tensor that requires grad but has no autograd history
    values: tuple = ()  # (position among the result's tensors, the real values it holds) of results with known values
    called_again: bool = False  # rebuilt by calling the op again (`split` and the like: autograd restricts their views)


def recipe(value: Any, inputs: list[torch.Tensor]) -> Any:
    """An immutable description of a result, or None when it holds something that cannot be shared."""
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided or value.is_conj() or value.is_neg():
            return None  # a record rebuilds neither layout nor a lazy conjugation or negation
        positions = [index for index, tensor in enumerate(inputs) if value is tensor]
        if positions:
            # an input given twice: the key does not say which position a later call's result is
            return AliasRecord(positions[0], None) if len(positions) == 1 else None
        offset = value.storage_offset()
        if not isinstance(offset, int):
            return None  # rebuilt fresh, a symbolic offset would need the storage's extent decided
        record = TensorRecord(tuple(value.shape), value.stride(), offset, value.dtype,
                              value.requires_grad, device_of(value), _symbolic_storage_bytes(value))
        shares_storage = any(storage_key(tensor) == storage_key(value) for tensor in inputs)
        if not is_view(value):
            # a result sharing an input's storage that autograd does not call a view (``view(dtype)``
            # through its composite kernel): a fresh tensor would lose the alias
            return None if shares_storage else record
        aliased = [index for index, tensor in enumerate(inputs) if _same_base(value, tensor)]
        if not aliased:
            # a view of an intermediate the graph never sees: a fresh tensor is as good, unless
            # autograd restricts the view in place (made under no_grad: ``F.linear``'s result)
            return None if shares_storage or autograd_restricts_in_place(value) else record
        if len(aliased) > 1:
            return None  # inputs viewing one base (``meshgrid(y[:3], y)``): the key does not say which it views
        index = aliased[0]
        if inputs[index].dtype != value.dtype or inputs[index].requires_grad != value.requires_grad:
            return None
        return AliasRecord(index, record, creation_meta(value))
    if isinstance(value, (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.Size,
                          torch.memory_format, torch.layout, *_SYMBOLIC_SCALARS)):
        return value
    if isinstance(value, (tuple, list)):
        parts = [recipe(item, inputs) for item in value]
        if any(part is None and item is not None for part, item in zip(parts, value)):
            return None
        return SequenceRecord(type(value), tuple(parts))
    return None


def mentions_alias(recipe: Any) -> bool:
    if isinstance(recipe, AliasRecord):
        return True
    return isinstance(recipe, SequenceRecord) and any(mentions_alias(part) for part in recipe.parts)


def unlinked_grad(recipe: Any) -> bool:
    if isinstance(recipe, TensorRecord):
        return recipe.requires_grad
    return isinstance(recipe, SequenceRecord) and any(unlinked_grad(part) for part in recipe.parts)


def _same_base(view: torch.Tensor, tensor: torch.Tensor) -> bool:
    base = view_base(view)
    return tensor is base or (is_view(tensor) and view_base(tensor) is base)


class _MadeOtherwise(Exception):
    """A rebuilt view that autograd made otherwise than the recorded one: a miss."""


def rebuild(recipe: Any, inputs: list[torch.Tensor]) -> Any:
    """A fresh value from a recipe, aliasing ``inputs`` where the recorded result did (raises
    `_MadeOtherwise` where autograd would restrict a rebuilt view otherwise)."""
    if isinstance(recipe, TensorRecord):
        return tag(_fresh_meta(recipe), recipe.device)
    if isinstance(recipe, AliasRecord):
        source = inputs[recipe.index]
        if recipe.view is None:
            return source
        view = recipe.view
        rebuilt = source.as_strided(view.shape, view.stride, view.offset)
        if creation_meta(rebuilt) != recipe.creation:
            # restricted in place otherwise: ``split``'s outputs, a view rebuilt over a restricted source
            raise _MadeOtherwise
        return tag(rebuilt, view.device)
    if isinstance(recipe, SequenceRecord):
        items = [rebuild(part, inputs) for part in recipe.parts]
        if recipe.kind is list:
            return items
        if recipe.kind is tuple:
            return tuple(items)
        if hasattr(recipe.kind, "_fields"):
            return recipe.kind(*items)
        return recipe.kind(items)
    return recipe


def _called_again(call: Call, recorded: Any) -> Any:
    """``split``, ``chunk`` or ``unbind`` called again on the call's own inputs, by torch's own
    kernels, outside fxprop's dispatch: its outputs are views, which those kernels lay out as the
    CPU's do, and autograd restricts them as it restricts the real ones. Checked against the
    recorded result, its devices given as recorded; None (a miss, computed) where they differ."""
    target, args = call.target, call.args
    try:
        value = getattr(args[0], target)(*args[1:], **call.kwargs) if isinstance(target, str) else \
            target(*args, **call.kwargs)
    except Exception:  # a miss: the walk computes the call, and reports what that raises
        return None
    if not isinstance(value, (tuple, list)) or len(value) != len(recorded.parts):
        return None
    for tensor, part in zip(value, recorded.parts):
        if isinstance(tensor, torch.Tensor) and isinstance(part, AliasRecord) and part.view is not None:
            tag(tensor, part.view.device)
    return value if _comparable(recipe(value, call.tensors)) == _comparable(recorded) else None


def _fresh_meta(record: TensorRecord) -> torch.Tensor:
    if record.offset:
        extent = record.offset + 1 + sum((s - 1) * st for s, st in zip(record.shape, record.stride) if s)
        meta = torch.empty(extent, dtype=record.dtype, device="meta").as_strided(record.shape, record.stride, record.offset)
    elif record.storage_bytes is not None:  # its own storage, of the bytes the call's result had, no view
        meta = meta_over_storage_of(record.shape, record.stride, record.dtype, record.storage_bytes)
    else:
        meta = torch.empty_strided(record.shape, record.stride, dtype=record.dtype, device="meta")
    if record.requires_grad:
        # A result of an op is not a leaf: in-place ops on it must stay legal, as they are in torch.
        meta = DelayedError("fxprop: no gradients through propagation results", 1)(meta.requires_grad_(True))
    return meta


def _symbolic_storage_bytes(value: torch.Tensor) -> torch.SymInt | None:
    if type(value) is not torch.Tensor or not any(isinstance(size, torch.SymInt) for size in value.shape):
        return None
    found = value.untyped_storage().nbytes()
    return found if isinstance(found, torch.SymInt) else None


def same_result(first: Any, second: Any, inputs: list[torch.Tensor]) -> bool:
    """Whether two results of one call have the same recipe and the same views restricted in place
    (the verify mode's comparison); sizes compare as expressions, which decides nothing in the ShapeEnv."""
    return (_comparable(recipe(first, inputs)) == _comparable(recipe(second, inputs))
            and _restrictions(first) == _restrictions(second))


def _restrictions(value: Any) -> list[bool]:
    return [is_view(leaf) and autograd_restricts_in_place(leaf) for leaf in tensors_of(value)]


def _comparable(described: Any) -> Any:
    if isinstance(described, TensorRecord):
        return dataclasses.replace(described, shape=tuple(map(_expression, described.shape)),
                                   stride=tuple(map(_expression, described.stride)))
    if isinstance(described, AliasRecord):
        return AliasRecord(described.index, _comparable(described.view), described.creation)
    if isinstance(described, SequenceRecord):
        return SequenceRecord(described.kind, tuple(map(_comparable, described.parts)))
    if isinstance(described, (tuple, list)):  # a torch.Size of symbolic sizes
        return tuple(map(_expression, described))
    return _expression(described)


class _Key:
    """A call's key with its hash computed once: the cache's dict asks for it, and a key is deep."""

    __slots__ = ("parts", "hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self.hash = hash(parts)  # TypeError: something unhashable, so the call is not memoized

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Key) and self.hash == other.hash and self.parts == other.parts


class CallMemo:
    """The cache slot of one call: its key, how a hit is rebuilt, and the cost a hit replays."""

    def __init__(self, cache: RuleCache, key: Hashable, differentiates: bool, op: str):
        self.cache = cache
        self.key = key
        self.differentiates = differentiates
        self.op = op

    @staticmethod
    def for_call(cache: RuleCache, op: str, call: Call, target_key: Any, context: Hashable,
                 differentiates: bool = False, sign: Any = signature) -> "CallMemo | None":
        """The slot of ``call`` (a node's: ``op`` is the node's op); ``target_key()`` stands for
        the target in the key (a module: its state's signature);
        ``context`` is everything else a result depends on (grad mode, backend flags, ...);
        ``differentiates``: the graph may differentiate its values (`may_differentiate`);
        ``sign``: `signature`, or a `TensorSignatures`, or `symbolic_signature` for symbolic sizes."""
        if not is_pure(op, call.target, call.args, call.kwargs) or functorch_depth() > 0:
            return None  # under vmap or grad transforms a tensor's meaning depends on the level: never reused
        try:
            key = _Key((op, target_key(), sign(call.args), sign(call.kwargs), context))
        except (Uncacheable, TypeError):
            return None
        except RuntimeError:  # autograd refuses to read an argument (a view whose base was modified): the op will too
            return None
        return CallMemo(cache, key, differentiates, op)

    def lookup(self, call: Call, fallback_limit_bytes: int) -> tuple[Any, Any, tuple] | None:
        """(result, provenance, known values) of an earlier call identical to ``call``, or None: the known values
        are (position among the result's tensors, real tensor) pairs. A hit whose first run needed the
        fallback costs what that run cost: over ``fallback_limit_bytes`` it raises as that run would."""
        entry = self.cache.get(self.key)
        if entry is None or (self.differentiates and entry.unlinked_grad):
            return None
        if entry.provenance.fallback_bytes and not allocations_measurable():
            return None  # a fresh run counts what it can measure here, as an uncached one does
        provenance = entry.provenance
        if provenance.fallback_bytes > fallback_limit_bytes:
            raise FallbackLimitError(
                f"{provenance.rule}: running it on real tensors needs {provenance.fallback_bytes:,} bytes (its "
                f"inputs, outputs and temporaries when it first ran), over the fallback limit of "
                f"{fallback_limit_bytes:,} bytes (raise it with propagate(..., fallback_limit_bytes=N) or register a rule)")
        inputs = call.tensors if entry.mentions_alias else []
        if entry.called_again:
            value = _called_again(call, entry.recipe)
            return (value, provenance, entry.values) if value is not None else None
        try:
            return rebuild(entry.recipe, inputs), provenance, entry.values
        except _MadeOtherwise:
            return None

    def store(self, call: Call, value: Any, provenance: Any, values: tuple = ()) -> None:
        """Keep the result of ``call``; ``values``: the real values its tensors hold, as `lookup` gives them back
        (the known values of a call's inputs are part of its key, so they follow from it)."""
        if provenance.fallback_bytes and not allocations_measurable():
            return  # the run's temporaries went unmeasured: its bytes are not the call's
        # torch's own split of symbolic sizes would guard on them in the caller's ShapeEnv: such a call is
        # rebuilt, and its views, restricted otherwise, are misses
        called_again = (returns_several_views(self.op, call.target)
                        and not any(has_symbolic_sizes(tensor) for tensor in call.tensors))
        described = recipe(value, call.tensors)
        if described is not None or value is None:  # a recipe of None: not kept, unless the result is None (a check's)
            self.cache.put(self.key, Entry(described, provenance, mentions_alias(described), unlinked_grad(described),
                                           values, called_again=called_again))
