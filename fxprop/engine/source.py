"""Where in the user's code a node came from, read from the stack trace the tracer recorded."""
from __future__ import annotations

import os
import re
from typing import Any

import torch
import torch.fx

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def source_location(node: torch.fx.Node) -> dict[str, Any] | None:
    """The innermost frame of the node's stack trace in the user's code: file, line and code."""
    trace = node.meta.get("stack_trace") or node.stack_trace
    if not trace:
        return None
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = []
    for i, line in enumerate(lines):
        found = _FRAME.match(line)
        if found:
            code = lines[i + 1] if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            frames.append({"file": found["file"], "line": int(found["line"]), "code": code})
    users = [frame for frame in frames if not frame["file"].startswith(_TORCH_DIR)] or frames
    return users[-1] if users else None


def source_line(node: torch.fx.Node) -> str | None:
    """``File "model.py", line 42: y = x @ w`` for error messages, or None when nothing was recorded."""
    where = source_location(node)
    if where is None:
        return None
    text = f'File "{where["file"]}", line {where["line"]}'
    return f"{text}: {where['code']}" if where["code"] else text
