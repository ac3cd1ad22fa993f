"""The annotated graph as a networkx DiGraph, written as Graphviz DOT text, and rendered by ``dot``.

Nodes are coloured by rule kind and fallback nodes get a thick red border; each edge carries
the shape of the value it carries; edges into a device transfer are bold and name the move.
Repeated blocks (module paths such as ``h.0``, ``h.1``) become cluster subgraphs, or with
``collapse`` one node each, with runs of identical blocks merged into one node with a count.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import networkx as nx
import torch.fx

from .report import describe_value, devices_of, module_path, op_text, source_text

KIND_COLOURS = {"plain": "#f3f3f3", "device": "#d9d2e9", "meta": "#d9ead3", "python": "#cfe2f3",
                "decomposition": "#fff2cc", "fallback": "#f4cccc", "": "#eeeeee"}
FALLBACK_BORDER = "#cc0000"
TRANSFER_COLOUR = "#7030a0"
GRAPHVIZ_HINT = ("SVG output needs graphviz's `dot` program, which is not on PATH. Install graphviz "
                 "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install "
                 "graphviz), or write the DOT text with --dot FILE, which needs nothing else.")

_BLOCK = re.compile(r"^(?P<prefix>(?:[^.]+\.)*?[^.]+)\.(?P<index>\d+)(?:\.|$)")


def block_of(path: str) -> str | None:
    """The outermost repeated block a module path sits in: ``h.0.attn.c_attn`` -> ``h.0``."""
    found = _BLOCK.match(path)
    return f"{found['prefix']}.{found['index']}" if found else None


def annotated_graph(gm: torch.fx.GraphModule) -> nx.DiGraph:
    """One networkx node per FX node (attributes: label, kind, fallback, block), one edge per use."""
    graph = nx.DiGraph(name=type(gm).__name__, block_types={})
    for node in gm.graph.nodes:
        provenance = node.meta.get("fxprop")
        kind = provenance.kind.value if provenance else ""
        shape, dtype, device = describe_value(node.meta.get("val"))
        lines = [node.name, op_text(node)]
        if dtype:
            lines.append(f"{shape} {dtype} {device}")
        lines.append(f"[{kind}]" + (f" {provenance.fallback_bytes:,} B" if kind == "fallback" else ""))
        source = source_text(node, width=48)
        if source:
            lines.append(source)
        path = module_path(node)
        block = block_of(path) if path else None
        if block and not graph.graph["block_types"].get(block):
            graph.graph["block_types"][block] = _module_type(node, block)
        graph.add_node(node.name, label="\n".join(lines), kind=kind, fallback=kind == "fallback",
                       placed=bool(provenance and provenance.device_rule), block=block, module=path,
                       signature=_signature(node, kind))
    sizes: dict[str, int] = {}
    for _, block in graph.nodes(data="block"):
        if block:
            sizes[block] = sizes.get(block, 0) + 1
    for name, block in list(graph.nodes(data="block")):
        if block and sizes[block] == 1:  # a one-module block (stem.0: a conv) is just a node
            graph.nodes[name]["block"] = None
    for node in gm.graph.nodes:
        targets = devices_of(node)
        transfer = graph.nodes[node.name]["placed"]
        for arg in node.all_input_nodes:
            shape, dtype, _ = describe_value(arg.meta.get("val"))
            moved = [d for d in devices_of(arg) if targets and d not in targets] if transfer else []
            label = shape if dtype else ""
            if moved:
                label = f"{label}\n{moved[0]} -> {targets[0]}".strip()
            graph.add_edge(arg.name, node.name, label=label, transfer=bool(moved))
    return graph


def _module_type(node: torch.fx.Node, path: str) -> str:
    """The class name of the module at ``path``, from the tracer's ``nn_module_stack`` (traced
    GraphModules keep only the leaf modules they call, so the parent's class is gone)."""
    for found, kind in (node.meta.get("nn_module_stack") or {}).values():
        if found == path:
            return kind.__name__ if isinstance(kind, type) else str(kind).rpartition(".")[2]
    return ""


def _signature(node: torch.fx.Node, kind: str) -> tuple:
    """What must match for two blocks to be "the same layer": ops, kinds and values, not names."""
    path = module_path(node)
    block = block_of(path) if path else None
    local = path[len(block):] if block else path
    return (node.op, op_text(node).split(":")[0], local, kind, describe_value(node.meta.get("val")))


def collapse_blocks(graph: nx.DiGraph) -> nx.DiGraph:
    """Each block becomes one node; consecutive blocks with equal signatures merge, with a count."""
    members: dict[str, list[str]] = {}
    for name, data in graph.nodes(data=True):
        if data["block"]:
            members.setdefault(data["block"], []).append(name)
    groups: list[list[str]] = []  # runs of block names to merge
    for block in members:
        previous = groups[-1][-1] if groups else None
        if (previous is not None and _parent(previous) == _parent(block)
                and _index(block) == _index(previous) + 1
                and _block_signature(graph, members[previous]) == _block_signature(graph, members[block])):
            groups[-1].append(block)
        else:
            groups.append([block])
    owner: dict[str, str] = {}
    collapsed = nx.DiGraph(**graph.graph)
    types = graph.graph.get("block_types", {})
    for run in groups:
        count = len(run)
        name = run[0] if count == 1 else f"{run[0]}-{_index(run[-1])}"
        kinds = [graph.nodes[n]["kind"] for n in members[run[0]]]  # the blocks of a run have equal signatures
        fallback = "fallback" in kinds
        summary = ", ".join(f"{kind} {kinds.count(kind)}" for kind in dict.fromkeys(kinds))
        label = (f"{name}  {types.get(run[0], '')}" + (f" x{count}" if count > 1 else "")).rstrip()
        label += f"\n{len(members[run[0]])} nodes{' per block' if count > 1 else ''}\n[{summary}]"
        dominant = "fallback" if fallback else max(set(kinds), key=kinds.count)
        collapsed.add_node(name, label=label, kind=dominant, fallback=fallback, block=None, count=count)
        for block in run:
            for member in members[block]:
                owner[member] = name
    for name, data in graph.nodes(data=True):
        if name not in owner:
            collapsed.add_node(name, **data)
            owner[name] = name
    for source, target, data in graph.edges(data=True):
        u, v = owner[source], owner[target]
        if u != v and not collapsed.has_edge(u, v):
            collapsed.add_edge(u, v, **data)
    return collapsed


def _parent(block: str) -> str:
    return block.rpartition(".")[0]


def _index(block: str) -> int:
    return int(block.rpartition(".")[2])


def _block_signature(graph: nx.DiGraph, names: list[str]) -> tuple:
    return tuple(graph.nodes[name]["signature"] for name in names)


# --- DOT text --------------------------------------------------------------------------

def _quote(text: Any) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attributes(items: dict[str, Any]) -> str:
    return "[" + ", ".join(f"{key}={_quote(value)}" for key, value in items.items()) + "]"


def node_style(data: dict[str, Any]) -> dict[str, Any]:
    style = {"label": data["label"], "fillcolor": KIND_COLOURS.get(data["kind"], KIND_COLOURS[""])}
    if data.get("fallback"):
        style.update(color=FALLBACK_BORDER, penwidth="3")
    if data.get("count", 1) > 1:
        style.update(shape="box3d", style="filled")
    return style


def edge_style(data: dict[str, Any]) -> dict[str, Any]:
    style = {"label": data.get("label", "")}
    if data.get("transfer"):
        style.update(color=TRANSFER_COLOUR, penwidth="2.5", style="bold", fontcolor=TRANSFER_COLOUR)
    return style


def to_dot(graph: nx.DiGraph, title: str = "", legend: bool = True) -> str:
    """Graphviz DOT text for an `annotated_graph` (or `collapse_blocks`) DiGraph."""
    lines = ["digraph fxprop {",
             f"  graph [rankdir=\"TB\", fontname=\"Helvetica\", label={_quote(title)}, labelloc=\"t\"];",
             '  node [shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10"];',
             '  edge [fontname="Helvetica", fontsize="9"];']
    clusters: dict[str | None, list[str]] = {}
    for name, data in graph.nodes(data=True):
        clusters.setdefault(data.get("block"), []).append(name)
    for block, names in clusters.items():
        indent = "  "
        if block is not None:
            lines.append(f"  subgraph {_quote('cluster_' + block)} {{")
            label = f"{block}  {graph.graph.get('block_types', {}).get(block, '')}".rstrip()
            lines.append(f"    graph [label={_quote(label)}, style=\"dashed\"];")
            indent = "    "
        for name in names:
            lines.append(f"{indent}{_quote(name)} {_attributes(node_style(graph.nodes[name]))};")
        if block is not None:
            lines.append("  }")
    for source, target, data in graph.edges(data=True):
        lines.append(f"  {_quote(source)} -> {_quote(target)} {_attributes(edge_style(data))};")
    if legend:
        lines.append('  subgraph "cluster_legend" {')
        lines.append('    graph [label="rule kind", style="solid"];')
        for kind, colour in KIND_COLOURS.items():
            if kind:
                extra = {"color": FALLBACK_BORDER, "penwidth": "3"} if kind == "fallback" else {}
                lines.append(f"    {_quote('legend_' + kind)} "
                             f"{_attributes({'label': kind, 'fillcolor': colour, **extra})};")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def have_dot() -> bool:
    return shutil.which("dot") is not None


def render_svg(dot_text: str, path: str) -> None:
    """Run graphviz's ``dot -Tsvg``; `GraphvizError` says how to install it when it is absent."""
    program = shutil.which("dot")
    if program is None:
        raise GraphvizError(GRAPHVIZ_HINT)
    finished = subprocess.run([program, "-Tsvg", "-o", path], input=dot_text, text=True, capture_output=True)
    if finished.returncode != 0:
        raise GraphvizError(f"dot -Tsvg failed ({finished.returncode}): {finished.stderr.strip()}")


class GraphvizError(Exception):
    """``dot`` is not installed, or it failed to render."""
