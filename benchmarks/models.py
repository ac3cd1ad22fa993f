"""The graphs the benchmark measures, each built the same way for every method."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fxprop import examples


@dataclass
class Case:
    name: str
    gm: torch.fx.GraphModule
    real_inputs: tuple | None      # for ShapeProp; None when the model cannot run for real
    meta_inputs: tuple             # what fxprop and FakeTensorProp receive (converted to fakes for the latter)
    layers: int | None = None


def gpt2_torch() -> Case:
    torch.manual_seed(0)
    model = examples.GPT(examples.GPTConfig()).eval()
    tokens = torch.randint(0, 50257, (8, 512))
    return Case("gpt2-small torch-level", torch.fx.symbolic_trace(model), (tokens,), (tokens,))


def gpt2_aten() -> Case:
    torch.manual_seed(0)
    model = examples.GPT(examples.GPTConfig()).eval()
    tokens = torch.randint(0, 50257, (8, 512))
    program = torch.export.export(model, (tokens,))
    return Case("gpt2-small aten (torch.export)", program.module(), (tokens,), (tokens,))


def resnet() -> Case:
    torch.manual_seed(0)
    model = examples.ResNet(widths=(64, 128, 256, 512), blocks_per_stage=2, num_classes=1000).eval()
    image = torch.randn(8, 3, 224, 224)
    return Case("resnet-style CNN", torch.fx.symbolic_trace(model), (image,), (image,))


def llama(layers: int) -> Callable[[], Case]:
    def build() -> Case:
        model = examples.llama_on_meta(layers)
        tokens = torch.empty(1, 4096, dtype=torch.int64, device="meta")
        return Case(f"llama-{layers} (meta params)", torch.fx.symbolic_trace(model), None, (tokens,), layers)
    return build


CASES: dict[str, Callable[[], Case]] = {
    "gpt2": gpt2_torch,
    "gpt2_aten": gpt2_aten,
    "resnet": resnet,
    "llama8": llama(8),
    "llama32": llama(32),
    "llama80": llama(80),
}


def fresh_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new graph over the same modules: no node metadata and no node identity carries over."""
    import copy
    fresh = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    fresh.graph._codegen = copy.deepcopy(gm.graph._codegen)
    fresh.recompile()
    return fresh
