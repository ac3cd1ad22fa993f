"""`fxprop.estimate` against real execution: FLOPs, live bytes per node, the peak and its node.

The reference (`Measured`) runs the graph for real on the CPU, node by node, freeing dead
values as `torch.fx.Interpreter(garbage_collect_values=True)` does, and after each node
measures the distinct live storages by their data pointers (inputs, get_attr tensors and
the state of called modules included) and the FLOPs that `FlopCounterMode` counts for it.
`FlopCounterMode` is given formulas for the two fused CPU kernels torch's registry lacks
(`fxprop.estimate.EXTRA_FORMULAS`); `test_extra_formulas_agree_with_the_composite_path`
checks that they count what the composite path counts.
"""
import copy
import doctest
import json

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

import fxprop
from fxprop import examples
from fxprop.estimate import EXTRA_FORMULAS


# --- the reference ----------------------------------------------------------------------

def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _storage(tensor):
    storage = tensor.untyped_storage()
    return (storage.data_ptr() if storage.nbytes() else id(storage)), storage.nbytes()


class Measured(torch.fx.Interpreter):
    """Real execution; ``records``: (node, FLOPs, live bytes just after it) in node order."""

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=True)
        self.held = {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                self.hold(self.fetch_attr(node.target))
            elif node.op == "call_module":
                module = self.fetch_attr(node.target)
                self.hold([*module.parameters(), *module.buffers()])
        self.records = []

    def hold(self, value):
        self.held.update(_storage(t) for t in _tensors(value))

    def run(self, *args):
        self.hold(args)  # the caller keeps its inputs
        return super().run(*args)

    def run_node(self, node):
        with FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS) as counter:
            result = super().run_node(node)
        live = dict(self.held)
        # the values it used last are freed after this; a value nothing uses, after its own node
        kept = [value for earlier, value in self.env.items()
                if earlier.users or earlier.op not in ("call_function", "call_method", "call_module")]
        for value in [*kept, result]:
            live.update(_storage(t) for t in _tensors(value))
        self.records.append((node.name, counter.get_total_flops(), sum(live.values())))
        return result


def measure(gm, *inputs):
    run = Measured(gm)
    with torch.no_grad():
        run.run(*copy.deepcopy(inputs))  # in-place ops must not touch the caller's inputs
    return run.records


def assert_matches(est, records, device="cpu"):
    """Every node's FLOPs and live bytes, the totals, the peak and the node after which it occurs."""
    assert [node.name for node in est.nodes] == [name for name, _, _ in records]
    got = [(node.name, node.flops, node.live_bytes.get(device, 0)) for node in est.nodes]
    assert got == records
    peak_name, _, peak = max(records, key=lambda record: record[2])  # max keeps the first of equals
    assert est.flops == sum(flops for _, flops, _ in records)
    assert est.peak_bytes[device] == peak and est.peak_node[device] == peak_name
    assert set(est.peak_bytes) == {device}


# --- models ------------------------------------------------------------------------------

def small_llama():
    config = examples.LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)
    return examples.Llama(config).eval(), (torch.randint(0, 256, (2, 16)),)


MODELS = {
    "mlp": examples.mlp_example,
    "cnn_eval": examples.cnn_example,
    "cnn_train": lambda: (examples.ResNet().train(), (torch.randn(2, 3, 32, 32),)),
    "gpt": examples.gpt_example,
    "lstm": examples.lstm_example,
    "llama": small_llama,
}


class Aliasing(nn.Module):
    """In-place ops on an input and on activations, views, and outputs that alias inputs."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x, y):
        x.add_(1)
        flat = x.view(-1)
        doubled = torch.relu(flat * 2)
        doubled.relu_()
        head = doubled[:16]
        y.mul_(2)
        scaled = (x * self.scale).t()
        return x, head, scaled.contiguous(), y, doubled.view(x.shape)


def aliasing_example():
    return Aliasing(), (torch.randn(4, 8), torch.randn(3))


def trace(model, inputs, how):
    if how == "fx":
        return torch.fx.symbolic_trace(model)
    if how == "export":
        return torch.export.export(model, inputs).module()
    return make_fx(model)(*inputs)


@pytest.mark.parametrize("how", ["fx", "export", "make_fx"])
@pytest.mark.parametrize("name", [*MODELS, "aliasing"])
def test_matches_real_execution(name, how):
    if name == "aliasing" and how == "export":
        pytest.skip("torch.export refuses a graph whose outputs alias its inputs")
    model, inputs = (MODELS.get(name) or aliasing_example)()
    gm = trace(model, copy.deepcopy(inputs), how)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    est = fxprop.estimate(gm, *inputs)
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items())  # nothing mutated
    assert not est.flops_unknown
    assert_matches(est, measure(gm, *inputs))


def test_views_and_in_place_ops_allocate_nothing():
    model, inputs = aliasing_example()
    est = fxprop.estimate(torch.fx.symbolic_trace(model), *inputs)
    allocated = {node.name: node.allocated_bytes for node in est.nodes}
    assert allocated["add_"] == allocated["view"] == allocated["relu_"] == allocated["getitem"] == 0
    assert allocated["mul_"] == allocated["t"] == allocated["view_1"] == 0
    assert allocated["mul"] == allocated["relu"] == 4 * 32 and allocated["contiguous"] == 4 * 32
    assert est.input_bytes == {"cpu": 4 * (32 + 3)} and est.state_bytes == {"cpu": 4 * 8}


def test_an_annotated_graph_is_read_not_propagated_again(monkeypatch):
    model, inputs = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    first = fxprop.estimate(gm, *inputs)

    def refuse(*args, **kwargs):
        raise AssertionError("propagated again")
    monkeypatch.setattr(fxprop, "propagate", refuse)
    assert fxprop.estimate(gm).to_dict() == first.to_dict()
    with pytest.raises(fxprop.InputError, match="has not been propagated; give its inputs"):
        fxprop.estimate(torch.fx.symbolic_trace(model))


def test_cuda_graph_has_the_cpu_figures_under_its_device():
    for build in (examples.gpt_example, examples.cnn_example):
        model, inputs = build()
        with torch.device("meta"):  # built there, so that tied weights stay tied
            on_meta, _ = build()
        specs = [fxprop.TensorSpec(tuple(x.shape), dtype=x.dtype, device="cuda:0") for x in inputs]
        est = fxprop.estimate(torch.fx.symbolic_trace(on_meta), *specs, param_device="cuda:0")
        assert_matches(est, measure(torch.fx.symbolic_trace(model), *inputs), device="cuda:0")


# --- symbolic sizes ---------------------------------------------------------------------

SYMBOLIC = {  # model, its input spec, real inputs at two sizes
    "gpt": (examples.gpt_example, fxprop.TensorSpec(("B", "T"), dtype=torch.int64),
            [dict(B=2, T=16), dict(B=3, T=40)], lambda B, T: torch.randint(0, 512, (B, T))),
    "llama": (small_llama, fxprop.TensorSpec(("B", "T"), dtype=torch.int64),
              [dict(B=1, T=5), dict(B=3, T=16)], lambda B, T: torch.randint(0, 256, (B, T))),
    "lstm": (examples.lstm_example, fxprop.TensorSpec(("B", "T"), dtype=torch.int64),
             [dict(B=1, T=3), dict(B=4, T=9)], lambda B, T: torch.randint(0, 100, (B, T))),
    "cnn": (examples.cnn_example, fxprop.TensorSpec(("B", 3, "H", "W")),
            [dict(B=1, H=7, W=9), dict(B=2, H=32, W=17)], lambda B, H, W: torch.randn(B, 3, H, W)),
}


@pytest.mark.parametrize("name", SYMBOLIC)
def test_symbolic_counts_evaluate_to_the_real_figures(name):
    build, spec, sizes, real_input = SYMBOLIC[name]
    model, _ = build()
    est = fxprop.estimate(torch.fx.symbolic_trace(model), spec)
    assert est.is_symbolic and not est.flops_unknown
    assert set(est.symbols) == set(sizes[0]) and all(bounds.kind == "input" for bounds in est.symbols.values())
    for at_sizes in sizes:
        at = est.evaluate(**at_sizes)
        assert not at.is_symbolic
        assert_matches(at, measure(torch.fx.symbolic_trace(model), real_input(**at_sizes)))


def test_symbolic_gpt_in_closed_form():
    model, _ = examples.gpt_example()
    est = fxprop.estimate(torch.fx.symbolic_trace(model), fxprop.TensorSpec(("B", "T"), dtype=torch.int64))
    B, T = sympy.symbols("B T", integer=True, positive=True)
    assert est.flops == 512 * B * T**2 + 262144 * B * T
    assert est.peak_node == {"cpu": "gelu"} and est.peak_bytes == {"cpu": 2312 * B * T + 547840}
    assert est.evaluate({"B": 2}).evaluate(T=16).to_dict() == est.evaluate(B=2, T=16).to_dict()
    with pytest.raises(fxprop.InputError, match="no symbol 'C'"):
        est.evaluate(C=3)


class SizeDependentPeak(nn.Module):
    """A batch-sized temporary, then a fixed-size one: which is larger depends on the batch."""

    def forward(self, x):
        wide = x.repeat(1, 64).sum(1)
        fixed = torch.ones(4096, device=x.device).sum()
        return wide + fixed


def test_a_peak_node_that_depends_on_the_sizes_lists_its_candidates():
    model = SizeDependentPeak()
    est = fxprop.estimate(torch.fx.symbolic_trace(model), fxprop.TensorSpec(("B", 16)))
    B = sympy.Symbol("B", integer=True, positive=True)
    assert est.peak_node == {"cpu": None}
    # measured after each reduction, before its input is freed: x, the temporary and the sum are live
    assert dict(est.peak_candidates["cpu"]) == {"sum_1": 4164 * B, "sum_2": 68 * B + 16388}
    assert est.peak_bytes["cpu"] == sympy.Max(4164 * B, 68 * B + 16388)
    conditions = dict(est.peak_conditions("cpu"))
    assert conditions["sum_1"].subs(B, 5) and not conditions["sum_1"].subs(B, 4)
    for batch, node in ((2, "sum_2"), (8, "sum_1")):
        at = est.evaluate(B=batch)
        assert at.peak_node == {"cpu": node}
        assert_matches(at, measure(torch.fx.symbolic_trace(model), torch.randn(batch, 16)))


class Nonzero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x).float().sum(0)


def test_data_dependent_sizes_stay_symbolic_with_their_bounds():
    x = torch.tensor([[0.0, 1.0, 2.0, 0.0, 3.0]] * 4)
    gm = torch.fx.symbolic_trace(Nonzero())
    est = fxprop.estimate(gm, fxprop.TensorSpec((4, 5)))
    u0 = sympy.Symbol("u0", integer=True)
    assert est.symbols["u0"].kind == "size" and (est.symbols["u0"].lower, est.symbols["u0"].upper) == (0, 20)
    assert est.symbols["u0"].node == "nonzero"
    assert est.peak_candidates["cpu"] == (("float_1", 24 * u0 + 80), ("sum_1", 8 * u0 + 88))  # u0 may be 0
    assert est.peak_node["cpu"] is None and est.evaluate(u0=1).peak_node["cpu"] == "float_1"
    assert_matches(est.evaluate(u0=int((x != 0).sum())), measure(gm, x))


# --- training graphs --------------------------------------------------------------------

def _joint_graph(model, inputs):
    """AOT autograd's joint forward+backward graph of ``model``, its default partition, and real inputs."""
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition
    state = dict([*model.named_parameters(), *model.named_buffers()])
    names = list(state)
    captured = {}

    def partition(joint, joint_inputs, **options):
        captured.update(joint=joint, num_fwd_outputs=options["num_fwd_outputs"])
        captured["forward"], backward = default_partition(joint, joint_inputs, **options)
        return captured["forward"], backward

    call = aot_function(lambda *args: torch.func.functional_call(model, dict(zip(names, args[len(inputs):])),
                                                                 args[:len(inputs)]),
                        fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, partition_fn=partition)
    out = call(*inputs, *(copy.deepcopy(t) for t in state.values()))  # buffers as inputs: BatchNorm updates them
    primals = [*inputs, *(t.detach().clone() for t in state.values())]
    return captured, primals, [torch.ones_like(out)]


@pytest.mark.parametrize("name", ["mlp", "cnn_train", "gpt"])
def test_joint_training_graph(name):
    model, inputs = MODELS[name]()
    captured, primals, tangents = _joint_graph(model, inputs)
    joint = captured["joint"]
    est = fxprop.estimate(joint, primals, tangents)
    assert_matches(est, measure(joint, primals, tangents))
    tagged = {node.name for node in joint.graph.nodes
              if node.meta.get("partitioner_tag") == "is_backward" and node.op != "placeholder"}
    assert tagged and {node.name for node in est.nodes if node.backward} == tagged
    assert est.saved_for_backward and est.saved_for_backward_bytes["cpu"] > 0
    # the definition agrees with torch's own partition: its forward graph returns what it saves
    forward = fxprop.estimate(captured["forward"], *primals, forward_outputs=captured["num_fwd_outputs"])
    assert forward.saved_for_backward_bytes == est.saved_for_backward_bytes


def test_make_fx_of_autograd_grad():
    model, (x,) = examples.mlp_example()
    params = {name: p.detach().requires_grad_() for name, p in model.named_parameters()}

    def step(params, x):
        loss = torch.func.functional_call(model, params, (x,)).relu().sum()
        return loss, torch.autograd.grad(loss, list(params.values()))

    gm = make_fx(step)(params, x)
    est = fxprop.estimate(gm, params, x)
    assert_matches(est, measure(gm, params, x))
    names = [node.name for node in est.nodes]
    assert [node.name for node in est.nodes if node.backward][0] == "ones_like"
    assert not any(node.backward for node in est.nodes[:names.index("ones_like")])
    assert set(est.saved_for_backward) >= {"relu", "relu_1"}  # the activations ReLU's gradient reads
    batch_by_width = lambda width: 4 * 8 * width
    assert est.saved_for_backward_bytes["cpu"] == batch_by_width(64) * 2 + batch_by_width(10)


# --- formulas, results, documentation ---------------------------------------------------

def test_extra_formulas_agree_with_the_composite_path():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))

    def flops(run, context):
        with torch.no_grad(), context, FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS) as counter:
            run()
        return counter.get_flop_counts()["Global"]

    attend = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fused, math = flops(attend, sdpa_kernel(SDPBackend.FLASH_ATTENTION)), flops(attend, sdpa_kernel(SDPBackend.MATH))
    assert list(fused) == [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu]
    assert sum(fused.values()) == sum(math.values()) == 4 * 2 * 4 * 16 * 16 * 8
    lstm, x = nn.LSTM(32, 48, num_layers=2, batch_first=True), torch.randn(3, 12, 32)
    run = lambda: lstm(x)
    fused = flops(run, torch.backends.mkldnn.flags(enabled=True))
    composite = flops(run, torch.backends.mkldnn.flags(enabled=False))
    assert list(fused) == [torch.ops.aten.mkldnn_rnn_layer]
    assert sum(fused.values()) == sum(composite.values())


@pytest.mark.parametrize("rnn", [nn.LSTM(8, 16, 2, batch_first=True), nn.GRU(8, 16, bidirectional=True),
                                 nn.RNN(8, 16, 3, bidirectional=True, batch_first=True),
                                 nn.LSTM(8, 16, 2, bidirectional=True, proj_size=4), nn.LSTM(8, 16, bias=False)],
                         ids=["lstm", "gru_bidirectional", "rnn_3_layers", "lstm_projected", "lstm_no_bias"])
def test_recurrent_modules(rnn):
    gm = torch.fx.symbolic_trace(nn.Sequential(rnn))
    x = torch.randn(3, 5, 8)
    assert_matches(fxprop.estimate(gm, x), measure(gm, x))
    with torch.backends.mkldnn.flags(enabled=False):  # the composite path counts the same
        assert_matches(fxprop.estimate(gm, x), measure(gm, x))


class ScanAndMap(nn.Module):
    """A recurrence by scan and a batched matmul by map: each body runs once per slice of dim 0."""

    def forward(self, xs, w):
        from torch._higher_order_ops.map import map as map_over
        from torch._higher_order_ops.scan import scan

        def step(carry, x):
            new = carry @ w + x
            return new, new.sum()

        carry, sums = scan(step, torch.zeros(xs.shape[1], w.shape[1]), xs)
        return carry, sums, map_over(lambda x, w: torch.tanh(x @ w), xs, w)


def unrolled_scan_and_map(xs, w):
    """What ScanAndMap computes, as the python loops that FlopCounterMode can watch."""
    carry = torch.zeros(xs.shape[1], w.shape[1])
    for x in xs:
        carry = carry @ w + x
        carry.sum()
    return [torch.tanh(x @ w) for x in xs]


@pytest.mark.parametrize("length", [1, 5])
def test_scan_and_map_count_their_body_once_per_slice(length):
    xs, w = torch.randn(length, 4, 4), torch.randn(4, 4)
    gm = torch.export.export(ScanAndMap(), (xs, w)).module()
    with FlopCounterMode(display=False) as counter:
        unrolled_scan_and_map(xs, w)
    est = fxprop.estimate(gm, xs, w)
    assert not est.flops_unknown
    assert est.flops == counter.get_total_flops()


def test_scan_length_stays_symbolic():
    xs, w = torch.randn(5, 4, 4), torch.randn(4, 4)
    length = torch.export.Dim("length", min=2)
    ep = torch.export.export(ScanAndMap(), (xs, w), dynamic_shapes=({0: length}, None))
    est = fxprop.estimate(ep.module(), fxprop.TensorSpec(("T", 4, 4)), w)
    T = sympy.Symbol("T", positive=True, integer=True)
    with FlopCounterMode(display=False) as counter:
        unrolled_scan_and_map(torch.randn(7, 4, 4), w)
    assert sympy.sympify(est.flops).free_symbols == {T}
    assert sympy.sympify(est.flops).subs(T, 7) == counter.get_total_flops()


def test_ops_wrapped_by_with_effects_and_auto_functionalized_count_once():
    """AOT autograd's forward graph: a print ordered by a token (``with_effects``), a compiled region
    that mutates an input (``auto_functionalized_v2`` of ``invoke_subgraph``)."""
    sys_path_has_tests()
    from test_higher_order import _aot_forward
    from torch._higher_order_ops.print import print as hop_print

    @torch.compiler.nested_compile_region
    def region(x, buffer):
        buffer.add_(1)
        return x @ x

    def program(x, buffer):
        y = region(x, buffer) + region(x, buffer)
        hop_print("y = {}", y)
        torch.ops.aten._print("printed")
        return torch.mm(y, x)

    x, buffer = torch.randn(4, 4), torch.zeros(4, 4)
    with FlopCounterMode(display=False) as counter:
        program(x, buffer.clone())
    gm, inputs = _aot_forward(program, x, buffer)
    targets = {n.target for n in gm.graph.nodes}
    assert {torch.ops.higher_order.with_effects, torch.ops.higher_order.auto_functionalized_v2} <= targets
    est = fxprop.estimate(gm, *inputs)
    assert not est.flops_unknown
    assert est.flops == counter.get_total_flops()


def sys_path_has_tests():
    import sys
    from pathlib import Path
    if str(Path(__file__).parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).parent))


def test_an_exported_associative_scan_counts_its_vmapped_combines_on_their_physical_sizes():
    """Adversary finding: export inlines associative_scan into vmap levels, whose values are batched
    tensors; the memory walk raised on their storage and the FLOPs used the per-example sizes."""
    from torch._higher_order_ops.associative_scan import associative_scan

    class Scan(nn.Module):
        def forward(self, xs):
            return associative_scan(lambda a, b: a @ b, xs, 0, combine_mode="generic")

    xs = torch.randn(5, 4, 4)
    with FlopCounterMode(display=False) as counter:
        Scan()(xs)
    est = fxprop.estimate(torch.export.export(Scan(), (xs,)).module(), xs)
    assert not est.flops_unknown and est.flops == counter.get_total_flops()
    assert est.peak_bytes["cpu"] > 0


def test_while_loop_iterations_are_named_as_unknown():
    from torch._higher_order_ops.while_loop import while_loop

    class Loop(nn.Module):
        def forward(self, i, x, w):
            return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x @ w), (i, x))

    args = (torch.tensor(0), torch.randn(4, 4), torch.randn(4, 4))
    est = fxprop.estimate(torch.export.export(Loop(), args).module(), *args)
    assert list(est.flops_unknown.values()) == ["while_loop: how often its bodies run depends on the values"]


def test_to_dict_and_json():
    model, inputs = examples.mlp_example()
    est = fxprop.estimate(torch.fx.symbolic_trace(model), *inputs)
    document = json.loads(est.to_json())
    assert document["flops"] == est.flops and document["peak_bytes"] == est.peak_bytes
    assert document["peak_node"] == {"cpu": "relu"}
    assert set(document["nodes"][1]) == {"name", "op", "target", "flops", "allocated_bytes", "live_bytes", "backward"}
    assert sum(node["flops"] for node in document["nodes"]) == est.flops
    symbolic = fxprop.estimate(torch.fx.symbolic_trace(model), fxprop.TensorSpec(("B", 16)))
    assert json.loads(symbolic.to_json())["flops"] == "11520*B"


def test_llama_70b_shape():
    from fxprop.examples import llama_70b as llama
    found = llama.figures(batch=1, seq=2048)
    assert found["parameters"] == 70_553_706_496 and found["nodes"] == 5386  # the heads read from the projections (-1): 3 nodes more per layer
    assert found["parameter_bytes"] == 2 * found["parameters"]
    assert found["state_bytes"] == found["parameter_bytes"] + 4 * 64  # and the rotary frequencies, float32
    assert found["estimate_seconds"] > 0  # timed, never asserted: benchmarks and README report it


@pytest.mark.parametrize("module", ["fxprop.estimate", "fxprop.estimate.flops", "fxprop.estimate.sizes",
                                    "fxprop.examples.llama_70b", "fxprop.cli.estimate_report"])
def test_docstring_examples(module):
    import importlib
    found = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert found.failed == 0 and found.attempted > 0


@pytest.mark.parametrize("name", ["llama", "mixtral", "bert", "t5", "vit", "resnet"])
def test_matches_real_execution_on_corpus_models(name):
    """Real transformers architectures (tests/corpus), as ``ep.module()``: the same figures."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from corpus import harness, models
    model, inputs = models.build(name)
    gm = harness.export(model, inputs).module()
    args = list(inputs.values())
    with torch.no_grad():  # as the reference runs: T5's learned position bias picks SDPA's math path under grad
        est = fxprop.estimate(gm, *args)
    assert not est.flops_unknown
    assert_matches(est, measure(gm, *args))


def test_an_input_that_views_a_larger_storage_counts_the_storage_the_caller_holds():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(100)[:10]
    assert_matches(fxprop.estimate(gm, x), measure(gm, x))


def test_a_value_nothing_uses_is_freed_after_its_own_node():
    """An allocation whose value no node uses (make_fx records ``torch.empty(shape)`` of
    ``torch.empty(shape).stride()`` but not the ``stride()``) is live just after its node and freed
    then, as eager frees an unreferenced temporary; it was held to the end of the graph, which at
    70B sizes made ~0.5 GiB per layer of phantom memory."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    graph.call_function(torch.ops.aten.empty.memory_format, ([4096],), {"dtype": torch.float32})
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (doubled, 1)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x = torch.randn(64)
    est = fxprop.estimate(gm, x)
    assert_matches(est, measure(gm, x))
    names = [node.name for node in est.nodes]
    at = next(index for index, name in enumerate(names) if name.startswith("empty"))
    empty, after = est.nodes[at], est.nodes[at + 1]
    assert empty.live_bytes["cpu"] - after.live_bytes["cpu"] >= 4096 * 4 - 64 * 4
