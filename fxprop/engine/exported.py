"""ExportedPrograms: the graph module and one value per entry of its signature's inputs.

`torch.export` lifts parameters, buffers and constants into placeholders; the program holds
their values (``state_dict``, ``constants``) and the user passes the rest. Without user
inputs, the placeholders' own ``meta["val"]`` are propagated: the FakeTensors export traced
with, in the program's ShapeEnv, so results stay in its symbols (``range_constraints``) and
the program can still be saved, loaded and decomposed.

TensorSpec inputs with named dims are computed in the same ShapeEnv, with backed symbols
(`fxprop.symbolic.SymbolicSession.bind_traced`): a name at a dim the program made dynamic is
that dim's symbol, any other a new one. After propagation `user_outputs` brings the program's
``range_constraints`` up to date with the symbols its annotations now use (new input symbols,
the data-dependent symbols fxprop created) and drops ``unbacked_bindings`` that no longer match
a node's value, so that ``torch.export.save``/``load``, ``run_decompositions`` and ``module``
read a consistent program.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from ..call import leaves_of
from ..errors import InputError
from ..symbolic import program_range
from ..torch_compat import FakeTensor, pytree, size_expression


def program_inputs(program: torch.export.ExportedProgram, inputs: tuple) -> list:
    """One value per placeholder of ``program.graph_module``."""
    placeholders = [node for node in program.graph_module.graph.nodes if node.op == "placeholder"]
    _remember_fake_mode(program, placeholders)
    if not inputs:
        missing = [node.name for node in placeholders if "val" not in node.meta]
        if missing:
            raise InputError(f"the program's placeholders {missing} carry no traced value; pass its user inputs")
        return [node.meta["val"] for node in placeholders]
    user_inputs = iter(_flat_user_inputs(program, inputs))
    values = []
    for spec in program.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            try:
                values.append(next(user_inputs))
            except StopIteration:
                raise InputError(f"the program takes {_count_user(program)} user inputs, got fewer") from None
        elif kind in ("PARAMETER", "BUFFER") and spec.target in program.state_dict:
            values.append(program.state_dict[spec.target])
        elif spec.target in program.constants:
            values.append(program.constants[spec.target])
        else:
            raise InputError(f"the program has no value for its {kind.lower()} input {spec.target!r}")
    if next(user_inputs, _END) is not _END:
        raise InputError(f"the program takes {_count_user(program)} user inputs, got more")
    return values


def user_outputs(program: torch.export.ExportedProgram, outputs: Any) -> Any:
    """The program's own outputs (not the buffer mutations export appends), in its output structure."""
    flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    mine = [value for value, spec in zip(flat, program.graph_signature.output_specs)
            if spec.kind.name == "USER_OUTPUT"]
    out_spec = _call_specs(program)[1]
    return pytree.tree_unflatten(mine, out_spec) if out_spec is not None else tuple(mine)


def sync_symbols(program: torch.export.ExportedProgram) -> None:
    """Make ``program.range_constraints`` and each node's ``unbacked_bindings`` agree with the
    values in the nodes' ``meta["val"]``: every symbol they use has a range (as export writes
    one: `fxprop.symbolic.program_range`), a symbol no value uses any more has none,
    and a node keeps only the bindings of unbacked symbols its value holds."""
    from torch.fx.experimental.symbolic_shapes import ValueRanges
    used: set = set()
    env = None
    symbols_of: dict = {}  # by expression: a model's values repeat a few size expressions
    for gm in _graph_modules(program.graph_module):
        for node in gm.graph.nodes:
            sizes = _sizes_in(node.meta.get("val"))
            found: set = set()
            for size in sizes:
                expr = size_expression(size)
                symbols = symbols_of.get(expr)
                if symbols is None:
                    symbols = symbols_of[expr] = expr.free_symbols
                found |= symbols
            used |= found
            bindings = node.meta.get("unbacked_bindings")
            if bindings and not set(bindings) <= found:
                kept = {symbol: path for symbol, path in bindings.items() if symbol in found}
                if kept:
                    node.meta["unbacked_bindings"] = kept
                else:
                    del node.meta["unbacked_bindings"]
            if env is None and sizes:
                env = sizes[0].node.shape_env
    _rehome(program, env)
    constraints = program.range_constraints  # a property without a setter: updated in place
    if env is not None:
        for symbol in used:
            bounds = program_range(env, symbol) if symbol not in constraints else None
            if bounds is not None:
                constraints[symbol] = ValueRanges(*bounds)
    for symbol in [symbol for symbol in constraints if symbol not in used]:
        del constraints[symbol]  # e.g. a dynamic dim given a concrete size: the program is static now


_FAKE_MODES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # program -> export's mode


def _remember_fake_mode(program: torch.export.ExportedProgram, placeholders: list) -> None:
    """The FakeTensorMode the program was traced in (it holds export's ShapeEnv), before
    propagation replaces the placeholders' values."""
    for node in placeholders:
        value = node.meta.get("val")
        if isinstance(value, FakeTensor) and value.fake_mode.shape_env is not None:
            _FAKE_MODES[program] = value.fake_mode
            return
    _FAKE_MODES.pop(program, None)


def _rehome(program: torch.export.ExportedProgram, env: Any) -> None:
    """Values fxprop computed without symbols belong to a FakeTensorMode of its own; give them the
    program's, whose ShapeEnv ``run_decompositions`` needs to re-trace data-dependent ops."""
    mode = _FAKE_MODES.pop(program, None)
    if mode is None or (env is not None and env is not mode.shape_env):
        return
    for gm in _graph_modules(program.graph_module):
        for node in gm.graph.nodes:
            for leaf in pytree.tree_leaves(node.meta.get("val")):
                if isinstance(leaf, FakeTensor) and leaf.fake_mode is not mode:
                    leaf.fake_mode = mode


def _graph_modules(gm: torch.fx.GraphModule) -> list:
    return [module for module in gm.modules() if isinstance(module, torch.fx.GraphModule)]


def _sizes_in(value: Any) -> list:
    """The SymInts, SymFloats and SymBools in a node's value (a tensor's sizes, strides and offset)."""
    found: list = []
    for leaf in leaves_of(value, (torch.Tensor, *_SYMBOLIC)):
        if isinstance(leaf, torch.Tensor):
            found += [size for size in (*leaf.shape, *leaf.stride(), leaf.storage_offset()) if isinstance(size, _SYMBOLIC)]
        else:
            found.append(leaf)
    return found


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _call_specs(program: torch.export.ExportedProgram) -> tuple:
    """``program.call_spec``'s (in_spec, out_spec), read where it reads them: the property defines
    its named tuple's class again on every read."""
    calls = program.module_call_graph
    return (calls[0].signature.in_spec, calls[0].signature.out_spec) if calls else (None, None)


_END = object()


def _flat_user_inputs(program: torch.export.ExportedProgram, inputs: tuple) -> list:
    in_spec = _call_specs(program)[0]
    if in_spec is not None and in_spec.num_children == 2:  # (args, kwargs)
        flat, spec = pytree.tree_flatten((tuple(inputs), {}))
        if spec == in_spec:
            return flat
    return pytree.tree_leaves(tuple(inputs))


def _count_user(program: torch.export.ExportedProgram) -> int:
    return sum(spec.kind.name == "USER_INPUT" for spec in program.graph_signature.input_specs)
