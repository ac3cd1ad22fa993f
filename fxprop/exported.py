"""ExportedPrograms: the graph module and one value per entry of its signature's inputs.

`torch.export` lifts parameters, buffers and constants into placeholders; the program holds
their values (``state_dict``, ``constants``) and the user passes the rest. Without user
inputs, the placeholders' own ``meta["val"]`` are propagated: the FakeTensors export traced
with, in the program's ShapeEnv, so results stay in its symbols (``range_constraints``) and
the program can still be saved, loaded and decomposed.
"""
from __future__ import annotations

from typing import Any

import torch

from .errors import InputError
from .torch_compat import pytree


def program_inputs(program: torch.export.ExportedProgram, inputs: tuple) -> list:
    """One value per placeholder of ``program.graph_module``."""
    placeholders = [node for node in program.graph_module.graph.nodes if node.op == "placeholder"]
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
    out_spec = program.call_spec.out_spec
    return pytree.tree_unflatten(mine, out_spec) if out_spec is not None else tuple(mine)


_END = object()


def _flat_user_inputs(program: torch.export.ExportedProgram, inputs: tuple) -> list:
    in_spec = program.call_spec.in_spec
    if in_spec is not None and in_spec.num_children == 2:  # (args, kwargs)
        flat, spec = pytree.tree_flatten((tuple(inputs), {}))
        if spec == in_spec:
            return flat
    return pytree.tree_leaves(tuple(inputs))


def _count_user(program: torch.export.ExportedProgram) -> int:
    return sum(spec.kind.name == "USER_INPUT" for spec in program.graph_signature.input_specs)
