"""Which part of the model each node runs in, cut at a module depth: runs of nodes in graph order.

A node's module path comes from ``meta["nn_module_stack"]`` (torch.export, dynamo, and
`torch.fx.symbolic_trace`, whose tracer records it too), else from a ``call_module`` or
``get_attr`` target. At depth N the path keeps its first N names: ``h.0.attn.c_attn`` is
``h`` at depth 1, ``h.0`` at 2 and ``h.0.attn`` at 3. The default depth is the one of the
repeated layers (`default_depth`). Only calls mark where a part of the model runs:
placeholders, attributes and the output sit inside whatever span surrounds them.

>>> import torch
>>> from fxprop import examples
>>> gm = torch.fx.symbolic_trace(examples.gpt_example()[0])
>>> labels = node_labels(gm)
>>> [(span.label, span.start < span.stop) for span in module_spans(labels)][:4]
[('wte', False), ('wpe', False), ('h.0', True), ('h.1', True)]
>>> [span.label for span in module_spans(node_labels(gm, depth=3))][2:6]
['h.0.ln_1', 'h.0.attn', 'h.0', 'h.0.ln_2']
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch.fx

from .report import module_path
from .drawing import block_of

_DYNAMO_ROOT = re.compile(r"^L\['self'\]\.?")
_INDEX = re.compile(r"\[(\d+)\]")
_KEY = re.compile(r"(?:\._modules)?\[['\"]([^'\"]+)['\"]\]")


@dataclass(frozen=True)
class Span:
    """Nodes ``start`` to ``stop`` (positions in graph order, both included) run in module ``label``."""
    label: str
    start: int
    stop: int


def normalized_path(path: str) -> str:
    """Dynamo writes ``L['self'].h[0]._modules['attn']``; the module's own name is ``h.0.attn``."""
    path = _DYNAMO_ROOT.sub("", path)
    path = _KEY.sub(lambda found: "." + found[1], path)
    return _INDEX.sub(lambda found: "." + found[1], path).strip(".")


def node_path(node: torch.fx.Node) -> str:
    """The module the node runs in ("" for the root): the innermost entry of its module stack."""
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return normalized_path(path) if isinstance(path, str) else ""
    return normalized_path(module_path(node))


def default_depth(paths: Sequence[str]) -> int:
    """The depth of the repeated layers (``h.0``, ``model.layers.0``) that hold the most nodes;
    1 (the root's children) when nothing repeats."""
    depths = Counter(block.count(".") + 1 for block in map(block_of, paths) if block)
    return depths.most_common(1)[0][0] if depths else 1


def node_labels(gm: torch.fx.GraphModule, depth: int | None = None) -> list[str | None]:
    """Per node in graph order: its module path cut at ``depth`` ("" for the root), or None for a
    node that is not a call (it belongs to no module's run)."""
    paths = [node_path(node) if node.op.startswith("call") else None for node in gm.graph.nodes]
    if depth is None:
        depth = default_depth([path for path in paths if path])
    return [None if path is None else ".".join(path.split(".")[:depth]) for path in paths]


def module_spans(labels: Sequence[str | None]) -> list[Span]:
    """Runs of consecutive calls in the same module; calls in the root break runs and get no span."""
    spans: list[Span] = []
    current: str | None = None
    for position, label in enumerate(labels):
        if label is None:
            continue
        if label and label == current:
            spans[-1] = Span(label, spans[-1].start, position)
        elif label:
            spans.append(Span(label, position, position))
        current = label
    return spans


def label_at(labels: Sequence[str | None], position: int) -> str:
    """The module of the node at ``position``; a node that is not a call takes the last call's before it."""
    for label in reversed(labels[:position + 1]):
        if label is not None:
            return label
    return ""
