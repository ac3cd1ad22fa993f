"""Every node of real models, propagated and compared with real execution."""
import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxprop
from fxprop import examples
from fxprop.testing import assert_matches_real, assert_no_side_effects

MODELS = {
    "mlp": examples.mlp_example,
    "cnn_eval": examples.cnn_example,
    "cnn_channels_last": lambda: examples.cnn_example(channels_last=True),
    "cnn_train": lambda: (examples.ResNet().train(), (torch.randn(2, 3, 32, 32),)),
    "gpt": examples.gpt_example,
    "lstm": examples.lstm_example,
}


@pytest.fixture(autouse=True)
def _no_side_effects(monkeypatch):
    """Every propagate in this file leaves its module, inputs, RNG and code untouched
    (`assert_matches_real` checks the same for the calls it makes)."""
    original = fxprop.propagate

    def checked(gm, *inputs, **options):
        with assert_no_side_effects(gm, *inputs):
            return original(gm, *inputs, **options)
    monkeypatch.setattr(fxprop, "propagate", checked)


@pytest.mark.parametrize("name", MODELS)
def test_symbolic_trace_matches_real(name):
    model, inputs = MODELS[name]()
    gm = torch.fx.symbolic_trace(model)
    assert_matches_real(gm, *inputs)
    assert all("val" in node.meta and "fxprop" in node.meta for node in gm.graph.nodes)


@pytest.mark.parametrize("name", ["mlp", "cnn_eval", "gpt", "lstm"])
def test_export_aten_level_matches_real(name):
    model, inputs = MODELS[name]()
    gm = torch.export.export(model, inputs).module()
    assert_matches_real(gm, *inputs)
    assert any(isinstance(n.target, torch._ops.OpOverload) for n in gm.graph.nodes)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_make_fx_matches_real(name):
    model, inputs = MODELS[name]()
    gm = make_fx(model)(*inputs)
    assert_matches_real(gm, *inputs)


def test_specs_fake_and_meta_inputs_give_the_same_annotations():
    model, (tokens,) = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    spec = fxprop.propagate(gm, fxprop.TensorSpec(tuple(tokens.shape), dtype=torch.int64))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(tokens)
    faked = fxprop.propagate(copy.deepcopy(gm), fake)
    assert spec.shape == faked.shape == (2, 16, 512) and spec.device == faked.device == torch.device("cpu")
    on_meta = fxprop.propagate(torch.fx.symbolic_trace(model.to("meta")), tokens.to("meta"))
    assert on_meta.shape == (2, 16, 512) and on_meta.device == torch.device("meta")


class TupleOutputs(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 3, dim=-1)
        first, second = torch.split(x, [2, 6], dim=1)
        chunks = x.chunk(4, dim=1)
        return values, indices, first, second, chunks[-1], x.max(dim=0)


def test_tuple_outputs_match_real():
    gm = torch.fx.symbolic_trace(TupleOutputs())
    assert_matches_real(gm, torch.randn(5, 8))
    out = fxprop.propagate(gm, torch.randn(5, 8))
    assert out[1].dtype == torch.int64 and type(out[5]).__name__ == "max"


class SizeArithmetic(torch.nn.Module):
    def forward(self, x):
        batch = x.size(0) * 2
        last = x.shape[-1] // 4
        y = x.reshape(batch, x.size(1) // 2, last, 4)
        return y.view(-1, x.dim()) + x.numel()


def test_python_arithmetic_on_sizes():
    gm = torch.fx.symbolic_trace(SizeArithmetic())
    assert_matches_real(gm, torch.randn(6, 4, 8))
    kinds = {n.name: n.meta["fxprop"].kind for n in gm.graph.nodes}
    assert kinds["mul"] == "plain"
    assert next(n for n in gm.graph.nodes if n.name == "mul").meta["val"] == 12


def test_outputs_keep_structure_and_placeholder_defaults():
    class WithDefault(torch.nn.Module):
        def forward(self, x, scale=2.0):
            return {"y": x * scale, "pair": (x, x.sum())}

    gm = torch.fx.symbolic_trace(WithDefault())
    out = fxprop.propagate(gm, fxprop.TensorSpec((3,)))
    assert set(out) == {"y", "pair"} and out["pair"][1].shape == ()


def test_nested_inputs():
    class Nested(torch.nn.Module):
        def forward(self, pair, table):
            return pair[0] + pair[1] * table["w"]

    gm = torch.fx.symbolic_trace(Nested())
    out = fxprop.propagate(gm, (torch.randn(3), fxprop.TensorSpec((3,))), {"w": 2.0})
    assert out.shape == (3,)


def test_get_attr_parameters_buffers_constants_and_nested_submodules():
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((4,), 2.0))

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.weight = torch.nn.Parameter(torch.randn(4))
            self.const = torch.arange(4.0)

        def forward(self, x):
            return x * self.inner.scale + self.weight + self.const

    gm = torch.fx.symbolic_trace(Outer())
    assert_matches_real(gm, torch.randn(2, 4))


def test_method_reads_return_python_values():
    class Reads(torch.nn.Module):
        def forward(self, x):
            return x.size(), x.dim(), x.dtype, x.device, x.shape[1]

    gm = torch.fx.symbolic_trace(Reads())
    out = fxprop.propagate(gm, fxprop.TensorSpec((2, 3), dtype=torch.float16, device="cuda:1"))
    assert out == (torch.Size([2, 3]), 2, torch.float16, torch.device("cuda:1"), 3)


def test_requires_grad_follows_autograd():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x)
            return y, y.argmax(-1), y.detach(), torch.zeros_like(y), (y > 0)

    gm = torch.fx.symbolic_trace(Mixed())
    assert_matches_real(gm, torch.randn(2, 4))
    with torch.no_grad():
        out = fxprop.propagate(gm, torch.randn(2, 4))
    assert not out[0].requires_grad


def test_inplace_relu_on_activations_in_training_graph():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2))
    gm = torch.fx.symbolic_trace(model)
    assert_matches_real(gm, torch.randn(3, 4))
    assert_matches_real(copy.deepcopy(gm), torch.randn(3, 4))


def test_batchnorm_train_leaves_running_stats_alone():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    gm = torch.fx.symbolic_trace(model)
    with assert_no_side_effects(gm):
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3, 8, 8)))
