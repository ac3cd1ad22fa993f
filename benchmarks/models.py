"""The graphs the benchmark measures, each built the same way for every method (no downloads)."""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _standalone_examples():
    """fxprop/examples.py loaded on its own: building a graph must not import fxprop (the cold
    measurement's clock covers that import). examples.py imports torch only."""
    path = Path(__file__).resolve().parent.parent / "fxprop" / "examples.py"
    spec = importlib.util.spec_from_file_location("fxprop_benchmark_examples", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


examples = _standalone_examples()


@dataclass
class Case:
    name: str
    gm: torch.fx.GraphModule
    meta_inputs: tuple             # what fxprop and FakeTensorProp receive (converted to fakes for the latter)
    transformer: bool = True       # counts toward the "every transformer graph" target
    layers: int | None = None      # Llama graphs: the layer count, for the linearity check


def gpt2_torch() -> Case:
    torch.manual_seed(0)
    model = examples.GPT(examples.GPTConfig()).eval()
    tokens = torch.randint(0, 50257, (8, 512))
    return Case("gpt2-small stack, symbolic_trace", torch.fx.symbolic_trace(model), (tokens,))


def gpt2_aten() -> Case:
    torch.manual_seed(0)
    model = examples.GPT(examples.GPTConfig()).eval()
    tokens = torch.randint(0, 50257, (8, 512))
    program = torch.export.export(model, (tokens,))
    return Case("gpt2-small stack, torch.export", program.module(), (tokens,))


def gpt_block_make_fx() -> Case:
    from torch.fx.experimental.proxy_tensor import make_fx
    torch.manual_seed(0)
    block = examples.Block(examples.GPTConfig()).eval()
    x = torch.randn(8, 512, 768)
    return Case("gpt2 block, make_fx", make_fx(block)(x), (x,))


def hf_gpt2() -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(use_cache=False)).eval()
    tokens = torch.randint(0, 50257, (1, 128))
    return Case("HF GPT2LMHeadModel, torch.export", torch.export.export(model, (tokens,)).module(), (tokens,))


def hf_bert() -> Case:
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    tokens = torch.randint(0, 30522, (1, 128))
    return Case("HF BertModel, torch.export", torch.export.export(model, (tokens,)).module(), (tokens,))


def resnet() -> Case:
    torch.manual_seed(0)
    model = examples.ResNet(widths=(64, 128, 256, 512), blocks_per_stage=2, num_classes=1000).eval()
    image = torch.randn(8, 3, 224, 224)
    return Case("resnet-18-style CNN, symbolic_trace", torch.fx.symbolic_trace(model), (image,), transformer=False)


def llama(layers: int) -> Callable[[], Case]:
    def build() -> Case:
        model = examples.llama_on_meta(layers)
        tokens = torch.empty(1, 4096, dtype=torch.int64, device="meta")
        return Case(f"llama-{layers} on meta, symbolic_trace", torch.fx.symbolic_trace(model), (tokens,),
                    layers=layers)
    return build


def warmup() -> Case:
    """The unrelated graph both methods see first, so that "first sight" is not "first import"."""
    model, inputs = examples.cnn_example()
    return Case("warm-up (small CNN)", torch.fx.symbolic_trace(model), inputs, transformer=False)


CASES: dict[str, Callable[[], Case]] = {
    "gpt2": gpt2_torch,
    "gpt2_aten": gpt2_aten,
    "gpt_block_make_fx": gpt_block_make_fx,
    "hf_gpt2": hf_gpt2,
    "hf_bert": hf_bert,
    "resnet": resnet,
    "llama8": llama(8),
    "llama32": llama(32),
    "llama80": llama(80),
    "llama160": llama(160),
    "llama800": llama(800),  # over 50,000 nodes: linear time, flat memory
}
LARGE_NODES = 20_000  # graphs above this get one timed call per method and regime, and no cold runs


def fresh_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new graph over the same modules: no node metadata and no node identity carries over."""
    import copy
    fresh = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    fresh.graph._codegen = copy.deepcopy(gm.graph._codegen)
    fresh.recompile()
    return fresh
