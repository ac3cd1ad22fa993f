"""Symbolic shapes for benchmarks/run.py: `torch.export` programs with `Dim`s, and graphs that
`torch.compile` hands its backends (dynamo's graph, AOTAutograd's forward and backward).

Exported programs (`PROGRAMS`)
    ``torch.export.export(model, args, dynamic_shapes=...)`` with ``Dim("batch")`` and
    ``Dim("seq")`` on every input of HF GPT-2, Llama and BERT (tests/corpus configs, 4 layers),
    and ``Dim("seq")`` on the token input of fxprop/examples/__init__.py's Llama (parameters on the meta
    device, full Llama-3-70B sizes) at several layer counts.
    fxprop          ``fxprop.propagate(program)``, no inputs: the placeholders' traced values
                    (FakeTensors in the program's ShapeEnv) are propagated. Each call gets a
                    fresh ExportedProgram over a fresh copy of the graph (same signature,
                    state_dict, constants; a copy of range_constraints), built outside the clock.
    FakeTensorProp  ``FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*vals)`` on a fresh
                    copy of ``program.graph_module``, ``vals`` the placeholders' ``meta["val"]``
                    and ``mode`` their ``fake_mode`` (the program's FakeTensorMode and ShapeEnv).

Compiled models (`compile_measure`)
    A tests/corpus model in training mode is compiled with ``dynamic=False`` and
    ``dynamic=True`` by a backend that times both methods on dynamo's graph and then hands it to
    ``aot_autograd(fw_compiler=..., bw_compiler=...)``, whose compilers time both methods on
    the forward and (at ``.backward()``) the backward graph, on the example inputs they are given:
    fxprop          ``fxprop.propagate(gm, *example_inputs)``;
    FakeTensorProp  inductor's ``fake_tensor_prop(gm, example_inputs, force_allow_non_fake_inputs=True)``.
    Before every call the graph's node metadata is restored to what the tracer wrote (outside
    the clock); the graph then goes on, unchanged, to the next stage.
"""
from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from methods import clear_caches  # noqa: E402
from models import examples, fresh_copy  # noqa: E402

ORDER = ("fxprop", "FakeTensorProp")


# --- exported programs with Dims -------------------------------------------------------------

@dataclass
class Program:
    name: str
    program: torch.export.ExportedProgram
    export_s: float                 # how long torch.export took (not part of any comparison)
    layers: int | None = None       # the Llama sweep: the layer count, for the linearity check

    @property
    def nodes(self) -> int:
        return len(self.program.graph_module.graph.nodes)


def _corpus_model(name: str, layers: int):
    from corpus import models as corpus
    base = corpus.CASES[name]
    config = dict(base.config)
    config["n_layer" if "n_layer" in config else "num_hidden_layers"] = layers
    return corpus.Case(base.name, base.family, base.model_type, base.head, config, base.inputs).build()


def hf_program(name: str, title: str, layers: int = 4) -> Callable[[], Program]:
    def build() -> Program:
        from torch.export import Dim
        model, inputs = _corpus_model(name, layers)
        batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=32)
        start = time.perf_counter()
        program = torch.export.export(model, (), dict(inputs),
                                      dynamic_shapes={key: {0: batch, 1: seq} for key in inputs})
        return Program(f"{title} ({layers} layers), export with Dim batch and seq", program,
                       time.perf_counter() - start)
    return build


def llama_program(layers: int) -> Callable[[], Program]:
    def build() -> Program:
        from torch.export import Dim
        model = examples.llama_on_meta(layers)
        tokens = torch.empty(1, 4096, dtype=torch.int64, device="meta")
        start = time.perf_counter()
        program = torch.export.export(model, (tokens,), dynamic_shapes=({1: Dim("seq", min=2, max=8192)},))
        return Program(f"llama-{layers} on meta, export with Dim seq", program, time.perf_counter() - start,
                       layers=layers)
    return build


PROGRAMS: dict[str, Callable[[], Program]] = {
    "hf_gpt2_dim": hf_program("gpt2", "HF GPT-2"),
    "hf_llama_dim": hf_program("llama", "HF Llama"),
    "hf_bert_dim": hf_program("bert", "HF BERT"),
    "llama4_dim": llama_program(4),
    "llama8_dim": llama_program(8),
    "llama16_dim": llama_program(16),
    "llama32_dim": llama_program(32),
    "llama80_dim": llama_program(80),
    "llama160_dim": llama_program(160),
    "llama320_dim": llama_program(320),
    "llama800_dim": llama_program(800),
}
HF_PROGRAMS = ("hf_gpt2_dim", "hf_llama_dim", "hf_bert_dim")


def fresh_program(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The same program over a fresh copy of its graph: no node metadata written by an earlier
    propagate, no node identity carried over; the traced placeholder values are shared."""
    gm = fresh_copy(program.graph_module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pytree's deprecation notices while copying the call graph
        return torch.export.ExportedProgram(
            root=gm, graph=gm.graph, graph_signature=copy.deepcopy(program.graph_signature),
            state_dict=program.state_dict, range_constraints=dict(program.range_constraints),
            module_call_graph=copy.deepcopy(program.module_call_graph), example_inputs=program.example_inputs,
            constants=program.constants, verifiers=[program.verifier])


def program_call(program: torch.export.ExportedProgram, method: str) -> Callable[[], object]:
    """The timed call, prepared outside the clock on fresh copies."""
    if method == "fxprop":
        import fxprop
        fresh = fresh_program(program)
        return lambda: fxprop.propagate(fresh)
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    gm = fresh_copy(program.graph_module)
    values = [node.meta["val"] for node in gm.graph.nodes if node.op == "placeholder"]
    mode = next(value.fake_mode for value in values if isinstance(value, FakeTensor))
    return lambda: FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*values)


def timed_program(program: Program, method: str, *, first_sight: bool) -> float:
    call = program_call(program.program, method)
    if first_sight:
        clear_caches()
    gc.collect()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def program_regime(program: Program, runs: int, *, first_sight: bool) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in ORDER}
    if not first_sight:
        for _ in range(2):  # both caches warm (fxprop keeps a graph at its second sighting)
            for name in ORDER:
                timed_program(program, name, first_sight=False)
    for round_ in range(runs):
        for name in ORDER if round_ % 2 == 0 else reversed(ORDER):
            times[name].append(timed_program(program, name, first_sight=first_sight))
    return times


def program_differences(program: Program) -> int:
    """Nodes whose fxprop value differs from the one export traced (sizes and strides compared
    as the program's ShapeEnv proves them equal; dtype, device)."""
    import fxprop
    fresh = fresh_program(program.program)
    fxprop.propagate(fresh)
    return sum(1 for theirs, ours in zip(program.program.graph_module.graph.nodes, fresh.graph_module.graph.nodes)
               if not same_value(theirs.meta.get("val"), ours.meta.get("val")))


def same_value(theirs, ours) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    def same_size(a, b) -> bool:
        return bool(statically_known_true(a == b)) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) \
            else a == b

    if isinstance(theirs, (list, tuple)):
        return isinstance(ours, (list, tuple)) and len(ours) == len(theirs) and all(map(same_value, theirs, ours))
    if isinstance(theirs, torch.SymInt):
        return same_size(theirs, ours)
    if not isinstance(theirs, torch.Tensor):
        return True
    return (isinstance(ours, torch.Tensor) and theirs.dim() == ours.dim()
            and all(map(same_size, theirs.shape, ours.shape)) and all(map(same_size, theirs.stride(), ours.stride()))
            and (theirs.dtype, theirs.device) == (ours.dtype, ours.device))


# --- graphs torch.compile hands its backends ---------------------------------------------------

class CompiledGraph:
    """One graph a backend or an AOTAutograd compiler was handed, with what is needed to time
    annotating it again."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        self.gm, self.example_inputs = gm, list(example_inputs)
        self.saved = {node: dict(node.meta) for node in gm.graph.nodes}
        self.graph_meta = dict(gm.meta)
        self.nodes = len(gm.graph.nodes)

    def restore(self) -> None:
        for node, meta in self.saved.items():
            node.meta = dict(meta)
        self.gm.meta = dict(self.graph_meta)

    def annotate(self, method: str) -> None:
        if method == "fxprop":
            import fxprop
            fxprop.propagate(self.gm, *self.example_inputs)
        else:
            from torch._inductor.compile_fx import fake_tensor_prop
            fake_tensor_prop(self.gm, self.example_inputs, force_allow_non_fake_inputs=True)

    def timed(self, method: str, *, first_sight: bool) -> float:
        self.restore()
        if first_sight:
            clear_caches()
        gc.collect()
        start = time.perf_counter()
        self.annotate(method)
        return time.perf_counter() - start

    def measure(self, runs: int, regimes: tuple[str, ...]) -> dict:
        """Medians per regime and method; a method that fails is left out and its error kept."""
        out: dict = {"nodes": self.nodes, "errors": {}}
        methods = []
        for method in ORDER:
            try:
                self.timed(method, first_sight=True)
                methods.append(method)
            except Exception as error:  # noqa: BLE001 (reported, not raised)
                out["errors"][method] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:100]}"
        for regime in regimes:
            first_sight = regime == "first sight"
            if not first_sight:
                for _ in range(2):  # both caches warm (fxprop keeps a graph at its second sighting)
                    for method in methods:
                        self.timed(method, first_sight=False)
            times: dict[str, list[float]] = {method: [] for method in methods}
            for round_ in range(runs):
                for method in methods if round_ % 2 == 0 else reversed(methods):
                    times[method].append(self.timed(method, first_sight=first_sight))
            out[regime] = {method: statistics.median(times[method]) for method in methods}
        self.restore()
        return out


STAGES = ("dynamo", "forward", "backward")


def compile_measure(name: str, dynamic: bool, runs: int) -> dict:
    """Compile a tests/corpus model (training mode) and time both methods on every graph of
    every stage; returns {stage: [per-graph dicts]} and the errors."""
    from torch._dynamo.backends.common import aot_autograd
    from corpus import models as corpus
    model, inputs = corpus.build(name)
    model.train()
    out: dict = {stage: [] for stage in STAGES}
    out["errors"] = []

    def measuring(stage: str, regimes: tuple[str, ...], then=None):
        def compiler(gm, example_inputs):
            measured = None
            try:
                measured = CompiledGraph(gm, example_inputs).measure(runs, regimes)
                out[stage].append(measured)
            except Exception as error:  # noqa: BLE001
                out["errors"].append(f"{stage}: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
            if then is None:
                return gm
            try:
                return then(gm, example_inputs)
            except Exception as error:
                # AOTAutograd can send dynamo back to trace again (TensorifyScalarRestartAnalysis with
                # dynamic=True): the graph it was handed is dropped, and so is its measurement.
                if measured is not None:
                    measured["discarded"] = type(error).__name__
                raise
        return compiler

    aot = aot_autograd(fw_compiler=measuring("forward", ("first sight", "hot")),
                       bw_compiler=measuring("backward", ("first sight", "hot")))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=measuring("dynamo", ("first sight",), aot), dynamic=dynamic)
    result = compiled(**inputs)
    first = result[0] if not isinstance(result, torch.Tensor) else result
    first.float().sum().backward()
    torch._dynamo.reset()
    return out


def kept(graphs: list[dict]) -> list[dict]:
    """The graphs that went on to be compiled (not dropped by a restart of dynamo's analysis)."""
    return [graph for graph in graphs if "discarded" not in graph]


def stage_seconds(graphs: list[dict], regime: str, method: str) -> float:
    """Summed over a stage's kept graphs; NaN when the method failed on one of them (or none)."""
    graphs = kept(graphs)
    return sum(graph.get(regime, {}).get(method, float("nan")) for graph in graphs) if graphs else float("nan")
