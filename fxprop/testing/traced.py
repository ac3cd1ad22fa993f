"""Compare a propagated graph with the values torch traced into it (AOT's, dynamo's, export's
``meta["val"]``), symbolic sizes as expressions: `assert_matches_traced`."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..engine.propagation import propagate
from ..torch_compat import is_opaque
from .mismatches import Mismatch, op_label, paired_items, render_mismatches


def traced_values(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Each node's ``meta["val"]`` as the tracer left it, by node name (read before `propagate`
    replaces it)."""
    return {node.name: node.meta["val"] for node in gm.graph.nodes if "val" in node.meta}


def compare_with_traced(gm: torch.fx.GraphModule, traced: dict[str, Any], *,
                        check_strides: bool = True) -> list[Mismatch]:
    """Compare each node's ``meta["val"]`` (fxprop's) with ``traced`` (`traced_values` of the
    tracer's): shapes and strides entry by entry, symbolic ones as expressions, dtype, device,
    ``requires_grad``, python values by equality and opaque objects (a DeviceMesh) as the same
    object, AOT's FakeScriptObject standing for the object it wraps. A placeholder's
    ``requires_grad`` is not compared: it is the input's as given (AOT hands its backward compiler
    inputs that no longer require grad for placeholders it traced as requiring it)."""
    mismatches: list[Mismatch] = []
    for node in gm.graph.nodes:
        if node.op != "output" and node.name in traced:
            found: list[Mismatch] = []
            _compare_traced(node.meta.get("val"), traced[node.name], found, node.name, op_label(node),
                            check_strides, "")
            mismatches += [m for m in found if not (node.op == "placeholder" and m.field.startswith("requires_grad"))]
    return mismatches


def assert_matches_traced(gm: torch.fx.GraphModule, *inputs: Any, check_strides: bool = True,
                          **options: Any) -> None:
    """Propagate a graph its tracer annotated and assert every node matches the tracer's own
    ``meta["val"]``. ``inputs`` are what the graph was traced with (AOT autograd's compilers and
    dynamo's backends receive them as ``example_inputs``); ``options`` go to `fxprop.propagate`."""
    traced = traced_values(gm)
    propagate(gm, *inputs, **options)
    mismatches = compare_with_traced(gm, traced, check_strides=check_strides)
    if mismatches:
        raise AssertionError(render_mismatches(mismatches).replace("real execution", "the tracer", 1))


def _as_expressions(sizes: Any) -> tuple:
    return tuple(str(size) for size in sizes)


def _compare_traced(got: Any, expected: Any, out: list, node: str, op: str, check_strides: bool, path: str) -> None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            out.append(Mismatch(node, op, f"value{path}", "a tensor", type(got).__name__))
            return
        fields = [("shape", _as_expressions(expected.shape), _as_expressions(got.shape)),
                  ("dtype", expected.dtype, got.dtype), ("device", expected.device, got.device),
                  ("requires_grad", expected.requires_grad, got.requires_grad), ("layout", expected.layout, got.layout)]
        if check_strides and expected.layout is torch.strided and got.layout is torch.strided:
            fields.append(("stride", _as_expressions(expected.stride()), _as_expressions(got.stride())))
        out.extend(Mismatch(node, op, f"{name}{path}", want, have) for name, want, have in fields if want != have)
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        for item_path, e, g in paired_items(expected, got, out, node, op, path):
            _compare_traced(g, e, out, node, op, check_strides, item_path)
        return
    if is_opaque(expected):
        if not (got is expected or (is_opaque(got) and expected == got)):
            out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))
        return
    if isinstance(expected, (torch.SymInt, torch.SymFloat, torch.SymBool)) or \
            isinstance(got, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if str(expected) != str(got):
            out.append(Mismatch(node, op, f"value{path}", str(expected), str(got)))
        return
    if expected is not None and (type(expected) is not type(got) or expected != got):
        out.append(Mismatch(node, op, f"value{path}", repr(expected), repr(got)))
