"""The graphs the benchmark measures, each built the same way for every method (no downloads)."""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _standalone_examples():
    """fxprop/examples/models.py loaded on its own: building a graph must not import fxprop (the cold
    measurement's clock covers that import). models.py imports torch only."""
    path = Path(__file__).resolve().parent.parent / "fxprop" / "examples" / "models.py"
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


class ChannelsLastCNN(torch.nn.Module):
    """conv/bn/relu stages with a depthwise conv and a residual add, run in channels_last."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.expand = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.depthwise = nn.Sequential(nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False), nn.BatchNorm2d(64),
                                       nn.ReLU6(inplace=True))
        self.project = nn.Sequential(nn.Conv2d(64, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.down = nn.Sequential(nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.Conv2d(64, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.project(self.depthwise(self.expand(x)))
        x = self.head(self.down(torch.relu(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def channels_last_cnn() -> Case:
    torch.manual_seed(0)
    model = ChannelsLastCNN().eval().to(memory_format=torch.channels_last)
    image = torch.randn(8, 3, 128, 128).to(memory_format=torch.channels_last)
    return Case("channels-last CNN, symbolic_trace", torch.fx.symbolic_trace(model), (image,), transformer=False)


class ViewsInPlace(torch.nn.Module):
    """Attention-shaped arithmetic through views (view, transpose, permute, reshape, slices,
    unsqueeze/expand, narrow, chunk) and in-place updates (add_, mul_, div_, sub_, relu_, clamp_,
    zero_, masked_fill_) on them."""

    def __init__(self, dim: int = 128, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.proj = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)
        self.scale = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        batch, seq, dim = x.shape
        head = dim // self.heads
        h = self.proj(x)
        q = h.view(batch, seq, self.heads, head).transpose(1, 2).contiguous()
        q.mul_(0.5)
        k = h[:, :, : dim // 2].reshape(batch, seq, self.heads // 2, head).permute(0, 2, 1, 3)
        k = k.unsqueeze(2).expand(batch, self.heads // 2, 2, seq, head).reshape(batch, self.heads, seq, head)
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores.div_(math.sqrt(head))
        causal = x.new_ones(seq, seq, dtype=torch.bool).triu(1)
        scores.masked_fill_(causal, float("-inf"))
        context = torch.matmul(scores.softmax(-1), q)
        out = context.transpose(1, 2).reshape(batch, seq, dim)
        out.add_(h)
        out.relu_()
        y = out.clone()
        y.narrow(1, 0, 1).zero_()
        y.mul_(self.scale)
        first, second = y.flatten(0, 1).chunk(2, dim=-1)
        z = torch.cat([second, first], dim=-1).view(batch, seq, dim)
        z.sub_(z.mean(-1, keepdim=True))
        z.clamp_(-1.0, 1.0)
        z[:, 1:].add_(z[:, :-1])
        w = z.unsqueeze(1).squeeze(1).permute(1, 0, 2)
        w = w.transpose(0, 1).contiguous().view(-1, dim)
        w.tanh_()
        return self.out(w).view(batch, seq, dim) + x


def views_in_place() -> Case:
    torch.manual_seed(0)
    model = ViewsInPlace().eval()
    x = torch.randn(4, 64, 128)
    return Case("views and in-place, symbolic_trace", torch.fx.symbolic_trace(model), (x,), transformer=False)


def resnet_block_train() -> Case:
    """A stem and two residual blocks (the first downsampling) with BatchNorm2d in training mode:
    batch statistics, and running statistics updated in place."""
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                          examples.BasicBlock(32, 64, stride=2), examples.BasicBlock(64, 64),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).train()
    image = torch.randn(8, 3, 64, 64)
    return Case("ResNet block, BN in training, symbolic_trace", torch.fx.symbolic_trace(model), (image,),
                transformer=False)


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
    "channels_last_cnn": channels_last_cnn,
    "views_in_place": views_in_place,
    "resnet_block_train": resnet_block_train,
    "llama8": llama(8),
    "llama32": llama(32),
    "llama80": llama(80),
    "llama160": llama(160),
    "llama800": llama(800),  # over 50,000 nodes: linear time, flat memory
}
LARGE_NODES = 20_000  # graphs above this get one timed call per method and regime, and no cold runs


def restore_buffers(gm: torch.fx.GraphModule) -> Callable[[], None]:
    """A function that puts the module's real buffers back as they are now. FakeTensorProp runs
    modules on the module's own state: a BatchNorm in training counts its batches there, and the
    next call of either method would see another graph state (fxprop reads the counter's value)."""
    saved = [(buffer, buffer.detach().clone()) for buffer in gm.buffers() if buffer.device.type != "meta"]

    def restore() -> None:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return restore


def fresh_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new graph over the same modules: no node metadata and no node identity carries over."""
    import copy
    fresh = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    fresh.graph._codegen = copy.deepcopy(gm.graph._codegen)
    fresh.recompile()
    return fresh
