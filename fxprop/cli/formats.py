"""``--format table|json|md``: one annotated graph and its summary as text.

The JSON document (``SCHEMA_VERSION`` 1) is described in docs/cli.md, "JSON"; with
``--estimate`` it also has an ``"estimate"`` key: `fxprop.Estimate.to_dict`, per-node records included.
"""
from __future__ import annotations

import json
from typing import Any

import torch
import torch.fx

from ..estimate import Estimate
from .report import SOURCE_HEADER, format_table, node_records, node_rows, summary_lines
from .estimate_report import estimate_lines

SCHEMA_VERSION = 1
FORMATS = ("table", "json", "md")


def document(gm: torch.fx.GraphModule, summary: dict[str, Any], origin: str, trace: str,
             inputs: tuple, estimate: Estimate | None = None) -> dict[str, Any]:
    found = {"schema_version": SCHEMA_VERSION, "graph": {"origin": origin, "trace": trace},
             "inputs": [_describe_input(value) for value in inputs],
             "nodes": node_records(gm), "summary": summary}
    if estimate is not None:
        found["estimate"] = estimate.to_dict()
    return found


def _describe_input(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return {"shape": [d if isinstance(d, int) else str(d) for d in shape],
                "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}
    return repr(value)


def render(fmt: str, gm: torch.fx.GraphModule, summary: dict[str, Any], title: str, origin: str = "",
           trace: str = "", inputs: tuple = (), estimate: Estimate | None = None) -> str:
    if fmt == "json":
        return json.dumps(document(gm, summary, origin, trace, inputs, estimate), indent=2)
    extra = estimate_lines(estimate) if estimate is not None else []
    if fmt == "md":
        text = markdown(gm, summary, title)
        return "\n".join([text, "", "**Estimate**", "", "```text", *extra, "```"]) if extra else text
    return "\n".join([title, "", format_table(SOURCE_HEADER, node_rows(gm, source=True)), "",
                      "summary", *("  " + line for line in summary_lines(summary)), *([""] + extra if extra else [])])


def markdown(gm: torch.fx.GraphModule, summary: dict[str, Any], title: str) -> str:
    escape = lambda cell: str(cell).replace("|", "\\|")
    rows = node_rows(gm, source=True)
    lines = [f"### {title}", "", "| " + " | ".join(SOURCE_HEADER) + " |",
             "|" + "---|" * len(SOURCE_HEADER)]
    lines += ["| " + " | ".join(f"`{escape(c)}`" if c and i == len(row) - 1 else escape(c)
                                for i, c in enumerate(row)) + " |" for row in rows]
    lines += ["", "**Summary**", ""]
    for line in summary_lines(summary):
        head, *rest = line.split("\n")
        lines.append(f"- {head}")
        lines += [f"  - {item.strip()}" for item in rest]
    return "\n".join(lines)
