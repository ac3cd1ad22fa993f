"""The checks of a `propagate` call made before any node runs: the graph module, its output
node, the inputs' structure and how many there are. Each failure is an `InputError`."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import torch_compat
from ..errors import InputError
from .source import source_line
from .walk import _op_name


def check_graph_module(gm: Any, name: str) -> None:
    if isinstance(gm, torch.fx.GraphModule):
        return
    hint = (" (wrap a bare Graph with torch.fx.GraphModule(root_module, graph))" if isinstance(gm, torch.fx.Graph) else
            " (trace a module first, e.g. torch.fx.symbolic_trace(model) or torch.export.export(model, args).module())"
            if isinstance(gm, torch.nn.Module) else "")
    raise InputError(f"{name} expects a torch.fx.GraphModule, got {type(gm).__name__}{hint}")


def check_output(graph: torch.fx.Graph) -> None:
    """A graph ends in exactly one output node: torch.fx returns at the first output, so nodes
    after it never run, and without one the graph returns nothing. O(outputs), not O(nodes)."""
    outputs = graph.find_nodes(op="output")
    if not outputs:
        raise InputError("the graph has no output node: a graph ends in one, e.g. graph.output(value) "
                         "(was it erased, or the graph built without it?)")
    first = outputs[0]
    after = first.next
    if after.op == "root":
        return
    if after.op == "output":
        raise InputError(f"the graph has {len(outputs)} output nodes ({', '.join(node_text(n) for n in outputs)}): "
                         "a graph returns at its first output and ends there")
    raise InputError(f"node {node_text(after)} comes after the graph's output node %{first.name}: a graph "
                     "returns at its output, so the nodes after it would never run (insert nodes before the "
                     "output, e.g. with graph.inserting_before(output))")


def node_text(node: torch.fx.Node) -> str:
    """``%neg (call_function torch.neg, File "model.py", line 3: y = -x)`` for messages about a node."""
    where = source_line(node)
    return f"%{node.name} ({_op_name(node)}{', ' + where if where else ''})"


def flatten_inputs(gm: torch.fx.GraphModule, inputs: tuple) -> list:
    codegen = torch_compat.pytree_codegen(gm)
    if codegen is not None and codegen.pytree_info.in_spec is not None:
        try:
            return list(codegen.process_inputs(*inputs))
        except Exception as error:
            raise InputError(f"inputs do not match the graph's input structure "
                             f"{codegen.pytree_info.in_spec}: {error}") from None
    return list(inputs)


def check_arity(placeholders: list[torch.fx.Node], inputs: list) -> None:
    if any(str(node.target).startswith("*") for node in placeholders):
        return
    required = [node for node in placeholders if not node.args]
    if len(required) <= len(inputs) <= len(placeholders):
        return
    names = ", ".join(node.name for node in placeholders)
    expected = (f"{len(placeholders)}" if len(required) == len(placeholders)
                else f"{len(required)} to {len(placeholders)}")
    raise InputError(f"the graph takes {expected} inputs ({names}), got {len(inputs)}")
