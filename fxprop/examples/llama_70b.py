"""Llama-3-70B-shaped figures: parameter bytes, activation peak and FLOPs per token, from meta parameters.

    python -m fxprop.examples.llama_70b --batch 1 --seq 8192          # bf16 on cuda:0, 80 layers

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
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(report(figures(args.batch, args.seq, dtype, args.device), args.batch, args.seq, dtype))


if __name__ == "__main__":
    main()
