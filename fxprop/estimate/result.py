"""`Estimate` and `NodeEstimate`: what `fxprop.estimate` found, concrete or symbolic."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import sympy

from .sizes import Comparer, is_symbolic, largest, substitute, text


@dataclass(frozen=True)
class NodeEstimate:
    """One node: its FLOPs, the bytes of the new storages it created (all devices together), and
    the live bytes per device just after it ran (before the values it used last are freed)."""
    name: str
    op: str
    target: str
    flops: Any
    allocated_bytes: Any
    live_bytes: Mapping[str, Any]
    backward: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "target": self.target, "flops": text(self.flops),
                "allocated_bytes": text(self.allocated_bytes),
                "live_bytes": {device: text(size) for device, size in self.live_bytes.items()},
                "backward": self.backward}


@dataclass(frozen=True)
class SymbolBounds:
    """A symbol the counts depend on: ``kind`` "input" (a TensorSpec dim), "size" (a data-dependent
    size, bounded by ``lower`` and ``upper``; ``node`` made it) or "value"."""
    kind: str
    lower: Any
    upper: Any
    node: str | None = None


@dataclass(frozen=True)
class Estimate:
    """Peak memory and FLOPs of a graph, per `fxprop.estimate`; sizes are ints or sympy expressions.

    Attributes:
        flops: total FLOPs (the formulas of ``torch.utils.flop_counter``).
        peak_bytes: per device, the most bytes live at once (inputs and module state included).
        peak_node: per device, the node after which the peak occurs; None when that depends on
            the sizes (then `peak_candidates` has the nodes that can be the peak).
        peak_candidates: per device, ``(node, live bytes)`` of every node that is the peak for
            some sizes (one entry when the sizes are concrete).
        input_bytes, state_bytes: per device, the storages of the graph's inputs, and of its
            ``get_attr`` tensors and called modules' parameters and buffers.
        saved_for_backward_bytes: per device, for a training graph (`fxprop.estimate.training`).
        saved_for_backward: the forward nodes whose storages are saved for backward.
        nodes: a `NodeEstimate` per node, in node order.
        symbols: every symbol the counts may hold, with its kind and bounds.
        flops_unknown: nodes whose FLOPs could not be counted, with the reason (counted as 0).
        comm: for a graph with DTensor values, this rank's collectives by kind (``all_reduce``,
            ``all_gather_into_tensor``, ``reduce_scatter_tensor``...): ``{"count", "send_bytes",
            "receive_bytes"}`` (`fxprop.distributed.dtensors.collective_bytes`); empty otherwise. With DTensors,
            every figure is the rank's: FLOPs on local shapes, bytes of local shards.
    """
    flops: Any
    peak_bytes: Mapping[str, Any]
    peak_node: Mapping[str, str | None]
    peak_candidates: Mapping[str, tuple]
    input_bytes: Mapping[str, Any]
    state_bytes: Mapping[str, Any]
    saved_for_backward_bytes: Mapping[str, Any]
    saved_for_backward: tuple[str, ...]
    nodes: tuple[NodeEstimate, ...]
    symbols: Mapping[str, SymbolBounds] = field(default_factory=dict)
    flops_unknown: Mapping[str, str] = field(default_factory=dict)
    comm: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def from_nodes(cls, nodes: tuple[NodeEstimate, ...], *, input_bytes: Mapping[str, Any],
                   state_bytes: Mapping[str, Any], saved_for_backward_bytes: Mapping[str, Any],
                   saved_for_backward: tuple[str, ...], symbols: Mapping[str, SymbolBounds],
                   flops_unknown: Mapping[str, str], comm: Mapping[str, Mapping[str, int]] | None = None) -> "Estimate":
        """Totals and peaks, computed from the per-node records."""
        flops: Any = 0
        for node in nodes:
            flops = flops + node.flops
        devices = sorted({device for node in nodes for device in node.live_bytes})
        comparer = Comparer(_lower_bounds(symbols, nodes))
        peak_bytes, peak_node, peak_candidates = {}, {}, {}
        for device in devices:
            series = [(node.name, node.live_bytes.get(device, 0)) for node in nodes]
            if any(is_symbolic(size) for _, size in series):
                kept = largest(series, comparer)
                peak_bytes[device] = sympy.Max(*(size for _, size in kept)) if len(kept) > 1 else kept[0][1]
            else:
                kept = [max(series, key=lambda item: item[1])] if series else []  # max keeps the first
                peak_bytes[device] = kept[0][1] if kept else 0
            peak_node[device] = kept[0][0] if len(kept) == 1 else None
            peak_candidates[device] = tuple(kept)
        return cls(flops, peak_bytes, peak_node, peak_candidates, dict(input_bytes), dict(state_bytes),
                   dict(saved_for_backward_bytes), tuple(saved_for_backward), tuple(nodes), dict(symbols),
                   dict(flops_unknown), dict(comm or {}))

    # --- symbolic sizes ------------------------------------------------------------

    @property
    def is_symbolic(self) -> bool:
        """Whether any count still depends on a symbol."""
        return is_symbolic(self.flops) or any(is_symbolic(node.allocated_bytes) or is_symbolic(node.flops) or any(
            is_symbolic(size) for size in node.live_bytes.values()) for node in self.nodes)

    def evaluate(self, sizes: Mapping[str | sympy.Symbol, int] | None = None, **named: int) -> "Estimate":
        """The estimate at given sizes: ``est.evaluate(B=8, T=128)`` or ``est.evaluate({"B": 8})``.

        Symbols left out stay symbolic (data-dependent ones, say); the peaks are recomputed
        from every node, so a peak node that depended on the sizes is decided.
        """
        given = {**(sizes or {}), **named}
        by_name = {name: sympy.Symbol(name) for name in self.symbols}
        by_name.update({symbol.name: symbol for symbol in self._free_symbols()})
        values: dict[sympy.Symbol, int] = {}
        for key, size in given.items():
            name = key.name if isinstance(key, sympy.Symbol) else str(key)
            if name not in by_name:
                from ..errors import InputError
                raise InputError(f"evaluate: no symbol {name!r} in this estimate (its symbols: "
                                 f"{', '.join(sorted(by_name)) or 'none'})")
            values[by_name[name]] = int(size)
        at = lambda value: substitute(value, values)
        nodes = tuple(replace(node, flops=at(node.flops), allocated_bytes=at(node.allocated_bytes),
                              live_bytes={device: at(size) for device, size in node.live_bytes.items()})
                      for node in self.nodes)
        per_device = lambda sizes: {device: at(size) for device, size in sizes.items()}
        symbols = {name: bounds for name, bounds in self.symbols.items() if by_name[name] not in values}
        return Estimate.from_nodes(nodes, input_bytes=per_device(self.input_bytes),
                                   state_bytes=per_device(self.state_bytes),
                                   saved_for_backward_bytes=per_device(self.saved_for_backward_bytes),
                                   saved_for_backward=self.saved_for_backward, symbols=symbols,
                                   flops_unknown=self.flops_unknown)

    def peak_conditions(self, device: str) -> list[tuple[str, Any]]:
        """For each peak candidate on ``device``, the condition on the sizes under which it is the peak."""
        candidates = self.peak_candidates.get(device, ())
        if len(candidates) == 1:
            return [(candidates[0][0], sympy.true)]
        return [(name, sympy.And(*(sympy.Ge(size, other) for other_name, other in candidates if other_name != name)))
                for name, size in candidates]

    def _free_symbols(self) -> set[sympy.Symbol]:
        found: set[sympy.Symbol] = set()
        for value in (self.flops, *(size for node in self.nodes for size in (node.flops, node.allocated_bytes,
                                                                            *node.live_bytes.values()))):
            if isinstance(value, sympy.Basic):
                found |= value.free_symbols
        return found

    # --- reading --------------------------------------------------------------------

    @property
    def activation_peak_bytes(self) -> dict[str, Any]:
        """Per device, the peak less the inputs and module state resident all along."""
        return {device: peak - self.input_bytes.get(device, 0) - self.state_bytes.get(device, 0)
                for device, peak in self.peak_bytes.items()}

    def largest(self, key: str, count: int = 10) -> list[NodeEstimate]:
        """The ``count`` nodes with the most ``"flops"`` or ``"allocated_bytes"`` (concrete counts only)."""
        ranked = [node for node in self.nodes if not is_symbolic(getattr(node, key))]
        ranked = [node for node in ranked if getattr(node, key)]
        return sorted(ranked, key=lambda node: getattr(node, key), reverse=True)[:count]

    def to_dict(self, nodes: bool = True) -> dict[str, Any]:
        """A JSON-ready dict: numbers stay ints, expressions become their text."""
        per_device = lambda sizes: {device: text(size) for device, size in sizes.items()}
        found = {
            "flops": text(self.flops), "peak_bytes": per_device(self.peak_bytes), "peak_node": dict(self.peak_node),
            "peak_candidates": {device: [{"node": name, "bytes": text(size)} for name, size in candidates]
                                for device, candidates in self.peak_candidates.items()},
            "input_bytes": per_device(self.input_bytes), "state_bytes": per_device(self.state_bytes),
            "saved_for_backward_bytes": per_device(self.saved_for_backward_bytes),
            "saved_for_backward": list(self.saved_for_backward),
            "symbols": {name: {"kind": bounds.kind, "lower": text(bounds.lower), "upper": text(bounds.upper),
                               "node": bounds.node} for name, bounds in self.symbols.items()},
            "flops_unknown": dict(self.flops_unknown),
            "comm": {kind: dict(entry) for kind, entry in self.comm.items()},
        }
        if nodes:
            found["nodes"] = [node.to_dict() for node in self.nodes]
        return found

    def to_json(self, **options: Any) -> str:
        """`to_dict` as JSON text; options go to `json.dumps` (e.g. ``indent=2``)."""
        return json.dumps(self.to_dict(), **options)

    def __repr__(self) -> str:
        peaks = ", ".join(f"{device}: {size}" for device, size in self.peak_bytes.items())
        return f"Estimate(flops={self.flops}, peak_bytes={{{peaks}}}, nodes={len(self.nodes)})"


def _lower_bounds(symbols: Mapping[str, SymbolBounds], nodes) -> dict[sympy.Symbol, Any]:
    found: dict[sympy.Symbol, Any] = {}
    names = {name: bounds for name, bounds in symbols.items()}
    for node in nodes:
        for value in (node.flops, node.allocated_bytes, *node.live_bytes.values()):
            if isinstance(value, sympy.Basic):
                for symbol in value.free_symbols:
                    bounds = names.get(symbol.name)
                    if bounds is not None and isinstance(bounds.lower, (int, sympy.Integer)):
                        found[symbol] = bounds.lower
    return found
