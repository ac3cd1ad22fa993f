"""fxprop inside the pipelines that hand it graphs: torch.compile backends (dynamic on and off),
AOT autograd callbacks under their FakeTensorMode, ExportedPrograms, and the passes that read
what it writes."""
import io

import pytest
import torch
import torch.nn as nn

import fxprop
from fxprop import examples


class Block(nn.Module):
    """Linear, BatchNorm in training (dynamo wraps its momentum and eps as 0-dim tensors and
    reads them with .item()), a view, and python ints."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x, k: int):
        y = self.norm(self.linear(x)).relu() * k
        return y.view(-1, 4).sum(0), x.shape[0] * 2


def _agreement(gm: torch.fx.GraphModule) -> list:
    """Nodes where fxprop's value differs from dynamo's own example_value."""
    differences = []
    for node in gm.graph.nodes:
        traced, ours = node.meta.get("example_value"), node.meta.get("val")
        if isinstance(traced, torch.Tensor):
            if not isinstance(ours, torch.Tensor):
                differences.append((node.name, "not a tensor", type(ours)))
                continue
            for field in ("shape", "stride"):
                if str(tuple(getattr(traced, field)() if field == "stride" else traced.shape)) != \
                        str(tuple(getattr(ours, field)() if field == "stride" else ours.shape)):
                    differences.append((node.name, field, traced, ours))
            for field in ("dtype", "device", "requires_grad"):
                if getattr(traced, field) != getattr(ours, field):
                    differences.append((node.name, field, getattr(traced, field), getattr(ours, field)))
        elif isinstance(traced, torch.SymInt):
            if str(traced) != str(ours):
                differences.append((node.name, "value", traced, ours))
    return differences


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_compile_backend_gets_dynamos_own_metadata(dynamic):
    seen = {}

    def backend(gm, example_inputs):
        fxprop.propagate(gm, *example_inputs)
        seen["differences"] = _agreement(gm)
        seen["nodes"] = sum(1 for node in gm.graph.nodes if "example_value" in node.meta)
        seen["symbols"] = sorted(str(s) for s in gm.meta["fxprop"].get("symbols", {}))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(Block(), backend=backend, dynamic=dynamic)
    out, doubled = compiled(torch.randn(4, 8), 3)
    assert tuple(out.shape) == (4,) and doubled == 8
    assert seen["nodes"] > 5 and seen["differences"] == []
    if dynamic:
        assert seen["symbols"], "dynamic=True: results are expressions in dynamo's symbols"


def test_aot_callbacks_propagate_under_the_partitioners_fake_mode():
    from functorch.compile import aot_module_simplified
    propagated = []

    def compiler(gm, inputs):
        fxprop.propagate(gm, *inputs)  # AOT autograd calls this with its FakeTensorMode active
        propagated.append(all("val" in node.meta for node in gm.graph.nodes))
        return gm.forward

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler)

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))
    torch.compile(model, backend=backend)(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert propagated == [True, True]


def _python_dispatcher_on() -> bool:
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


def test_an_aot_callback_propagates_without_the_python_dispatcher_it_is_called_with():
    """AOTAutograd calls its compilers with torch's python dispatcher on: a propagation without
    symbols runs the kernels a call from anywhere else runs, and leaves the dispatcher on."""
    from functorch.compile import aot_module_simplified
    seen = []

    @torch.library.custom_op("fxprop_pipelines::doubled", mutates_args=())
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @doubled.register_fake
    def _(x):
        seen.append(("kernel", _python_dispatcher_on()))
        return torch.empty_like(x)

    def compiler(gm, inputs):
        seen.clear()
        seen.append(("called with", _python_dispatcher_on()))
        fxprop.propagate(gm, *inputs)
        seen.append(("left", _python_dispatcher_on()))
        return gm.forward

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler)

    torch._dynamo.reset()
    torch.compile(lambda x: doubled(x).relu(), backend=backend)(torch.randn(4, 8))
    assert seen[0] == ("called with", True) and seen[-1] == ("left", True)
    assert seen[1:-1] and all(entry == ("kernel", False) for entry in seen[1:-1])


def test_ambient_fake_mode_changes_nothing():
    from torch._subclasses.fake_tensor import FakeTensorMode
    gm = torch.fx.symbolic_trace(lambda x: torch.empty_strided((2, 3), (1, 2)) + x)
    outside = fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), cache=False)
    with FakeTensorMode():
        inside = fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), cache=False)
    assert (tuple(inside.shape), inside.stride()) == (tuple(outside.shape), outside.stride()) == ((2, 3), (1, 2))


class Program(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        self.offset.add_(1)
        return self.linear(x).relu() + self.offset


def _program():
    return torch.export.export(Program(), (torch.randn(3, 8),),
                               dynamic_shapes={"x": {0: torch.export.Dim("batch")}})


def test_an_exported_program_propagates_in_its_own_symbols_and_still_saves_and_decomposes():
    program = _program()
    for node in program.graph_module.graph.nodes:
        if node.op != "placeholder":
            node.meta.pop("val", None)
    out = fxprop.propagate(program)
    assert out.shape[1] == 4 and str(out.shape[0]) in {str(symbol) for symbol in program.range_constraints}
    assert all("val" in node.meta for node in program.graph_module.graph.nodes)
    saved = io.BytesIO()
    torch.export.save(program, saved)
    saved.seek(0)
    assert tuple(torch.export.load(saved).module()(torch.randn(5, 8)).shape) == (5, 4)
    assert "aten.add.Tensor" in program.run_decompositions().graph_module.code


def test_named_dims_of_an_exported_program_are_its_backed_symbols_and_it_still_saves_and_decomposes():
    import copy
    eager = Program()
    program = torch.export.export(copy.deepcopy(eager), (torch.randn(3, 8),),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    (batch,) = program.range_constraints
    out = fxprop.propagate(program, fxprop.TensorSpec(("B", 8)))
    assert fxprop.shape_of(next(n for n in program.graph_module.graph.nodes if n.op == "output"))[-1] == \
        (fxprop.symbolic.user_symbol("B"), 4)
    assert out.shape[0].node.expr == batch  # backed, in range_constraints: not a fresh unbacked symbol
    x = torch.randn(5, 8)
    with torch.no_grad():
        expected = copy.deepcopy(eager)(x)
    saved = io.BytesIO()
    torch.export.save(program, saved)
    saved.seek(0)
    torch.testing.assert_close(torch.export.load(saved).module()(x), expected)
    torch.testing.assert_close(program.run_decompositions().module()(x), expected)


def test_an_exported_program_takes_its_user_inputs():
    program = _program()
    out = fxprop.propagate(program, torch.randn(6, 8))
    assert tuple(out.shape) == (6, 4)
    with pytest.raises(fxprop.InputError, match="user inputs"):
        fxprop.propagate(program, torch.randn(6, 8), torch.randn(1))


def test_capability_partitioner_reads_the_type_fxprop_writes():
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OpSupports
    model, inputs = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    fxprop.propagate(gm, *inputs)
    assert all("type" in node.meta for node in gm.graph.nodes)
    support = OpSupports.decline_if_input_dtype(torch.int64)
    partitions = CapabilityBasedPartitioner(gm, support).propose_partitions()
    assert partitions


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_backend_helper_annotates_then_compiles(dynamic):
    seen = {}

    def inner(gm, example_inputs):
        seen["differences"] = _agreement(gm)  # dynamo's example_value, against fxprop's val
        seen["annotated"] = all("fxprop" in node.meta for node in gm.graph.nodes)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    model, x = Block().eval(), torch.randn(4, 8)
    compiled = torch.compile(model, backend=fxprop.backend(inner), dynamic=dynamic)
    out, doubled = compiled(x, 3)
    expected, _ = model(x, 3)
    assert torch.allclose(out, expected) and doubled == 8
    assert seen["annotated"] and seen["differences"] == []
    torch._dynamo.reset()


def test_the_backend_helper_can_write_dynamos_key():
    captured = {}

    def inner(gm, example_inputs):
        captured["same"] = all(node.meta["example_value"] is node.meta["val"] for node in gm.graph.nodes
                               if "val" in node.meta)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(4, 2), backend=fxprop.backend(inner, example_value=True))
    compiled(torch.randn(3, 4))
    assert captured["same"]
    with pytest.raises(fxprop.InputError, match="inner"):
        fxprop.backend(42)
    torch._dynamo.reset()


def test_a_graph_with_dynamos_inlined_vmap_propagates_and_leaves_functorch_as_it_was():
    """Dynamo inlines ``torch.vmap`` as calls that push and pop functorch levels
    (_vmap_increment_nesting, _add_batch_dim, ...): they run for real, in order, every time (never
    from the cache), and the process's functorch depth is the same afterwards."""
    seen = []

    def backend(gm, example_inputs):
        for _ in range(2):  # the second time with a warm cache
            fxprop.propagate(gm, *example_inputs)
            seen.append((_agreement(gm), torch._C._functorch.get_dynamic_layer_stack_depth()))
        return gm.forward

    def f(x, w):
        return torch.vmap(lambda row: (row * w).sum(0))(x).relu()

    torch._dynamo.reset()
    out = torch.compile(f, backend=backend)(torch.randn(4, 3), torch.randn(3))
    assert out.shape == (4,)
    assert seen == [([], 0), ([], 0)]


def test_a_failure_inside_a_vmap_level_leaves_functorch_as_it_was():
    from torch._functorch.predispatch import _add_batch_dim, _vmap_increment_nesting
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    level = graph.call_function(_vmap_increment_nesting, (4, "error"))
    batched = graph.call_function(_add_batch_dim, (x, 0, level))
    graph.output(graph.call_function(torch.mm, (batched, batched)))  # a 1-d row per level: refused
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(gm, torch.randn(4, 3))
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == 0


def _dynamo_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs[0]


@pytest.mark.parametrize("transform", ["jvp", "grad", "jacfwd"])
def test_a_failure_inside_a_functorch_transform_leaves_autograd_as_it_was(transform):
    """Adversary finding: a dynamo graph of ``torch.func.jvp`` that failed between entering and
    leaving forward AD left a dual level open (the next jvp raised "Nested forward mode AD"), and
    one of ``grad`` left saved-tensor hooks disabled."""
    calls = {"jvp": lambda x, w: torch.func.jvp(lambda y: y @ w, (x,), (x,)),
             "grad": lambda x, w: torch.func.grad(lambda y: (y @ w).sum())(x),
             "jacfwd": lambda x, w: torch.func.jacfwd(lambda y: y @ w)(x)}
    gm = _dynamo_graph(calls[transform], torch.randn(3, 3), torch.randn(3, 3))

    def modes():
        return (torch._C._functorch.get_dynamic_layer_stack_depth(), torch._C._is_fwd_grad_enabled(),
                torch._C._autograd._saved_tensors_hooks_is_enabled(), torch.is_grad_enabled())
    before = modes()
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(gm, torch.randn(3, 3), torch.randn(4, 4))
    assert modes() == before
    with torch.autograd.forward_ad.dual_level():
        pass
    assert torch.func.jvp(torch.sin, (torch.randn(2),), (torch.randn(2),))[1].shape == (2,)
    fxprop.propagate(gm, torch.randn(3, 3), torch.randn(3, 3))  # and the graph itself still propagates
    assert modes() == before


class MaskedAttention(nn.Module):
    """SDPA with a mask of fixed sizes and a query whose sizes dynamo makes symbolic."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.zeros(1, 1, 16, 16))

    def forward(self, x):
        q = x[:, :, : (x.shape[2] // 4) * 4]  # a length dynamo keeps as an expression, not a symbol it can replace
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.mask).relu()


def test_the_cpu_attention_kernel_is_chosen_at_dynamos_example_sizes():
    """The CPU's SDPA choice compares the mask's sizes with the query's: symbolic sizes take
    their example values (16 here), so the flash kernel's layout comes out as dynamo's does."""
    seen = {}

    def backend(gm, example_inputs):
        fxprop.propagate(gm, *example_inputs)
        seen["differences"] = _agreement(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(MaskedAttention(), backend=backend, dynamic=True)(torch.randn(2, 2, 16, 8))
    assert seen["differences"] == []


class PositionsAdded(nn.Module):
    def __init__(self):
        super().__init__()
        self.positions = nn.Embedding(64, 8)

    def forward(self, x):
        return x + self.positions(torch.arange(x.shape[1]))


@pytest.mark.parametrize("model, example", [(Block(), (torch.randn(4, 8), 3)),
                                            (PositionsAdded(), (torch.randn(2, 6, 8),))], ids=["block", "positions"])
def test_a_propagation_in_dynamos_shape_env_adds_no_guard_and_lists_what_it_decided(model, example):
    """What propagation decides in dynamo's ShapeEnv stays out of it (a guard a backend adds is the
    compiled program's guard: a recompile, or a specialized size); it is the run's assumption.
    The index check of ``arange(T)`` into 64 positions decides ``T - 1 < 64``, which dynamo did not."""
    seen = {}

    def backend(gm, example_inputs):
        env = torch._guards.detect_fake_mode(example_inputs).shape_env
        held = (len(env.guards), sum(len(a) for a in env.deferred_runtime_asserts.values()), dict(env.replacements))
        fxprop.propagate(gm, *example_inputs)
        seen["after"] = (len(env.guards), sum(len(a) for a in env.deferred_runtime_asserts.values()),
                         dict(env.replacements))
        seen["held"], seen["differences"] = held, _agreement(gm)
        seen["assumptions"] = [str(a) for a in gm.meta["fxprop"]["assumptions"]]
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, dynamic=True)(*example)
    assert seen["after"] == seen["held"] and seen["differences"] == []
    if isinstance(model, PositionsAdded):
        assert any("64" in assumption for assumption in seen["assumptions"]), seen["assumptions"]


class ShiftedWindows(nn.Module):
    """Swin's window partition: roll, a 6-d view, permute, reshape; layer norms before and after."""

    def __init__(self, channels: int = 8, window: int = 2):
        super().__init__()
        self.window = window
        self.before, self.after = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.mix = nn.Linear(channels, channels)

    def forward(self, x):
        batch, height, width, channels = x.shape
        w = self.window
        x = torch.roll(self.before(x), shifts=(-1, -1), dims=(1, 2))
        windows = x.view(batch, height // w, w, width // w, w, channels).permute(0, 1, 3, 2, 4, 5)
        windows = self.mix(windows.reshape(-1, w * w, channels))
        x = windows.view(batch, height // w, width // w, w, w, channels).permute(0, 1, 3, 2, 4, 5)
        return self.after(x.reshape(batch, height * width, channels))


def test_training_graphs_in_dynamos_shape_env_get_no_guard():
    """AOT's forward and backward graphs of shifted windows: a backend's propagation adds nothing to
    dynamo's ShapeEnv (its own layout choices for views used to decide sizes dynamo had not)."""
    from functorch.compile import aot_module_simplified
    added, graphs = [], []

    def compiler(gm, inputs):
        env = torch._guards.detect_fake_mode(inputs).shape_env
        before = len(env.guards)
        fxprop.propagate(gm, *inputs)
        added.extend(str(guard.expr) for guard in env.guards[before:])
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler)

    torch._dynamo.reset()
    x = torch.randn(2, 8, 12, 8, requires_grad=True)
    torch.compile(ShiftedWindows(), backend=backend, dynamic=True)(x).sum().backward()
    assert len(graphs) == 2 and added == []


class PaddedToChunks(nn.Module):
    """mamba2's chunked scan pads the sequence to a multiple of the chunk size; the gradient of that
    padding is a padding by ``-((4 - L % 4) % 4)``, never positive, of a transposed gradient."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8, 1))

    def forward(self, x):
        pad = (4 - x.shape[1] % 4) % 4
        return nn.functional.pad(x, (0, 0, 0, pad)).transpose(1, 2) * self.scale


def test_a_padding_by_a_symbolic_amount_never_positive_keeps_the_inputs_layout():
    """ATen's constant_pad_nd returns a narrowed clone where no pad is positive, which keeps a
    transposed gradient transposed; the decomposition symbolic pads ran through laid it out
    contiguous. AOT's graphs, dynamic, each run node by node for real at three lengths."""
    from corpus.training import check_compiled
    calls = [{"x": torch.randn(2, length, 8, requires_grad=True)} for length in (8, 6, 5)]
    outcome = check_compiled(PaddedToChunks(), calls, dynamic=True)
    assert outcome.status == "OK", "\n".join([outcome.detail, *map(str, outcome.mismatches)])


def _differences_from(traced: dict, gm: torch.fx.GraphModule) -> list:
    """Nodes where fxprop's value differs from the one AOT traced (shapes and strides provably equal)."""
    from fxprop.symbolic import definitely_equal
    differences = []
    for node in gm.graph.nodes:
        theirs, ours = traced.get(node.name), node.meta.get("val")
        if not isinstance(theirs, torch.Tensor):
            continue
        if not isinstance(ours, torch.Tensor) or theirs.dim() != ours.dim():
            differences.append((node.name, theirs, ours))
            continue
        sizes = [*zip(theirs.shape, ours.shape), *zip(theirs.stride(), ours.stride())]
        if not all(definitely_equal(a, b) for a, b in sizes) or theirs.dtype != ours.dtype:
            differences.append((node.name, tuple(theirs.shape), theirs.stride(), tuple(ours.shape), ours.stride()))
    return differences


def test_a_second_propagation_in_dynamos_shape_env_lists_what_the_first_decided():
    """torch memoizes ShapeEnv evaluations per expression: a second propagation in the same
    ShapeEnv (a pass that propagates again; AOT's backward after its forward) got the answer
    without the guard log and listed no assumption, though its values rest on ``T - 1 < 64``.
    The assumption is exactly where real execution of the positions table works."""
    seen = []

    def backend(gm, example_inputs):
        env = torch._guards.detect_fake_mode(example_inputs).shape_env
        for _ in range(2):
            fxprop.propagate(gm, *example_inputs, cache=False)
            seen.append((gm.meta["fxprop"]["assumptions"], dict(env.backed_var_to_val)))
        return gm.forward

    torch._dynamo.reset()
    model = PositionsAdded()
    torch.compile(model, backend=backend, dynamic=True)(torch.randn(2, 6, 8))
    (first, hints), (second, _) = seen
    assert first and second == first
    (assumption,) = first
    (symbol,) = assumption.free_symbols
    (hint,) = [value for internal, value in hints.items() if internal.name == symbol.name and value == 6]
    for length in (hint, 64, 65):
        try:
            model(torch.randn(2, length, 8))
            works = True
        except IndexError:
            works = False
        assert bool(assumption.subs(symbol, length)) == works, (assumption, length)


def test_a_second_propagation_of_an_exported_program_lists_the_runtime_assert_it_decided():
    """With ``prefer_deferred_runtime_asserts_over_guards`` torch decides a ``torch._check`` on sizes as a
    (memoized) runtime assert: the second propagation listed none. ``K == L`` is where ``mm`` runs."""
    program = torch.export.export(MatrixProduct(), (torch.randn(3, 8), torch.randn(8, 5)),
                                  prefer_deferred_runtime_asserts_over_guards=True)
    listed = []
    for _ in range(2):
        fxprop.propagate(program, fxprop.TensorSpec(("B", "K")), fxprop.TensorSpec(("L", 5)), cache=False)
        listed.append([str(a) for a in program.graph_module.meta["fxprop"]["assumptions"]])
    assert listed == [["Eq(K, L)"], ["Eq(K, L)"]]
    for k, l in ((8, 8), (4, 4), (4, 5)):
        try:
            torch.mm(torch.randn(3, k), torch.randn(l, 5))
            works = True
        except RuntimeError:
            works = False
        assert works == (k == l)


class MatrixProduct(nn.Module):
    def forward(self, x, y):
        return torch.mm(x, y)


@torch.library.custom_op("fxprop_pipelines_test::nested", mutates_args=())
def nested(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@nested.register_fake
def _(x):
    return torch.empty_like(x)


def _views_of_three_and_four_rows(x):
    return x.view(3, 16), x.view(4, 16)


def _broadcast(x, y):
    return x + y


def _inner_propagations() -> dict:
    """A graph whose two views need B == 3, then B == 4 (real execution refuses at every B), and an
    add of (B, 16) and (3, 16), which needs B == 1 or B == 3."""
    found = {}
    gm = torch.fx.symbolic_trace(_views_of_three_and_four_rows)
    try:
        fxprop.propagate(gm, fxprop.TensorSpec(("B", 16)))
        found["views"] = gm.meta["fxprop"]["assumptions"]
    except fxprop.PropagationError:
        found["views"] = "refused"
    gm = torch.fx.symbolic_trace(_broadcast)
    fxprop.propagate(gm, fxprop.TensorSpec(("B", 16)), fxprop.TensorSpec((3, 16)))
    found["broadcast"] = [str(a) for a in gm.meta["fxprop"]["assumptions"]]
    return found


def test_a_propagation_inside_a_rule_of_one_in_dynamos_shape_env_keeps_its_own_assumptions():
    """torch suppresses guards per thread, not per ShapeEnv: a propagation in fxprop's own ShapeEnv,
    run by a rule while a backend's propagation holds its decisions apart from dynamo's, recorded no
    assumption, and took B == 3 and B == 4 both, where real execution refuses at every B."""
    for b in range(1, 8):
        with pytest.raises(RuntimeError):
            _views_of_three_and_four_rows(torch.randn(b, 16))
    for b, works in ((1, True), (3, True), (2, False)):
        try:
            _broadcast(torch.randn(b, 16), torch.randn(3, 16))
        except RuntimeError:
            assert not works
        else:
            assert works
    alone = _inner_propagations()
    assert alone == {"views": "refused", "broadcast": ["Eq(B, 1) | Eq(B, 3)"]}
    inside = []

    @fxprop.rule(torch.ops.fxprop_pipelines_test.nested.default)
    def nested_rule(x):
        inside.append(_inner_propagations())
        return torch.empty_like(x)

    def backend(gm, example_inputs):
        fxprop.propagate(gm, *example_inputs)
        return gm.forward

    try:
        torch._dynamo.reset()
        torch.compile(lambda x: torch.ops.fxprop_pipelines_test.nested(x) + 1, backend=backend,
                      dynamic=True)(torch.randn(5, 3))
    finally:
        fxprop.unregister(torch.ops.fxprop_pipelines_test.nested.default)
    assert inside == [alone]


@torch.library.custom_op("fxprop_pipelines_test::counted", mutates_args=())
def counted(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@counted.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_failed_propagation_leaves_no_pending_symbol_in_dynamos_shape_env():
    """A call that creates a data-dependent size, then fails, left the size pending in dynamo's
    ShapeEnv; AOT autograd's trace of the same graph, a backend's fallback, then refused it
    (PendingUnbackedSymbolNotFound). The compiled graph must run as eager runs."""
    from functorch.compile import aot_module_simplified

    @fxprop.rule(torch.ops.fxprop_pipelines_test.counted.default)
    def counted_rule(x):
        torch._check(x.nonzero().shape[0] < 0)  # a count, then a refusal
        return torch.empty_like(x)

    failures = []

    def backend(gm, example_inputs):
        try:
            fxprop.propagate(gm, *example_inputs)
        except fxprop.PropagationError as error:
            failures.append(error)
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda graph, inputs: graph.forward)

    def model(x):
        return torch.ops.fxprop_pipelines_test.counted(x) + 1, x.nonzero()

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
            got = torch.compile(model, backend=backend, dynamic=True)(x)
    finally:
        fxprop.unregister(torch.ops.fxprop_pipelines_test.counted.default)
    assert len(failures) == 1
    expected = model(x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
