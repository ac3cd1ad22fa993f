"""Whole graphs meant for cuda:0, annotated on a CPU-only host: a graph mixing .cpu(), .to("cuda")
and 0-dim CPU scalars, a transformer, a CNN and a Llama built on the meta device. Expectations
per node come from torch's device rules (stated next to each), not from fxprop's output."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import fxprop
from fxprop import examples
from fxprop.testing import assert_matches_real

CPU, CUDA0 = torch.device("cpu"), torch.device("cuda", 0)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the real-GPU comparison "
                               "runs only where torch.cuda.is_available()")


def spec(*shape, dtype=torch.float32, device="cuda:0"):
    return fxprop.TensorSpec(shape, dtype=dtype, device=device)


def fake(*shape, dtype=torch.float32, device="cuda:0"):
    return FakeTensor(FakeTensorMode(), torch.empty(shape, dtype=dtype, device="meta"), torch.device(device))


def annotations(gm):
    """Each node's device (tensors), value (python values) as propagated."""
    found = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        value = node.meta["val"]
        if isinstance(value, torch.Tensor):
            found[node.name] = value.device
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            found[node.name] = tuple(v.device for v in value)
        else:
            found[node.name] = value
    return found


# --- a graph mixing .cpu(), .to("cuda") and 0-dim CPU scalars ------------------------------

def mixed(x, scale, bias):
    host = x.cpu()
    centered = host - bias
    back = centered.to("cuda")
    scaled = x * scale
    total = scaled.sum()
    ratio = back / total
    norm = x.norm().cpu()
    out = ratio * norm
    rows = torch.arange(x.size(0))
    picked = out[rows]
    half = picked.to(torch.float16)
    return half, host, x.is_cuda


MIXED_EXPECTED = {
    "x": CUDA0, "scale": CPU, "bias": CPU,
    "cpu": CPU,          # x.cpu()
    "sub": CPU,          # CPU - CPU
    "to": CUDA0,         # .to("cuda"): "cuda" is cuda:0 (the current device)
    "mul": CUDA0,        # cuda * 0-dim CPU tensor: the CPU scalar defers to cuda
    "sum_1": CUDA0,      # a reduction stays with its input (0-dim, on cuda)
    "truediv": CUDA0,    # cuda / 0-dim cuda
    "norm": CUDA0,
    "cpu_1": CPU,        # a 0-dim CPU tensor
    "mul_1": CUDA0,      # cuda * 0-dim CPU tensor
    "size": 2,           # a python int
    "arange": CPU,       # no device argument and no default device: the CPU
    "getitem": CUDA0,    # indexing a cuda tensor with a CPU index tensor is allowed, result on cuda
    "to_1": CUDA0,       # a dtype-only .to keeps the device
    "getattr_1": True,   # x.is_cuda, a host value
}


@pytest.mark.parametrize("make", [spec, fake], ids=["TensorSpec", "FakeTensor"])
def test_mixed_graph_is_annotated_for_cuda(make):
    gm = torch.fx.symbolic_trace(mixed)
    half, host, is_cuda = fxprop.propagate(gm, make(2, 8), make(device="cpu"), make(8, device="cpu"))
    assert annotations(gm) == MIXED_EXPECTED
    assert (half.device, half.dtype, host.device, is_cuda) == (CUDA0, torch.float16, CPU, True)


def test_mixed_graph_with_a_non_scalar_on_the_wrong_device_names_the_node_and_devices():
    gm = torch.fx.symbolic_trace(mixed)
    with pytest.raises(fxprop.DeviceMismatchError) as raised:
        fxprop.propagate(gm, spec(2, 8), spec(device="cpu"), spec(8))  # bias on cuda meets x.cpu()
    error = raised.value
    assert error.node_name == "sub" and "cpu" in str(error) and "cuda:0" in str(error)
    assert "%sub" in str(error)


# --- a transformer (GPT), a CNN ----------------------------------------------------------

def expected_all_on(gm, device):
    """torch's rule for a graph whose inputs and weights all live on one device: every tensor
    lives there; `x.device` is that device; sizes are ints."""
    expected = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "call_method" and node.target == "size":
            expected[node.name] = int
        elif node.op == "call_function" and node.target is getattr and node.args[1] == "device":
            expected[node.name] = device
        elif node.op == "call_function" and node.target is getattr and node.args[1] == "shape":
            expected[node.name] = torch.Size
        elif node.op == "call_function" and _size_arithmetic(node, expected):
            expected[node.name] = int  # arithmetic on sizes: x.shape[-1] // 2
        else:
            expected[node.name] = device
    return expected


def _size_arithmetic(node, expected) -> bool:
    if getattr(node.target, "__module__", None) not in ("_operator", "operator"):
        return False
    inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
    return bool(inputs) and all(expected.get(a.name) in (int, torch.Size) for a in inputs)


def check_all_on(gm, device):
    got = annotations(gm)
    for name, want in expected_all_on(gm, device).items():
        if isinstance(want, type):
            assert isinstance(got[name], want), (name, got[name])
        elif isinstance(got[name], tuple):  # several outputs (split): each lives there
            assert set(got[name]) == {want}, (name, got[name])
        else:
            assert got[name] == want, (name, got[name])


@pytest.mark.parametrize("make", [spec, fake], ids=["TensorSpec", "FakeTensor"])
def test_gpt_is_annotated_for_cuda(make):
    model, (idx,) = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model.to("meta"))
    out = fxprop.propagate(gm, make(*idx.shape, dtype=torch.int64), param_device="cuda:0")
    check_all_on(gm, CUDA0)
    assert out.device == CUDA0 and tuple(out.shape) == (2, 16, 512)
    sdpa = next(n for n in gm.graph.nodes if n.name == "scaled_dot_product_attention")
    # float32 on cuda: flash needs half precision, so the memory-efficient kernel runs; its output
    # is laid out (batch, seq, heads, head_dim) and returned transposed (attention.cpp).
    heads, seq, head_dim = 4, 16, 16
    assert sdpa.meta["val"].stride() == (seq * heads * head_dim, head_dim, heads * head_dim, 1)


@pytest.mark.parametrize("make", [spec, fake], ids=["TensorSpec", "FakeTensor"])
def test_cnn_is_annotated_for_cuda(make):
    model, (x,) = examples.cnn_example()
    gm = torch.fx.symbolic_trace(model.to("meta"))
    out = fxprop.propagate(gm, make(*x.shape), param_device="cuda:0")
    check_all_on(gm, CUDA0)
    assert out.device == CUDA0 and tuple(out.shape) == (2, 10)


def test_cnn_with_cuda_weights_and_a_cpu_input_names_the_first_conv():
    model, (x,) = examples.cnn_example()
    gm = torch.fx.symbolic_trace(model.to("meta"))
    with pytest.raises(fxprop.DeviceMismatchError) as raised:
        fxprop.propagate(gm, spec(*x.shape, device="cpu"), param_device="cuda:0")
    assert raised.value.node_name == "stem_0"
    assert "cuda:0" in str(raised.value) and "cpu" in str(raised.value)


# --- 3. parameters built on the meta device ----------------------------------------------

def small_llama():
    return examples.llama_on_meta(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256)


@pytest.mark.parametrize("make", [spec, fake], ids=["TensorSpec", "FakeTensor"])
def test_llama_on_meta_is_annotated_for_the_param_device(make):
    model = small_llama()
    gm = torch.fx.symbolic_trace(model)
    out = fxprop.propagate(gm, make(2, 16, dtype=torch.int64), param_device="cuda")  # "cuda" is cuda:0
    check_all_on(gm, CUDA0)
    assert out.device == CUDA0 and tuple(out.shape) == (2, 16, 256)
    inv_freq = next(n for n in gm.graph.nodes if n.op == "get_attr")
    assert inv_freq.meta["val"].device == CUDA0  # a buffer on meta lives on param_device
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was materialized
    assert model.inv_freq.device.type == "meta"


def test_meta_parameters_without_param_device_meet_cuda_inputs_as_torch_would_refuse():
    gm = torch.fx.symbolic_trace(small_llama())
    with pytest.raises(fxprop.DeviceMismatchError) as raised:
        fxprop.propagate(gm, spec(2, 16, dtype=torch.int64))
    # positions = arange(seq, device=tokens.device) is on cuda; the meta buffer inv_freq meets it first
    assert raised.value.node_name == "outer" and "meta" in str(raised.value) and "cuda:0" in str(raised.value)


def test_param_device_moves_only_meta_state_and_covers_buffers_and_constants():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            with torch.device("meta"):
                self.proj = torch.nn.Linear(4, 4)
                self.register_buffer("shift", torch.zeros(4))
                self.table = torch.ones(4)  # a plain tensor attribute: a constant
            self.cpu_scale = torch.nn.Parameter(torch.ones(4))  # real, on the CPU

        def forward(self, x):
            y = self.proj(x) + self.shift + self.table
            return y, y.cpu() * self.cpu_scale

    gm = torch.fx.symbolic_trace(Model())
    fxprop.propagate(gm, spec(2, 4), param_device=torch.device("cuda", 0))
    got = annotations(gm)
    assert got["proj"] == got["shift"] == got["table"] == got["add"] == got["add_1"] == CUDA0
    assert got["cpu_scale"] == CPU and got["mul"] == CPU


# --- 5. the same graphs for real on a GPU ------------------------------------------------

@needs_gpu
def test_mixed_graph_matches_a_real_cuda_run():
    gm = torch.fx.symbolic_trace(mixed)
    assert_matches_real(gm, spec(2, 8), spec(device="cpu"), spec(8, device="cpu"), check_device=True)


@needs_gpu
@pytest.mark.parametrize("example", ["gpt", "cnn"])
def test_models_match_a_real_cuda_run(example):
    model, (x,) = examples.gpt_example() if example == "gpt" else examples.cnn_example()
    gm = torch.fx.symbolic_trace(model.cuda())
    assert_matches_real(gm, spec(*x.shape, dtype=x.dtype), check_device=True)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_attention_layouts_match_a_real_cuda_run(dtype):
    gm = torch.fx.symbolic_trace(lambda x: F.scaled_dot_product_attention(
        x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2), is_causal=True))
    assert_matches_real(gm, spec(2, 8, 4, 16, dtype=dtype), check_device=True)


def test_a_70b_sized_layer_on_meta_is_annotated_for_cuda_without_materializing():
    model = examples.llama_on_meta(n_layers=1)  # Llama-3-70B dimensions, one of its 80 layers
    gm = torch.fx.symbolic_trace(model)
    out = fxprop.propagate(gm, spec(1, 4096, dtype=torch.int64), param_device="cuda:0")
    assert out.device == CUDA0 and tuple(out.shape) == (1, 4096, 128256)
    assert gm.meta["fxprop"]["fallback_bytes"] == 0
    check_all_on(gm, CUDA0)
