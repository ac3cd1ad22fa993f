"""What `propagate` found, read back from an annotated graph: rows, records and a summary.

Everything here only reads ``node.meta`` and ``gm.meta["fxprop"]``; the command line
(`fxprop.cli`) renders it as a table, JSON, Markdown or a picture.

>>> import torch, fxprop
>>> from fxprop.cli.report import node_records, summarize
>>> gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 2))
>>> _ = fxprop.propagate(gm, fxprop.TensorSpec((3, 4)))
>>> [(r["name"], r["kind"], r["outputs"][0]["shape"]) for r in node_records(gm) if r["op"] != "get_attr"]
[('input_1', 'python', [3, 4]), ('linear', 'meta', [3, 2]), ('output', 'python', [3, 2])]
>>> summarize(gm)["kinds"]
{'python': 4, 'meta': 1}
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable

import torch

from ..call import tensors_of
from ..engine.source import source_location
from ..symbolic import user_shape
import torch.fx

NODE_HEADER = ("node", "op", "rule kind", "shape", "dtype", "device")
SOURCE_HEADER = (*NODE_HEADER, "source")



def describe_value(value: Any) -> tuple[str, str, str]:
    """(shape, dtype, device) columns for a node's ``meta["val"]``."""
    if isinstance(value, torch.Tensor):
        return (_shape_text(value.shape), str(value.dtype).removeprefix("torch."), str(value.device))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        columns = list(zip(*(describe_value(v) for v in value)))
        if len(value) > 1 and len(set(columns[0])) == 1:  # e.g. split into equal chunks: "3 x (2, 16, 64)"
            return (f"{len(value)} x {columns[0][0]}", *_joined(columns[1:]))  # type: ignore[return-value]
        return tuple(_joined(columns))  # type: ignore[return-value]
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Size)):
        value = user_shape(value)
    text = repr(value)
    return (text if len(text) <= 40 else text[:37] + "...", "", "")


def _joined(columns: list[tuple[str, ...]]) -> list[str]:
    return [column[0] if len(set(column)) == 1 else " | ".join(column) for column in columns]


def _shape_text(shape: Iterable) -> str:
    dims = [str(d) for d in user_shape(shape)]
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(dims) + ")"


def op_text(node: torch.fx.Node) -> str:
    if not node.op.startswith("call"):
        return node.op
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"{node.op}:{target}"


def source_text(node: torch.fx.Node, width: int = 60) -> str:
    where = source_location(node)
    if where is None:
        return ""
    text = f"{os.path.basename(where['file'])}:{where['line']}  {where['code']}".rstrip()
    return text if len(text) <= width else text[:width - 3] + "..."


def module_path(node: torch.fx.Node) -> str:
    """The dotted path of the module that produced ``node`` ("" for the root module)."""
    if node.op == "call_module":
        return str(node.target)
    if node.op == "get_attr":
        return str(node.target).rpartition(".")[0]
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path if isinstance(path, str) else ""
    return ""


def node_rows(gm: torch.fx.GraphModule, source: bool = False) -> list[tuple[str, ...]]:
    """One row per node: the columns of `NODE_HEADER` (or `SOURCE_HEADER` when ``source``)."""
    rows = []
    for node in gm.graph.nodes:
        provenance = node.meta.get("fxprop")
        row = (node.name, op_text(node), provenance.kind.value if provenance else "", *describe_value(node.meta.get("val")))
        rows.append((*row, source_text(node)) if source else row)
    return rows


def format_table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    rows = list(rows)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)])


# --- JSON-ready records -----------------------------------------------------------------

def _dim(d: Any) -> int | str:
    return d if isinstance(d, int) else str(d)


def tensor_record(tensor: torch.Tensor) -> dict[str, Any]:
    return {"shape": [_dim(d) for d in tensor.shape], "dtype": str(tensor.dtype).removeprefix("torch."),
            "device": str(tensor.device), "stride": [_dim(s) for s in tensor.stride()]}


def devices_of(node: torch.fx.Node) -> list[str]:
    return list(dict.fromkeys(str(t.device) for t in tensors_of(node.meta.get("val"))))


def node_records(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """One JSON-ready dict per node (the ``nodes`` of ``fxprop run --format json``)."""
    records = []
    for node in gm.graph.nodes:
        provenance = node.meta.get("fxprop")
        value = node.meta.get("val")
        tensors = tensors_of(value)
        records.append({
            "name": node.name,
            "op": node.op,
            "target": op_text(node).partition(":")[2] or str(node.target),
            "args": [arg.name for arg in node.all_input_nodes],
            "kind": provenance.kind.value if provenance else None,
            "rule": provenance.rule if provenance else None,
            "device_rule": provenance.device_rule if provenance else None,
            "via": provenance.via if provenance else None,
            "fallback_bytes": provenance.fallback_bytes if provenance else 0,
            "outputs": [tensor_record(t) for t in tensors],
            "value": None if tensors else _short_repr(value),
            "module": module_path(node),
            "source": source_location(node),
        })
    return records


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def device_transfers(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """Nodes placed by a device rule whose result lives on a device none of their tensor inputs is on."""
    transfers = []
    for node in gm.graph.nodes:
        provenance = node.meta.get("fxprop")
        if provenance is None or getattr(provenance, "device_rule", None) is None:
            continue
        sources = list(dict.fromkeys(d for arg in node.all_input_nodes for d in devices_of(arg)))
        targets = devices_of(node)
        moved = [d for d in targets if d not in sources]
        if sources and moved:
            transfers.append({"node": node.name, "from": sources, "to": moved[0] if len(moved) == 1 else moved,
                              "source": source_location(node)})
    return transfers


def fallback_nodes(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    return [{"node": node.name, "op": op_text(node), "rule": node.meta["fxprop"].rule,
             "fallback_bytes": node.meta["fxprop"].fallback_bytes, "source": source_location(node)}
            for node in gm.graph.nodes
            if node.meta.get("fxprop") is not None and node.meta["fxprop"].kind == "fallback"]


def summarize(gm: torch.fx.GraphModule, seconds: float | None = None) -> dict[str, Any]:
    """The summary of one propagation: what ``gm.meta["fxprop"]`` holds, plus derived facts."""
    meta = gm.meta.get("fxprop", {})
    summary: dict[str, Any] = {
        "nodes": len(gm.graph.nodes),
        "kinds": dict(meta.get("kinds", {})),
        "fallback_bytes": meta.get("fallback_bytes", 0),
        "fallback_nodes": fallback_nodes(gm),
        "device_transfers": device_transfers(gm),
        "symbols": _json_safe(meta.get("symbols")),
        "assumptions": _json_safe(meta.get("assumptions")),
        "cache": _json_safe(meta.get("cache")),
    }
    if seconds is not None:
        summary["seconds"] = round(seconds, 4)
    return summary


def _json_safe(value: Any) -> Any:
    """Plain JSON data: dataclasses (e.g. a symbol's bounds) become dicts, sympy integers ints."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if getattr(value, "is_Integer", False):
        return int(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _json_safe(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(item) for item in value]
    return str(value)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as readable lines, ``"label: text"``, for the table and Markdown formats."""
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(summary["kinds"].items(), key=lambda kv: -kv[1]))
    lines = [("nodes", f"{summary['nodes']}  ({kinds})"),
             ("fallback", f"{_count(len(summary['fallback_nodes']), 'node')}, "
                          f"{summary['fallback_bytes']:,} bytes materialized"
              + "".join(f"\n    %{f['node']} {f['op']}: {f['fallback_bytes']:,} bytes"
                        for f in summary["fallback_nodes"]))]
    transfers = summary["device_transfers"]
    lines.append(("device transfers", f"{len(transfers)}" + "".join(
        f"\n    %{t['node']}: {', '.join(t['from'])} -> {t['to']}" for t in transfers)))
    if summary.get("symbols"):
        lines.append(("symbols", _inline(summary["symbols"])))
    if summary.get("assumptions"):
        lines.append(("assumptions", _inline(summary["assumptions"])))
    if summary.get("seconds") is not None:
        lines.append(("time", f"{summary['seconds']:.3f} s"))
    return [f"{label}: {text}" for label, text in lines]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _symbol_text(name: str, info: Any) -> str:
    if isinstance(info, dict) and "lower" in info and "upper" in info:
        origin = ""
        if info.get("kind"):
            origin = f" ({info['kind']}" + (f" of %{info['node']}" if info.get("node") else "") + ")"
        return f"{name} in [{info['lower']}, {info['upper']}]{origin}"
    return f"{name} = {info}"


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(_symbol_text(key, item) for key, item in value.items())
    if isinstance(value, list):
        return "; ".join(str(item) for item in value)
    return str(value)
