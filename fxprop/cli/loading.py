"""Where `fxprop run` gets its graph and inputs: a ``module:callable``, ``--input`` specs, or a saved program.

>>> parse_input_spec("8,16:int64@cuda:0")
TensorSpec(shape=(8, 16), dtype=torch.int64, device=device(type='cuda', index=0), stride=None, requires_grad=False)
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Any, Sequence

import torch
import torch.fx

from ..engine.inputs import TensorSpec


class UsageError(Exception):
    """The command line names something that does not exist or cannot be read (exit code 2)."""


class LoadError(Exception):
    """The user's code or file failed while fxprop was loading it (exit code 1)."""


@dataclass
class Loaded:
    gm: torch.fx.GraphModule
    inputs: tuple
    origin: str
    trace: str


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_input_spec(text: str) -> TensorSpec:
    """``"B,T:int64@cuda:0"`` -> a `TensorSpec`: dims (ints or symbolic names), then ``:dtype``, then ``@device``.

    The dtype defaults to float32 and the device to cpu; ``":float32"`` (no dims) is a 0-dim tensor.
    Symbolic names are passed to `TensorSpec`, which decides whether it accepts them.
    """
    shape_and_dtype, _, device = text.partition("@")
    shape_text, _, dtype = shape_and_dtype.partition(":")
    dims: list[int | str] = []
    for part in (p.strip() for p in shape_text.split(",")) if shape_text.strip() else ():
        if re.fullmatch(r"\d+", part):
            dims.append(int(part))
        elif _NAME.match(part):
            dims.append(part)
        else:
            raise ValueError(f"bad dim {part!r} in {text!r}: dims are non-negative ints or names like B "
                             "(format: 'D0,D1,...[:dtype][@device]', e.g. 'B,T:int64@cuda:0')")
    if "@" in text and not device.strip():
        raise ValueError(f"missing device after '@' in {text!r}")
    return TensorSpec(tuple(dims), dtype=dtype.strip() or torch.float32, device=device.strip() or "cpu")


def load_callable(reference: str) -> Any:
    """Import ``package.module:attribute`` and return the attribute."""
    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"expected MODULE:CALLABLE (e.g. fxprop.examples:gpt_example), got {reference!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:  # the console script, unlike python -m, omits it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise UsageError(f"cannot import module {module_name!r}: no module named {error.name!r} "
                             "(run from the directory that holds it, or set PYTHONPATH)") from None
        raise LoadError(f"importing {module_name!r} failed: {type(error).__name__}: {error}") from error
    except Exception as error:
        raise LoadError(f"importing {module_name!r} failed: {type(error).__name__}: {error}") from error
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found


def from_callable(reference: str, specs: Sequence[TensorSpec], trace: str,
                  prepare: Callable[[torch.nn.Module], torch.fx.GraphModule] | None = None) -> Loaded:
    """Call the user's callable; it returns a module or GraphModule, alone or with its inputs.
    ``prepare``, when given, turns the module into the graph instead of tracing it (a mesh's plan)."""
    target = load_callable(reference)
    if isinstance(target, torch.nn.Module):
        produced = target
    elif callable(target):
        try:
            produced = target()
        except Exception as error:
            raise LoadError(f"calling {reference}() failed: {type(error).__name__}: {error}") from error
    else:
        raise UsageError(f"{reference} is a {type(target).__name__}, not a callable or a module")
    model, inputs = produced, ()
    if isinstance(produced, tuple) and len(produced) == 2 and isinstance(produced[0], torch.nn.Module):
        model, inputs = produced[0], tuple(produced[1])
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{reference}() returned {type(produced).__name__}; expected a module or GraphModule, "
                         "or a (module, inputs) pair")
    if specs:
        inputs = tuple(specs)
    elif not inputs:
        raise UsageError(f"{reference}() returned no inputs: give one --input per graph input, e.g. --input 8,16")
    if prepare is not None:
        return Loaded(prepare(model), inputs, reference, "fx")
    how = "given" if isinstance(model, torch.fx.GraphModule) else trace
    return Loaded(trace_module(model, inputs, trace), inputs, reference, how)


def trace_module(model: torch.nn.Module, inputs: tuple, trace: str) -> torch.fx.GraphModule:
    if isinstance(model, torch.fx.GraphModule):
        return model
    try:
        if trace == "export":
            # without grad: autograd metadata for tensors moved to a device this build lacks aborts torch
            with torch.no_grad():
                program = torch.export.export(model, tuple(_example_tensor(value) for value in inputs))
            return program.module()
        tracer = SourceTracer()
        graph = tracer.trace(model)
        return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception as error:
        raise LoadError(f"tracing {type(model).__name__} with "
                        f"{'torch.export' if trace == 'export' else 'torch.fx.symbolic_trace'} failed: "
                        f"{type(error).__name__}: {error}") from error


class SourceTracer(torch.fx.Tracer):
    """symbolic_trace that records each node's user frames as its ``stack_trace``.

    torch's own ``record_stack_traces`` symbolizes through torch._inductor (seconds to import);
    the standard library's frame walk is enough for the source column.
    """

    def create_node(self, *args, **kwargs) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        if node.op not in ("placeholder", "output") and not node.stack_trace:
            frames = traceback.StackSummary.extract(traceback.walk_stack(None), limit=64, lookup_lines=False)
            users = [frame for frame in frames if not frame.filename.startswith(_TORCH_DIR)
                     and frame.filename != __file__]
            if users:
                node.stack_trace = "".join(traceback.format_list(list(reversed(users[:3])))).rstrip()
        return node


_TORCH_DIR = os.path.dirname(torch.__file__)


def _example_tensor(value: Any) -> Any:
    """torch.export needs real example tensors: a spec becomes zeros on the host CPU."""
    if isinstance(value, TensorSpec):
        if not all(isinstance(d, int) for d in value.shape):
            raise LoadError(f"--trace export needs concrete sizes, got {value.shape}; use --trace fx for symbolic dims")
        return torch.zeros(value.shape, dtype=value.dtype)
    return value


def from_exported(path: str, specs: Sequence[TensorSpec]) -> Loaded:
    """A program saved with ``torch.export.save``; inputs from ``--input`` or its example inputs."""
    try:
        program = torch.export.load(path)
    except FileNotFoundError:
        raise UsageError(f"--graph {path}: no such file") from None
    except Exception as error:
        raise LoadError(f"--graph {path}: torch.export.load failed: {type(error).__name__}: {error}") from error
    if specs:
        inputs: tuple = tuple(specs)
    else:
        example = getattr(program, "example_inputs", None)
        if not example:
            raise UsageError(f"--graph {path} holds no example inputs: give one --input per graph input")
        args, kwargs = example
        if kwargs:
            raise UsageError(f"--graph {path} takes keyword inputs ({', '.join(kwargs)}); "
                             "give every input positionally with --input")
        inputs = tuple(args)
    return Loaded(program.module(), inputs, path, "export")
