"""Small models for the command-line tests (`test_cli.py` runs ``fxprop run tests.cli_models:...``)."""
import torch
from torch import nn

import fxprop

lib = torch.library.Library("fxprop_cli_test", "DEF")
lib.define("gap(Tensor x, int width) -> Tensor")
for _key in ("CPU", "CUDA"):  # no fake/meta kernel: falls back
    lib.impl("gap", lambda x, width: x[..., width:] - x[..., :-width], _key)


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x)) + x


class Tiny(nn.Module):
    """Two identical layers (a repeated block), a move to cuda:0, and a custom op that falls back."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(Layer(width) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = x.to("cuda:0")
        return torch.ops.fxprop_cli_test.gap(x, 2).softmax(-1)


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y @ torch.ones(5, 2)


def tiny():
    return Tiny(), (torch.randn(2, 8),)


def tiny_module():
    return Tiny()


def broken():
    return Broken(), (torch.randn(3, 8),)


def tiny_llama():
    """A two-layer Llama-style decoder on meta and its tokens on cuda:0 (the `--mesh` tests)."""
    from fxprop.examples import Llama, LlamaConfig
    config = LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=128)
    with torch.device("meta"):
        model = Llama(config)
    return model, (fxprop.TensorSpec((2, 16), dtype=torch.int64, device="cuda:0"),)
