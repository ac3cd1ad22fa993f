"""Llama-3-70B-shaped figures: parameter bytes, activation peak and FLOPs per token, from meta parameters.

    python -m fxprop.examples.llama_70b --batch 1 --seq 8192          # bf16 on cuda:0, 80 layers
    python -m fxprop.examples.llama_70b --mesh dp=8,tp=8              # one rank of 64: TP+SP, FSDP

`fxprop.examples.Llama` already has the 70B shape by default (80 layers, d_model 8192, 64 heads,
8 KV heads, FFN 28672, vocab 128256). `BF16Llama` only casts the rotary tables to the
activations' dtype, as Meta's reference code does, so that the model runs in bfloat16.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from . import models as examples

LLAMA_3_70B = examples.LlamaConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                                   ffn_dim=28672)
PUBLISHED_PARAMETERS = 70.6e9  # Meta's model card for Llama 3 70B


class BF16Llama(examples.Llama):
    """`fxprop.examples.Llama` with the rotary tables cast to the activations' dtype."""

    def forward(self, tokens):
        seq = tokens.size(1)
        positions = torch.arange(seq, device=tokens.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        x = self.tok_embeddings(tokens)
        cos, sin = angles.cos()[None, None].type_as(x), angles.sin()[None, None].type_as(x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def llama_on_meta(config: examples.LlamaConfig = LLAMA_3_70B, dtype: torch.dtype = torch.bfloat16) -> BF16Llama:
    """A Llama whose parameters are meta tensors of ``dtype`` (the rotary frequencies stay float32)."""
    with torch.device("meta"):
        model = BF16Llama(config)
    model.to(dtype)
    model.inv_freq = model.inv_freq.float()
    return model.eval()


def figures(batch: int = 1, seq: int = 8192, dtype: torch.dtype = torch.bfloat16, device: str = "cuda:0",
            config: examples.LlamaConfig = LLAMA_3_70B) -> dict[str, Any]:
    """Trace, propagate and estimate one forward pass over ``batch x seq`` tokens on ``device``.

    >>> small = examples.LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)
    >>> found = figures(batch=2, seq=16, config=small)
    >>> found["parameters"], found["parameter_bytes"], found["flops_per_token"]
    (106816, 213632, 188416.0)
    """
    import fxprop
    model = llama_on_meta(config, dtype)
    gm = torch.fx.symbolic_trace(model)
    started = time.perf_counter()
    fxprop.propagate(gm, fxprop.TensorSpec((batch, seq), dtype=torch.int64, device=device), param_device=device)
    propagated = time.perf_counter()
    est = fxprop.estimate(gm)
    done = time.perf_counter()
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters": parameters, "parameter_bytes": sum(p.untyped_storage().nbytes() for p in model.parameters()),
            "state_bytes": est.state_bytes[device], "peak_bytes": est.peak_bytes[device],
            "activation_peak_bytes": est.activation_peak_bytes[device], "peak_node": est.peak_node[device],
            "flops": est.flops, "flops_per_token": est.flops / (batch * seq), "nodes": len(gm.graph.nodes),
            "propagate_seconds": propagated - started, "estimate_seconds": done - propagated}


def report(found: dict[str, Any], batch: int, seq: int, dtype: torch.dtype) -> str:
    gib = lambda size: f"{size / 2**30:,.2f} GiB ({size / 1e9:,.2f} GB)"
    return "\n".join([
        f"Llama-3-70B-shaped decoder, {str(dtype).removeprefix('torch.')}, batch {batch} x {seq} tokens, "
        f"{found['nodes']:,} nodes",
        f"  parameters            {found['parameters']:,} ({found['parameters'] / 1e9:.2f} B; published "
        f"{PUBLISHED_PARAMETERS / 1e9:.1f} B)",
        f"  parameter bytes       {gib(found['parameter_bytes'])}",
        f"  peak live bytes       {gib(found['peak_bytes'])} after %{found['peak_node']}",
        f"  activation peak       {gib(found['activation_peak_bytes'])} (peak less parameters, buffers, inputs)",
        f"  FLOPs                 {found['flops']:.4g} ({found['flops_per_token'] / 1e9:,.2f} GFLOP per token)",
        f"  time                  propagate {found['propagate_seconds']:.2f} s, estimate {found['estimate_seconds']:.2f} s",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--mesh", metavar="dp=N,tp=M", help="one rank of a simulated dp x tp mesh (TP+SP, FSDP)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.mesh:
        sizes = dict(part.split("=") for part in args.mesh.split(","))
        shape = (int(sizes["dp"]), int(sizes["tp"]))
        print(parallel_report(parallel_figures(shape, args.batch, args.seq, dtype), shape, args.batch, args.seq))
        return
    print(report(figures(args.batch, args.seq, dtype, args.device), args.batch, args.seq, dtype))


def llama_3_70b(batch: int = 1, seq: int = 8192):
    """The 70B-shaped decoder on meta and its tokens on ``cuda:0``, for the command line::

        fxprop run fxprop.examples.llama_70b:llama_3_70b --mesh dp=8,tp=8 --plan tp --param-device cuda:0
    """
    import fxprop
    return llama_on_meta(), (fxprop.TensorSpec((batch, seq), dtype=torch.int64, device="cuda:0"),)


def parallel_figures(mesh_shape: tuple[int, int] = (8, 8), batch: int = 1, seq: int = 8192,
                     dtype: torch.dtype = torch.bfloat16, config: examples.LlamaConfig = LLAMA_3_70B,
                     rank: int = 0) -> dict[str, Any]:
    """One rank's figures for ``config`` on a simulated ``dp x tp`` "cuda" mesh: tensor and
    sequence parallel on tp (`fxprop.distributed.parallel.llama_plan`), FSDP's parameter sharding on dp
    (`fxprop.distributed.parallel.shard_parameters`), one forward pass over ``batch x seq`` tokens per dp
    group (every rank of a tp group sees the same tokens).

    >>> small = examples.LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=128)
    >>> found = parallel_figures((2, 4), batch=2, seq=16, config=small)
    >>> found["parameter_bytes_per_rank"], sorted(found["comm"])
    (26960, ['all_gather_into_tensor', 'reduce_scatter_tensor'])
    """
    import fxprop
    from ..distributed import parallel
    from torch.distributed.tensor.parallel import parallelize_module
    started = time.perf_counter()
    with fxprop.mesh_simulation(mesh_shape, ("dp", "tp"), rank=rank) as mesh:
        model = llama_on_meta(config, dtype)
        parallelize_module(model, mesh["tp"], parallel.llama_plan(config.n_layers))
        parallel.shard_parameters(model, mesh, "dp")
        gm = parallel.trace(model)
        built = time.perf_counter()
        est = fxprop.estimate(gm, fxprop.TensorSpec((batch, seq), dtype=torch.int64, device="cuda:0"),
                              param_device="cuda:0")
        done = time.perf_counter()
        device = "cuda:0"
        return {"parameters": sum(p.numel() for p in model.parameters()),
                "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                "parameter_bytes_per_rank": est.state_bytes[device], "peak_bytes": est.peak_bytes[device],
                "activation_peak_bytes": est.activation_peak_bytes[device], "peak_node": est.peak_node[device],
                "flops": est.flops, "comm": {kind: dict(entry) for kind, entry in est.comm.items()},
                "nodes": len(gm.graph.nodes), "ranks": mesh.size(), "build_seconds": built - started,
                "estimate_seconds": done - built}


def parallel_report(found: dict[str, Any], mesh_shape: tuple[int, int], batch: int, seq: int) -> str:
    gb = lambda size: f"{size / 1e9:,.3f} GB"
    lines = [f"Llama-3-70B-shaped decoder on a simulated {mesh_shape[0]}x{mesh_shape[1]} (dp x tp) cuda mesh, "
             f"rank 0, batch {batch} x {seq} tokens per dp group, {found['nodes']:,} nodes",
             f"  parameters            {found['parameters']:,}: {gb(found['parameter_bytes'])}, "
             f"/ {found['ranks']} ranks = {gb(found['parameter_bytes'] / found['ranks'])}",
             f"  parameter bytes/rank  {gb(found['parameter_bytes_per_rank'])} (local shards)",
             f"  peak live bytes       {gb(found['peak_bytes'])} after %{found['peak_node']}",
             f"  activation peak       {gb(found['activation_peak_bytes'])}",
             f"  FLOPs per rank        {found['flops']:.4g}"]
    for kind, entry in sorted(found["comm"].items()):
        lines.append(f"  {kind:<22}{entry['count']:>5} calls, sends {gb(entry['send_bytes'])}, "
                     f"receives {gb(entry['receive_bytes'])}")
    lines.append(f"  time                  build {found['build_seconds']:.2f} s, propagate + estimate "
                 f"{found['estimate_seconds']:.2f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
