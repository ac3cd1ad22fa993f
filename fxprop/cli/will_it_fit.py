"""``fxprop estimate``: will a transformers causal LM fit on a device, for a forward pass or a training step.

It builds the model on the meta device (`transformers_models`), traces one step on a batch of
``--batch`` x ``--seq`` tokens (`fxprop.estimate.traced_step`), estimates it
(`fxprop.estimate`), and reads what the step holds on the device
(`fxprop.estimate.step_figures`): parameters, gradients, optimizer state, the activation
peak, the total peak, and FLOPs; against ``--gpu-memory``, whether it fits. The figures are
live tensor bytes, what ``torch.cuda.max_memory_allocated`` counts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..devices import normalize_device
from ..errors import InputError
from ..estimate import estimate_with_memory, optimizers
from ..estimate.step_figures import PeakAt, StepFigures, figures
from ..estimate.traced_step import TracedStep, trace_inference_step, trace_training_step
from ..torch_compat import import_dynamo
from ..distributed.dtensors import tally
from ..distributed.traced_collectives import collectives_in, mesh_groups
from . import transformers_models, transformers_parallel
from .loading import LoadError, UsageError
from .memory_sizes import parse_memory_size
from .meshes import parse_mesh
from .progress import Progress

SCHEMA_VERSION = 1
DESCRIPTION = ("Will a transformers causal LM fit on a device, for a forward pass or a training step? Builds it on "
               "the meta device, traces one step for the device and prints its memory (parameters, gradients, "
               "optimizer state, activations, the peak) and FLOPs.")

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
          "fp64": torch.float64, "float64": torch.float64, "double": torch.float64}

EPILOG = """examples:
  fxprop estimate llama hidden_size=8192 num_hidden_layers=80 intermediate_size=28672 \\
      num_attention_heads=64 num_key_value_heads=8 vocab_size=128256 \\
      --seq 8192 --dtype bf16 --train --optimizer adamw --gpu-memory 80GB
  fxprop estimate path/to/config.json --batch 8 --seq 2048 --train --activation-checkpointing
  fxprop estimate meta-llama/Meta-Llama-3-8B --seq 8192 --format json     (fetches config.json only)
memory sizes: GB, MB, ... are powers of 1000; GiB, MiB, ... powers of 1024 (nvidia-smi reports MiB)"""


def _memory_size(text: str) -> int:
    try:
        return parse_memory_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    try:
        return parse_mesh(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dtype(text: str) -> torch.dtype:
    if text.lower() not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[text.lower()]


def is_override(text: str) -> bool:
    """Whether a word of the command line is a ``KEY=VALUE`` config override."""
    return text.partition("=")[0].isidentifier() and "=" in text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="a model type (llama, gpt2, ...), a config.json (or a folder holding one), or a Hugging "
                             "Face Hub id (org/name; fetches its config.json, never weights)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config fields to set, values as python literals: hidden_size=8192 "
                             "rope_scaling=\"{'factor': 8.0}\" hidden_act=silu")
    parser.add_argument("--batch", type=_positive, default=1, help="sequences per step (default: 1)")
    parser.add_argument("--seq", type=_positive, help="tokens per sequence (default: the config's "
                                                       "max_position_embeddings)")
    parser.add_argument("--dtype", type=_dtype, help="parameter and activation dtype: bf16, fp16, fp32, ... "
                                                     "(default: the config's dtype, else fp32)")
    parser.add_argument("--device", default="cuda", help="the device to estimate for (default: cuda, i.e. cuda:0; "
                                                         "emulated, no GPU needed)")
    parser.add_argument("--gpu-memory", type=_memory_size, metavar="SIZE",
                        help="memory of the device, to say whether the step fits: 80GB (powers of 1000), "
                             "79.6GiB or 81559MiB (powers of 1024)")
    parser.add_argument("--train", action="store_true",
                        help="a training step (forward, backward, optimizer step) instead of a forward pass")
    parser.add_argument("--optimizer", choices=tuple(optimizers.OPTIMIZERS),
                        help="with --train: the torch.optim optimizer (default: adamw)")
    parser.add_argument("--momentum", type=float, help="with --optimizer sgd: its momentum (default: 0, no state)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="with --train: recompute each layer's activations in the backward (transformers' "
                             "activation_checkpointing_enable)")
    parser.add_argument("--mesh", type=_mesh, metavar="NAME=SIZE,...",
                        help="figures per rank of the model parallelized on a simulated mesh of dims dp and tp, e.g. "
                             "dp=2,tp=4: tp by the model's own tensor-parallel plan, dp sharding parameters, gradients "
                             "and optimizer state as FSDP; --batch is then per data-parallel rank")
    parser.add_argument("--rank", type=int, default=0, help="with --mesh: the rank to estimate (default 0)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output on stdout (default: text)")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="stage progress on stderr (auto: when stderr is a terminal)")


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    overrides = dict(transformers_models.parse_override(item) for item in args.overrides)
    device = _device(args.device)
    progress = Progress(args.progress == "always" or args.progress == "auto" and sys.stderr.isatty())
    seconds: dict[str, float] = {}
    with progress, _simulated_mesh(args, device) as mesh:
        with _stage(progress, seconds, "build", f"building {args.model} on the meta device"):
            built = _build(args, overrides, device, mesh)
        with _stage(progress, seconds, "trace", "tracing one step"):
            step = _trace(built, args.batch, device)
        import_dynamo()  # keep FakeTensorMode's lazy import out of the timing
        with _stage(progress, seconds, "estimate", f"propagating and estimating {len(step.gm.graph.nodes):,} nodes"):
            est, memory = estimate_with_memory(step.gm, *step.inputs, param_device=device,
                                               progress=progress.advance if progress.enabled else None)
            comm = None if mesh is None else tally(collectives_in(step.gm, mesh_groups(mesh)))
            found = figures(step, est, memory, tokens=args.batch * built.seq, comm=comm)
    setup = _setup(args, built, device, step)
    if args.format == "json":
        print(json.dumps(document(setup, found, args.gpu_memory, seconds), indent=2))
    else:
        print(text(setup, found, args.gpu_memory, seconds))
    return 0


@dataclass
class Built:
    """The model on the meta device, its optimizer (None for a forward pass), and the step's settings."""
    config: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    dtype: torch.dtype
    seq: int


@contextlib.contextmanager
def _simulated_mesh(args: argparse.Namespace, device: torch.device):
    """The simulated mesh of ``--mesh`` (None without), as this process's rank ``--rank``."""
    if args.mesh is None:
        yield None
        return
    from ..distributed.meshes import mesh_simulation
    shape, names = args.mesh
    transformers_parallel.check_mesh(shape, names, args.rank)
    with mesh_simulation(shape, names, device_type=device.type, rank=args.rank) as mesh:
        yield mesh


@contextlib.contextmanager
def _stage(progress: Progress, seconds: dict[str, float], name: str, text: str):
    progress.stage(text)
    started = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - started


def _build(args: argparse.Namespace, overrides: dict[str, Any], device: torch.device, mesh: Any) -> Built:
    config = transformers_models.load_config(args.model, overrides)
    dtype = args.dtype or _config_dtype(config)
    seq = args.seq or getattr(config, "max_position_embeddings", None)
    if not seq:
        raise UsageError(f"{config.model_type} configs have no max_position_embeddings: give --seq")
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < 1:
        raise UsageError(f"vocab_size={vocab}: the model has no token id to be fed (its embedding refuses every id)")
    model = transformers_models.causal_lm_on_meta(config, dtype, args.train, args.activation_checkpointing)
    if mesh is not None:
        transformers_parallel.parallelize(model, mesh)
        if args.train and args.optimizer == "adafactor":
            transformers_parallel.check_optimizer(args.optimizer, model)
    optimizer = None
    if args.train:
        trained = transformers_parallel.parameter_groups([p for p in model.parameters() if p.requires_grad])
        optimizer = optimizers.build(args.optimizer or "adamw", trained, device, args.momentum or 0.0)
        optimizers.create_state(optimizer)
    return Built(config, model, optimizer, dtype, seq)


def _trace(built: Built, batch_size: int, device: torch.device) -> TracedStep:
    """One step on a batch of token ids (and, to train, labels), no padding: causal attention throughout."""
    tokens = lambda: torch.empty(batch_size, built.seq, dtype=torch.long, device="meta")
    try:
        if built.optimizer is None:
            return trace_inference_step(built.model, {"input_ids": tokens()}, device)
        return trace_training_step(built.model, built.optimizer, {"input_ids": tokens(), "labels": tokens()}, device)
    except (UsageError, LoadError):
        raise
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise LoadError(f"tracing a step of {type(built.model).__name__} on the meta device failed: "
                        f"{type(error).__name__}: {first}") from error


def _check_options(args: argparse.Namespace) -> None:
    if not args.train:
        given = [flag for flag, value in (("--optimizer", args.optimizer), ("--momentum", args.momentum),
                                          ("--activation-checkpointing", args.activation_checkpointing)) if value]
        if given:
            raise UsageError(f"{', '.join(given)} need(s) --train")
    if args.momentum is not None and (args.optimizer or "adamw") != "sgd":
        raise UsageError(f"--momentum is SGD's option, got --optimizer {args.optimizer or 'adamw'}")
    if args.mesh is None and args.rank != 0:
        raise UsageError(f"--rank {args.rank} needs --mesh")
    if args.momentum is not None and args.momentum < 0:
        raise UsageError(f"--momentum must be 0 or more (torch.optim.SGD refuses {args.momentum})")


def _device(text: str) -> torch.device:
    try:
        device = normalize_device(text)
    except (InputError, RuntimeError) as error:
        raise UsageError(f"--device {text!r}: {error}") from None
    if device.type == "meta":
        raise UsageError("--device meta: give the device the model would run on, such as cuda or cpu")
    return device


def _config_dtype(config: Any) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = DTYPES.get(dtype.lower())
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _setup(args: argparse.Namespace, built: Built, device: torch.device, step: TracedStep) -> dict[str, Any]:
    optimizer = built.optimizer
    return {"source": args.model, "model_type": built.config.model_type, "class": type(built.model).__name__,
            "layers": getattr(built.config, "num_hidden_layers", None),
            "attention": getattr(built.config, "_attn_implementation", None),
            "kind": "inference" if optimizer is None else "training", "batch": args.batch, "seq": built.seq,
            "dtype": str(built.dtype).removeprefix("torch."), "device": str(device),
            "optimizer": None if optimizer is None else args.optimizer or "adamw",
            "optimizer_implementation": None if optimizer is None else
            "foreach" if optimizer.defaults.get("foreach") else "for-loop",
            "momentum": args.momentum if optimizer is not None and args.optimizer == "sgd" else None,
            "activation_checkpointing": args.activation_checkpointing,
            "mesh": None if args.mesh is None else dict(zip(args.mesh[1], args.mesh[0])),
            "rank": None if args.mesh is None else args.rank, "graph_nodes": len(step.gm.graph.nodes)}


def document(setup: dict[str, Any], found: StepFigures, gpu_memory: int | None,
             seconds: dict[str, float]) -> dict[str, Any]:
    """The JSON form: the setup, every figure (bytes as ints), the verdict and the time taken."""
    return {"schema_version": SCHEMA_VERSION, "setup": setup, **found.to_dict(), "gpu_memory_bytes": gpu_memory,
            "fits": None if gpu_memory is None else found.peak.bytes <= gpu_memory,
            "seconds": {stage: round(value, 2) for stage, value in seconds.items()}}


def bytes_text(size: int) -> str:
    """``141,107,412,992`` -> ``131.42 GiB (141.11 GB)``; small sizes in KiB/MiB or bytes."""
    for binary, decimal, scale in (("GiB", "GB", 30), ("MiB", "MB", 20), ("KiB", "kB", 10)):
        if size >= 2**scale:
            return f"{size / 2**scale:,.2f} {binary} ({size / 10**(scale // 10 * 3):,.2f} {decimal})"
    return f"{size:,} B"


def _flops_text(flops: float) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if flops >= scale:
            return f"{flops / scale:,.2f} {prefix}FLOP"
    return f"{flops:,.0f} FLOP"


def _where(at: PeakAt) -> str:
    return f"after %{at.node} ({at.op}, {at.phase})"


def text(setup: dict[str, Any], found: StepFigures, gpu_memory: int | None, seconds: dict[str, float]) -> str:
    training = setup["kind"] == "training"
    parameters = f"{found.parameters / 1e9:,.2f} B" if found.parameters >= 1e8 else f"{found.parameters:,}"
    how = (f"training step: {setup['optimizer']} ({setup['optimizer_implementation']}), activation checkpointing "
           f"{'on' if setup['activation_checkpointing'] else 'off'}" if training else "forward pass without gradients")
    mesh = setup.get("mesh")
    where = (f"per rank: rank {setup['rank']} of a simulated {' x '.join(f'{n}={s}' for n, s in mesh.items())} "
             f"{setup['device'].split(':')[0]} mesh" if mesh else f"on {setup['device']}")
    lines = [f"{setup['class']} ({setup['model_type']}, {setup['layers']} layers, {setup['attention']} attention), "
             f"{parameters} parameters in {setup['dtype']} {where}",
             f"{how}, batch {setup['batch']} x {setup['seq']:,} tokens{' per data-parallel rank' if mesh else ''}", "",
             _row("parameters", bytes_text(found.parameter_bytes))]
    if training:
        elsewhere = "".join(f" + {bytes_text(size)} on {where}" for where, size in found.optimizer_state_elsewhere.items())
        lines += [_row("gradients", bytes_text(found.gradient_bytes)),
                  _row("optimizer state", bytes_text(found.optimizer_state_bytes) + elsewhere)]
    resident = "parameters, buffers, optimizer state and batch" if training else "parameters, buffers and batch"
    at_peak = [f"{resident} {bytes_text(found.resident_bytes)}"]
    if training:
        at_peak.append(f"gradients {bytes_text(found.peak.gradient_bytes)}")
    at_peak.append(f"activations and temporaries {bytes_text(found.peak.activation_bytes)}")
    lines += [_row("buffers and batch", bytes_text(found.buffer_bytes + found.input_bytes)),
              _row("activation peak", f"{bytes_text(found.activation_peak.activation_bytes)} "
                                      f"{_where(found.activation_peak)}"),
              *(_row(f"  in the {phase}" if phase != "optimizer step" else "  in the optimizer",
                     f"{bytes_text(at.activation_bytes)} after %{at.node}")
                for phase, at in found.phase_peaks.items() if len(found.phase_peaks) > 1),
              _row("total peak", f"{bytes_text(found.peak.bytes)} {_where(found.peak)}"),
              _row("", "= " + " + ".join(at_peak)),
              _row("FLOPs", f"{_flops_text(found.flops)} per step, {_flops_text(found.flops_per_token)} per token")]
    lines += [_row("collectives" if index == 0 else "", f"{kind}: {entry['count']} calls, sends "
                   f"{bytes_text(entry['send_bytes'])}, receives {bytes_text(entry['receive_bytes'])}")
              for index, (kind, entry) in enumerate(sorted(found.comm.items()))]
    if found.flops_unknown:
        lines.append(_row("FLOPs not counted", ", ".join(f"%{name} ({why})" for name, why in found.flops_unknown.items())))
    if found.stood_in:
        lines.append(_row("values stood in", f"{found.stood_in} values the optimizer read depend on the data; 1 stood "
                                             "in (they scale its updates, not what it allocates)"))
    lines += [_row("device memory", _verdict(found, gpu_memory)), "",
              "live tensor bytes, as torch.cuda.max_memory_allocated counts them; the CUDA context, the caching "
              "allocator's fragmentation and library workspaces come on top",
              f"time: build {seconds['build']:.1f} s, trace {seconds['trace']:.1f} s ({setup['graph_nodes']:,} nodes), "
              f"estimate {seconds['estimate']:.1f} s"]
    return "\n".join(lines)


def _row(label: str, value: str) -> str:
    return f"  {label:<20}{value}"


def _verdict(found: StepFigures, gpu_memory: int | None) -> str:
    if gpu_memory is None:
        return "give --gpu-memory SIZE to say whether it fits"
    margin = gpu_memory - found.peak.bytes
    return f"{bytes_text(gpu_memory)}: " + (f"fits, {bytes_text(margin)} to spare" if margin >= 0
                                           else f"does not fit, short by {bytes_text(-margin)}")
