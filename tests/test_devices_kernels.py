"""CUDA-only kernels on a CPU-only torch build: the SDPA backend torch picks on a GPU (and the
layout of its output), cuDNN ops, _scaled_mm and fused optimizer steps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fxprop
from fxprop.rules import sdpa_backends

aten = torch.ops.aten
CUDA0 = torch.device("cuda", 0)


def spec(*shape, dtype=torch.float32, device="cuda:0", stride=None):
    return fxprop.TensorSpec(shape, dtype=dtype, device=device, stride=stride)


def contiguous_strides(*shape):
    return torch.empty(shape, device="meta").stride()


def bhle_from_blhe(batch, heads, seq, head_dim):
    """Strides of a (batch, heads, seq, head_dim) view of a (batch, seq, heads, head_dim) tensor."""
    return (seq * heads * head_dim, head_dim, heads * head_dim, 1)


def attention_graph(**options):
    return torch.fx.symbolic_trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options))


def transposed(batch, heads, seq, head_dim, dtype):
    """(B, H, L, E) as a transpose of a contiguous (B, L, H, E), as attention layers make it."""
    return spec(batch, heads, seq, head_dim, dtype=dtype, stride=bhle_from_blhe(batch, heads, seq, head_dim))


def run(gm, *inputs):
    return fxprop.propagate(gm, *inputs)


# Each case: inputs, options, the backend torch picks on an sm80+ GPU by its default priority
# (flash, efficient, math, cudnn) and the output strides that backend's kernel leaves.
B, H, L, E = 2, 4, 8, 16
CASES = [
    ("float16 -> flash: output in query's layout", [transposed(B, H, L, E, torch.float16)] * 3, {"is_causal": True},
     SDPBackend.FLASH_ATTENTION, bhle_from_blhe(B, H, L, E)),
    ("bfloat16 contiguous -> flash: output contiguous like query",
     [spec(B, H, L, E, dtype=torch.bfloat16)] * 3, {}, SDPBackend.FLASH_ATTENTION, contiguous_strides(B, H, L, E)),
    ("float32 -> efficient: output laid out (B, L, H, E)", [spec(B, H, L, E)] * 3, {},
     SDPBackend.EFFICIENT_ATTENTION, bhle_from_blhe(B, H, L, E)),
    ("float16 with attn_mask -> efficient (flash takes no mask)",
     [spec(B, H, L, E, dtype=torch.float16)] * 3 + [spec(L, L, dtype=torch.float16)], {},
     SDPBackend.EFFICIENT_ATTENTION, bhle_from_blhe(B, H, L, E)),
    ("float16 causal with seqlen_q != seqlen_k -> efficient",
     [spec(B, H, 4, E, dtype=torch.float16), spec(B, H, L, E, dtype=torch.float16),
      spec(B, H, L, E, dtype=torch.float16)], {"is_causal": True},
     SDPBackend.EFFICIENT_ATTENTION, bhle_from_blhe(B, H, 4, E)),
    ("float16 head_dim 12 -> flash on inputs padded to 16, output sliced back",
     [spec(B, H, L, 12, dtype=torch.float16)] * 3, {}, SDPBackend.FLASH_ATTENTION, (H * L * 16, L * 16, 16, 1)),
    ("float32 head_dim 12 -> math (efficient needs a multiple of 8)", [spec(B, H, L, 12)] * 3, {},
     SDPBackend.MATH, contiguous_strides(B, H, L, 12)),
    ("float16 grouped-query -> flash (it supports enable_gqa)",
     [spec(B, H, L, E, dtype=torch.float16), spec(B, 2, L, E, dtype=torch.float16),
      spec(B, 2, L, E, dtype=torch.float16)], {"enable_gqa": True}, SDPBackend.FLASH_ATTENTION,
     contiguous_strides(B, H, L, E)),
    ("float32 grouped-query -> math (efficient does not group heads)",
     [spec(B, H, L, E), spec(B, 2, L, E), spec(B, 2, L, E)], {"enable_gqa": True}, SDPBackend.MATH,
     contiguous_strides(B, H, L, E)),
    ("3-D inputs -> math", [spec(H, L, E, dtype=torch.float16)] * 3, {}, SDPBackend.MATH,
     contiguous_strides(H, L, E)),
]


@pytest.mark.parametrize("case,inputs,options,backend,strides", CASES, ids=[c[0] for c in CASES])
def test_sdpa_on_cuda_picks_torchs_backend_and_its_layout(case, inputs, options, backend, strides):
    q, k, v, *mask = inputs
    metas = [i.to_meta() for i in inputs]
    call = sdpa_backends.Call(metas[0], metas[1], metas[2], metas[3] if mask else None, 0.0,
                               options.get("is_causal", False), None, options.get("enable_gqa", False))
    assert sdpa_backends.choose(call) == backend
    gm = (torch.fx.symbolic_trace(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
          if mask else attention_graph(**options))
    out = run(gm, *inputs)
    assert out.device == CUDA0 and tuple(out.shape) == (*q.shape[:-1], v.shape[-1])
    assert out.stride() == strides


def test_sdpa_backends_disabled_by_the_user_are_skipped():
    gm = attention_graph(is_causal=True)
    q = transposed(B, H, L, E, torch.float16)
    with sdpa_kernel([SDPBackend.MATH]):
        out = run(gm, q, q, q)
    assert out.stride() == contiguous_strides(B, H, L, E)  # the math path's matmuls are contiguous
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert run(gm, q, q, q).stride() == bhle_from_blhe(B, H, L, E)


def test_sdpa_with_no_usable_backend_says_why():
    gm = attention_graph()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(fxprop.PropagationError, match="no CUDA backend.*float16 or bfloat16"):
            run(gm, spec(B, H, L, E), spec(B, H, L, E), spec(B, H, L, E))


def test_cudnn_attention_runs_when_it_is_the_only_backend_left():
    gm = attention_graph()
    q = transposed(B, H, L, E, torch.float16)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = run(gm, q, q, q)
    assert out.device == CUDA0 and tuple(out.shape) == (B, H, L, E)


def test_sdpa_variants_called_directly_resolve_through_their_meta_kernels():
    q = transposed(B, H, L, E, torch.float16)
    for op, args in ((aten._scaled_dot_product_flash_attention.default, (0.0, True)),
                     (aten._scaled_dot_product_efficient_attention.default, (None, False)),
                     (aten._scaled_dot_product_cudnn_attention.default, (None, False))):
        gm = torch.fx.symbolic_trace(lambda q, k, v: op(q, k, v, *args))
        out = fxprop.propagate(gm, q, q, q)
        assert out[0].device == CUDA0 and tuple(out[0].shape) == (B, H, L, E)


# --- cuDNN ops, _scaled_mm, fused optimizers -----------------------------------------------

def one_call(op, *args, **kwargs):
    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"in{i}") for i in range(sum(isinstance(a, fxprop.TensorSpec) for a in args))]
    feed = iter(placeholders)
    node_args = tuple(next(feed) if isinstance(a, fxprop.TensorSpec) else a for a in args)
    graph.output(graph.call_function(op, node_args, kwargs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return fxprop.propagate(gm, *[a for a in args if isinstance(a, fxprop.TensorSpec)])


def test_cudnn_convolution_keeps_channels_last():
    weight = spec(4, 3, 3, 3)
    out = one_call(aten.cudnn_convolution.default, spec(2, 3, 8, 8), weight, [1, 1], [1, 1], [1, 1], 1,
                   False, False, True)
    assert out.device == CUDA0 and tuple(out.shape) == (2, 4, 8, 8) and out.is_contiguous()
    channels_last = spec(2, 3, 8, 8, stride=(192, 1, 24, 3))
    out = one_call(aten.cudnn_convolution.default, channels_last, weight, [1, 1], [2, 2], [1, 1], 1,
                   False, False, True)
    assert tuple(out.shape) == (2, 4, 4, 4) and out.is_contiguous(memory_format=torch.channels_last)


def test_cudnn_convolution_transpose_shape():
    # H_out = (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 = 16
    out = one_call(aten.cudnn_convolution_transpose.default, spec(2, 4, 8, 8), spec(4, 3, 3, 3), [1, 1], [1, 1],
                   [2, 2], [1, 1], 1, False, False, True)
    assert out.device == CUDA0 and tuple(out.shape) == (2, 3, 16, 16)


def test_cudnn_grid_sampler_shape():
    out = one_call(aten.cudnn_grid_sampler.default, spec(2, 3, 8, 8), spec(2, 5, 6, 2))
    assert out.device == CUDA0 and tuple(out.shape) == (2, 3, 5, 6)


def test_scaled_mm_on_cuda():
    a = spec(16, 32, dtype=torch.float8_e4m3fn)
    b = spec(32, 16, dtype=torch.float8_e4m3fn, stride=(1, 32))  # column-major, as cuBLASLt wants
    out = one_call(aten._scaled_mm.default, a, b, spec(), spec(), out_dtype=torch.bfloat16)
    assert out.device == CUDA0 and tuple(out.shape) == (16, 16) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("op,lists,options", [
    (aten._fused_sgd_.default, 3, dict(weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False,
                                       maximize=False, is_first_step=True)),
    (aten._fused_adagrad_.default, 4, dict(lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-8, maximize=False)),
    (aten._fused_adam_.default, 6, dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False,
                                        maximize=False)),
    (aten._fused_adamw_.default, 6, dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False,
                                         maximize=False)),
])
def test_fused_optimizer_steps_propagate_on_cuda(op, lists, options):
    graph = torch.fx.Graph()
    groups = [[graph.placeholder(f"l{i}_{j}") for j in range(2)] for i in range(lists)]
    graph.output(graph.call_function(op, tuple(groups), options))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    inputs = []
    for i in range(lists):
        is_step = (op in (aten._fused_adam_.default, aten._fused_adamw_.default) and i == 5) or \
                  (op is aten._fused_adagrad_.default and i == 3)
        inputs += [spec() if is_step else spec(3, 4) for _ in range(2)]
    assert fxprop.propagate(gm, *inputs) is None


def test_fused_adam_with_a_tensor_lr_and_a_grad_on_another_device():
    graph = torch.fx.Graph()
    groups = [[graph.placeholder(f"l{i}")] for i in range(6)]
    lr = graph.placeholder("lr")
    options = dict(lr=lr, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    graph.output(graph.call_function(aten._fused_adam_.tensor_lr, tuple(groups), options))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    params = [spec(3, 4) for _ in range(5)] + [spec()]
    assert fxprop.propagate(gm, *params, spec(device="cpu")) is None  # lr may be a 0-dim CPU tensor
    with pytest.raises(fxprop.DeviceMismatchError):
        fxprop.propagate(gm, params[0], spec(3, 4, device="cpu"), *params[2:], spec(device="cpu"))


_host_only = torch.library.Library("fxprop_devices_test", "DEF")
_host_only.define("shifted(Tensor x) -> Tensor")
for _key in ("CPU", "CUDA"):  # kernels for both devices, no meta kernel
    _host_only.impl("shifted", lambda x: x[1:] - x[:-1], _key)


def test_a_cuda_target_op_with_no_meta_kernel_falls_back_on_the_host():
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.fxprop_devices_test.shifted(x))
    out = fxprop.propagate(gm, spec(5, dtype=torch.int64))
    assert tuple(out.shape) == (4,)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert out.device == CUDA0 and node.meta["fxprop"].kind == "fallback" and node.meta["fxprop"].fallback_bytes > 0


class LearnedBiasAttention(torch.nn.Module):
    """T5's shape: the attention mask is a learned position bias, so it requires grad."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, 2, 5, 5))

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


@pytest.mark.parametrize("trace", ["symbolic_trace", "export"])
def test_sdpa_on_the_cpu_with_a_mask_that_requires_grad_takes_the_math_path(trace):
    from fxprop.testing import assert_matches_real
    model, q = LearnedBiasAttention(), torch.randn(1, 2, 5, 8)
    gm = torch.fx.symbolic_trace(model) if trace == "symbolic_trace" else torch.export.export(model, (q, q, q)).module()
    assert_matches_real(gm, q, q, q)


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("inputs_require_grad", [True, False], ids=["qkv_grad", "qkv_plain"])
@pytest.mark.parametrize("mask", [None, "plain", "requires_grad", "bool"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_on_the_cpu_takes_the_real_backend_and_layout(grad_mode, inputs_require_grad, mask, dtype):
    from fxprop.rules.attention import choose_backend
    from fxprop.testing import assert_matches_real
    q = torch.randn(2, 2, 6, 8, dtype=dtype).transpose(1, 2).contiguous().transpose(1, 2)  # not contiguous
    q.requires_grad_(inputs_require_grad)
    masks = {None: None, "plain": torch.randn(1, 2, 6, 6, dtype=dtype),
             "requires_grad": torch.randn(1, 2, 6, 6, dtype=dtype, requires_grad=True),
             "bool": torch.rand(6, 6) > 0.5}
    attn_mask = masks[mask]
    with torch.set_grad_enabled(grad_mode):
        real_choice = torch._fused_sdp_choice(q, q, q, attn_mask=attn_mask)
        assert int(choose_backend(torch.device("cpu"), q, q, q, attn_mask, 0.0, False, None, False)) == real_choice
        graph = torch.fx.Graph()
        nodes = [graph.placeholder(name) for name in ("q", "m")]
        graph.output(graph.call_function(F.scaled_dot_product_attention, (nodes[0], nodes[0], nodes[0]),
                                         {"attn_mask": nodes[1]}))
        assert_matches_real(torch.fx.GraphModule(torch.nn.Module(), graph), q, attn_mask)
