"""What the user hands fxprop is never run as code, never shared, never altered; what comes back
is what real execution gives."""
import copy
import operator
import threading

import pytest
import torch

import fxprop
import fxprop.testing
from fxprop.testing import check_rule


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch {marker}')",
    "B.__class__",
    "exec('open(\"{marker}\", \"w\")')",
    "(lambda: 1)()",
    "B if True else 2",
    "[B][0]",
    "B**1000000000",
    "1.5",
    "B" * 300,
])
def test_a_dim_string_is_parsed_never_evaluated(text, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(fxprop.InputError, match="not a size expression"):
        fxprop.TensorSpec((text.format(marker=marker), 3))
    assert not marker.exists()


@pytest.mark.parametrize("text,at_4", [("B", 4), ("2*B+1", 9), ("B//3", 1), ("B % 3", 1), ("(B-1)**2", 9)])
def test_a_dim_string_is_a_size_expression(text, at_4):
    import sympy
    gm = torch.fx.symbolic_trace(lambda x: x.reshape(-1))
    fxprop.propagate(gm, fxprop.TensorSpec((text, 2)))
    (size,) = fxprop.shape_of(next(n for n in gm.graph.nodes if n.op == "call_method"))
    assert sympy.sympify(size).subs(sympy.Symbol("B", integer=True, positive=True), 4) == 2 * at_4


def test_a_non_leaf_input_that_requires_grad_stays_a_non_leaf():
    gm = torch.fx.symbolic_trace(torch.nn.ReLU(inplace=True))
    non_leaf = torch.randn(3, 4, requires_grad=True) * 2
    out = fxprop.propagate(gm, non_leaf)
    assert out.requires_grad and tuple(out.shape) == (3, 4)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, torch.randn(3, 4, requires_grad=True))  # a leaf: real execution refuses
    assert caught.value.error_type is RuntimeError
    strided = (torch.randn(4, 6, requires_grad=True) + 0)[:, 1::2]
    assert fxprop.propagate(gm, strided).stride() == strided.stride()


def test_propagating_leaves_another_threads_random_numbers_alone():
    """A seeded thread draws what it would draw alone while another thread propagates."""
    gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.dropout(x + torch.randn(x.shape), 0.5))
    expected = []
    torch.manual_seed(7)
    expected = [torch.rand(()).item() for _ in range(200)]
    drawn, stop = [], threading.Event()

    def propagate_forever():
        while not stop.is_set():
            fxprop.propagate(gm, fxprop.TensorSpec((8, 8)), cache=False)

    worker = threading.Thread(target=propagate_forever)
    worker.start()
    try:
        torch.manual_seed(7)
        drawn = [torch.rand(()).item() for _ in range(200)]
    finally:
        stop.set()
        worker.join()
    assert drawn == expected


@pytest.mark.parametrize("fn", [lambda x: torch.rand_like(x), lambda x: torch.randn_like(x), lambda x: torch.bernoulli(x.real.sigmoid()),
                                lambda x: torch.nn.functional.dropout(x, 0.5)],
                         ids=["rand_like", "randn_like", "bernoulli", "dropout"])
def test_random_ops_of_rarely_implemented_dtypes_never_draw_from_the_global_generator(fn):
    """The host is asked which dtypes a kernel implements (complex here, with grad); a random op
    never is, since it would draw from the process's generator."""
    gm = torch.fx.symbolic_trace(fn)
    spec = fxprop.TensorSpec((2, 3), dtype=torch.complex64, requires_grad=True)
    with fxprop.testing.assert_no_side_effects(gm, spec):
        try:
            fxprop.propagate(gm, spec)
        except fxprop.PropagationError:
            pass  # refused as real execution may be; what matters is the generator


def test_a_rule_is_found_for_a_function_torch_rewraps_at_run_time():
    """Importing torch._dynamo replaces torch.manual_seed with a wrapper; its rule still applies."""
    import importlib
    importlib.import_module("torch._dynamo")
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    gm.graph.inserting_before(next(iter(gm.graph.nodes)).next)
    with gm.graph.inserting_after(next(iter(gm.graph.nodes))):
        gm.graph.call_function(torch.manual_seed, (123,))
    gm.recompile()
    state = torch.get_rng_state()
    fxprop.propagate(gm, fxprop.TensorSpec((2,)))
    assert torch.equal(state, torch.get_rng_state())
    assert next(n for n in gm.graph.nodes if n.target is torch.manual_seed).meta["fxprop"].kind == "python"


def test_an_index_whose_values_are_known_is_checked_like_real_execution():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.index_select, torch.randn(3, 4), 0, torch.tensor([0, 3]))
    assert caught.value.error_type is IndexError
    check_rule(torch.index_select, torch.randn(3, 4), 0, torch.tensor([0, 2]))


# --- the cache answers only what its key holds ---------------------------------------------

class ItemSlice(torch.nn.Module):
    def forward(self, x, n):
        return x[:n.item()]


def test_a_value_read_from_a_real_input_is_never_answered_from_the_cache():
    gm = torch.export.export(ItemSlice(), (torch.randn(8), torch.tensor(3)), strict=False).module()
    assert tuple(fxprop.propagate(gm, torch.randn(8), torch.tensor(3)).shape) == (3,)
    assert tuple(fxprop.propagate(gm, torch.randn(8), torch.tensor(5)).shape) == (5,)
    equal = torch.fx.symbolic_trace(lambda a, b: torch.equal(a, b))
    assert fxprop.propagate(equal, torch.tensor([1, 2]), torch.tensor([1, 2])) is True
    assert fxprop.propagate(equal, torch.tensor([1, 2]), torch.tensor([1, 3])) is False


def test_a_user_function_is_neither_memoized_nor_kept_alive():
    import gc
    import weakref

    class Holder:
        def __init__(self):
            self.big = torch.zeros(1 << 20)

        def shift(self, x):
            return x + 1

    holder = Holder()
    alive = weakref.ref(holder)
    graph = torch.fx.Graph()
    graph.output(graph.call_function(holder.shift, (graph.placeholder("x"),)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fxprop.propagate(gm, torch.randn(3))
    del holder, graph, gm
    gc.collect()
    assert alive() is None


# --- values from data are never made up ------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda a, b: torch.allclose(a, b), lambda a, b: a.equal(b),
                                lambda a, b: torch.is_nonzero(a[:1])], ids=["allclose", "equal", "is_nonzero"])
def test_a_question_about_values_of_specs_is_an_unknown_bool(fn):
    gm = torch.fx.symbolic_trace(fn)
    answer = fxprop.propagate(gm, fxprop.TensorSpec((2,)), fxprop.TensorSpec((2,)))
    assert isinstance(answer, torch.SymBool)


def test_questions_about_values_refuse_like_real_execution():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.allclose, torch.randn(2), torch.tensor([1, 2]))
    assert caught.value.error_type is RuntimeError
    with pytest.raises(fxprop.PropagationError):
        check_rule(torch.is_nonzero, torch.randn(2))
    assert fxprop.propagate(torch.fx.symbolic_trace(lambda a, b: torch.equal(a, b)),
                            fxprop.TensorSpec((2,)), fxprop.TensorSpec((3,))) is False


def test_item_of_a_computed_tensor_is_a_symbol():
    gm = torch.fx.symbolic_trace(lambda x: torch.nonzero(x).sum().item())
    assert isinstance(fxprop.propagate(gm, torch.randn(4)), torch.SymInt)


def test_a_real_input_written_in_place_holds_what_the_write_gave_it():
    def f(x):
        before = x.item()
        x.add_(1)
        return before, x.item(), x.view(1).tolist()

    assert fxprop.propagate(torch.fx.symbolic_trace(f), torch.tensor(3)) == f(torch.tensor(3)) == (3, 4, [4])

    def from_an_unknown_value(x, y):
        x.add_(y)
        return x.item()
    assert isinstance(fxprop.propagate(torch.fx.symbolic_trace(from_an_unknown_value), torch.tensor(3),
                                       fxprop.TensorSpec((), dtype=torch.int64)), torch.SymInt)

    def through_a_view(x):
        x[0].mul_(2)
        return x.tolist()
    assert all(isinstance(v, torch.SymInt)
               for v in fxprop.propagate(torch.fx.symbolic_trace(through_a_view), torch.tensor([1, 2])))


def test_a_write_through_data_or_a_shared_storage_ends_known_values():
    def through_data(a):
        a.data.add_(5)
        return a.tolist()

    def through_another_input(a, b):
        a.add_(5)
        return b.tolist()

    assert all(isinstance(v, torch.SymInt) for v in fxprop.propagate(torch.fx.symbolic_trace(through_data),
                                                                    torch.tensor([1, 2])))
    x = torch.tensor([1, 2, 3])
    gm = torch.fx.symbolic_trace(through_another_input)
    assert all(isinstance(v, torch.SymInt) for v in fxprop.propagate(gm, x, x))
    assert all(isinstance(v, torch.SymInt) for v in fxprop.propagate(gm, x, x[1:]))


def test_data_swapped_by_setattr_ends_known_values():
    """Adversary finding: ``a.data = t`` changes a's values without an in-place op; ``a.item()``
    gave a's old value."""
    graph = torch.fx.Graph()
    a, t = graph.placeholder("a"), graph.placeholder("t")
    graph.call_function(setattr, (a, "data", t))
    graph.output(graph.call_method("item", (a,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert gm(torch.tensor(1), torch.tensor(5)) == 5
    assert isinstance(fxprop.propagate(gm, torch.tensor(1), torch.tensor(5)), torch.SymInt)


def test_a_buffer_a_module_updated_before_it_is_read_holds_the_update():
    root = torch.nn.Module()
    root.bn = torch.nn.BatchNorm1d(3)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_module("bn", (x,))
    count = graph.call_method("item", (graph.get_attr("bn.num_batches_tracked"),))
    graph.output(count)
    gm = torch.fx.GraphModule(root, graph)
    value = fxprop.propagate(gm, torch.randn(4, 3))
    assert value == copy.deepcopy(gm)(torch.randn(4, 3)) == 1 and root.bn.num_batches_tracked.item() == 0


def peak_growth_kib(program: str, propagate: str) -> int:
    """KiB the peak resident size of a fresh process grows by while it runs ``propagate``, after
    ``program`` (both python source; ``fxprop`` and ``torch`` are imported)."""
    import subprocess
    import sys
    script = (f"import resource, torch, fxprop\n{program}\n"
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
              f"{propagate}\n"
              "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_asking_the_host_about_a_rare_dtype_never_makes_a_large_output():
    """In a fresh process, whose peak memory is its own: 512 MiB if the host made the output."""
    grew = peak_growth_kib("gm = torch.fx.symbolic_trace(lambda x: x.new_zeros(8192, 8192))",
                           "out = fxprop.propagate(gm, fxprop.TensorSpec((1,), dtype=torch.complex64), "
                           "fallback_limit_bytes=0)\nassert out.shape == (8192, 8192)")
    assert grew < 256 * 1024, f"grew by {grew} KiB"


def _graph_reading_a_buffer(*steps):
    """A graph over a module with the buffer ``n`` = tensor(3): ``steps`` are (op, target, args)
    where an arg "n" is a fresh get_attr of the buffer and "x" the input."""
    root = torch.nn.Module()
    root.register_buffer("n", torch.tensor(3))
    root.register_buffer("index", torch.tensor([0, 4]))
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    results = []
    for op, target, args in steps:
        args = tuple(graph.get_attr(a) if a in ("n", "index") else x if a == "x" else a for a in args)
        results.append(graph.create_node(op, target, args))
    graph.output(tuple(results))
    return root, torch.fx.GraphModule(root, graph)


def test_a_constant_buffers_values_follow_what_the_graph_writes():
    root, gm = _graph_reading_a_buffer(("call_method", "item", ("n",)), ("call_method", "add_", ("n", 1)),
                                       ("call_method", "item", ("n",)))
    first, _, second = fxprop.propagate(gm, torch.randn(2))
    real_first, _, real_second = copy.deepcopy(gm)(torch.randn(2))
    assert (first, second) == (real_first, real_second) == (3, 4) and root.n.item() == 3


def test_an_index_held_by_the_module_is_checked_like_real_execution():
    _, gm = _graph_reading_a_buffer(("call_function", torch.index_select, ("x", 0, "index")),)
    with pytest.raises(IndexError):
        gm(torch.randn(3))
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, torch.randn(3))
    assert caught.value.error_type is IndexError
    assert fxprop.propagate(gm, torch.randn(5))[0].shape == (2,)


# --- semantics -----------------------------------------------------------------------------------

def test_a_mask_of_the_wrong_shape_is_refused():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.Tensor.__getitem__, torch.randn(4, 3), torch.ones(5, dtype=torch.bool))
    assert caught.value.error_type is IndexError
    check_rule(torch.Tensor.__getitem__, torch.randn(4, 3), (slice(None), torch.ones(3, dtype=torch.bool)))


_OFFSET = torch.arange(3.0)


@torch.fx.wrap
def shifted_by_a_module_level_tensor(x):
    return x + _OFFSET


def test_a_wrapped_function_may_read_a_module_level_tensor():
    gm = torch.fx.symbolic_trace(lambda x: shifted_by_a_module_level_tensor(x) * 2)
    fxprop.testing.assert_matches_real(gm, fxprop.TensorSpec((2, 3)))
    with pytest.raises(fxprop.DeviceMismatchError):
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3), device="cuda:0"))


def test_floor_divide_lays_out_like_the_elementwise_kernels():
    check_rule(torch.floor_divide, torch.randn(4, 5).t(), torch.randn(5, 4))
    check_rule(torch.floor_divide, torch.randn(4, 5).t(), 2)


def test_an_in_place_op_that_would_resize_self_is_refused():
    with pytest.raises(fxprop.PropagationError) as caught:
        check_rule(torch.Tensor.ge_, torch.randn(5, 1), torch.randn(5, 5))
    assert caught.value.error_type is RuntimeError


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: fxprop.TensorSpec((2 ** 63,)),
    lambda: fxprop.TensorSpec((2 ** 40, 2 ** 40)),
    lambda: fxprop.TensorSpec(("B+0.5",)),
    lambda: fxprop.TensorSpec(("B/2",)),
    lambda: fxprop.TensorSpec(("-B",)),
    lambda: fxprop.TensorSpec((2,), dtype=torch.quint8),
    lambda: fxprop.propagate(torch.fx.symbolic_trace(lambda x: x + 1),
                             torch.quantize_per_tensor(torch.randn(2), 0.1, 0, torch.quint8)),
    lambda: fxprop.propagate(torch.fx.symbolic_trace(lambda x: x + 1),
                             torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])),
    lambda: fxprop.propagate(torch.fx.symbolic_trace(lambda x: x + 1), torch.randn(2), progress=5),
    lambda: fxprop.propagate(torch.fx.symbolic_trace(lambda x: x + 1), torch.randn(2), cache=fxprop.RuleCache(-1)),
], ids=["2**63", "numel-overflow", "float-dim", "true-division", "negative", "quint8-spec", "quantized", "nested",
        "progress", "cache-size"])
def test_bad_input_is_an_input_error(make):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(fxprop.InputError):
            make()


def _backward_then_grad(x, w):
    torch.mm(x, w).relu().sum().backward()
    return w.grad


def _double_backward(x, w):
    y = torch.mm(x, w).tanh()
    g, = torch.autograd.grad(y.sum(), [x], create_graph=True)
    h, = torch.autograd.grad(g.sum(), [w])
    return h


@pytest.mark.parametrize("fn", [_backward_then_grad, _double_backward])
def test_a_graph_that_differentiates_gets_results_with_autograd_history_from_a_warm_cache(fn):
    gm = torch.fx.symbolic_trace(fn)
    for _ in range(2):  # the second call finds every forward result in the cache
        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
        expected = fn(x, w)
        fxprop.propagate(gm, torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True))
        val = gm.graph.output_node().meta["val"]
        assert (val.shape, val.stride(), val.dtype) == (expected.shape, expected.stride(), expected.dtype)


class _GradOf(torch.nn.Module):
    def forward(self, pair):
        x, y = pair
        (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return g


def test_a_torch_container_holding_a_module_that_differentiates_gets_no_memoized_results():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wrap = torch.nn.Sequential(_GradOf())

        def forward(self, x):
            return self.wrap((x, x * 2))

    class KeepsWrap(torch.fx.Tracer):
        def is_leaf_module(self, module, name):
            return name == "wrap" or super().is_leaf_module(module, name)

    model = Model()
    gm = torch.fx.GraphModule(model, KeepsWrap().trace(model))
    for _ in range(2):  # the second call would find x * 2 in the cache
        assert fxprop.propagate(gm, fxprop.TensorSpec((3,), requires_grad=True)).shape == (3,)


def test_an_exported_module_is_not_opaque_code_to_the_cache():
    """torch.export's .module() calls its own _guards_fn module: torch's code, which never walks
    the autograd graph, so memoized results stay usable there."""
    from fxprop.memo.purity import may_differentiate
    gm = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)).module()
    assert any(node.op == "call_module" for node in gm.graph.nodes)
    assert not may_differentiate(gm)


def test_a_cached_view_of_another_dtype_keeps_its_alias():
    """Adversary finding: ``b.view(torch.int32)`` (no autograd view through its composite kernel)
    was memoized as a fresh tensor, so a later graph's overlap check missed the alias."""
    def add_through_a_view(b):
        return b[0:4].add_(b.view(torch.int32)[1:5])

    def mul_through_a_view(b):
        return b[0:4].mul_(b.view(torch.int32)[1:5])

    for program in (add_through_a_view, mul_through_a_view):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(torch.fx.symbolic_trace(program), torch.randn(16), cache=fxprop.rule_cache)
        assert caught.value.error_type is RuntimeError


def _add_after_writing_the_base_of_an_unbind_output(x, y):
    a = x + y
    first = torch.unbind(a, 0)[0]
    a.mul_(2)
    return a + first


@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_an_unbind_output_whose_base_was_written_is_refused_as_autograd_refuses_it(cache):
    """Fuzzer finding: with the cache on, reading the view for the key raised inside fxprop, and a
    warm cache rebuilt ``unbind``'s outputs as plain views, which autograd lets pass."""
    gm = torch.fx.symbolic_trace(_add_after_writing_the_base_of_an_unbind_output)
    x, y = torch.randn(3, 5, 1, requires_grad=True), torch.randn(5, 1, requires_grad=True)
    with pytest.raises(RuntimeError, match="Output 0 of Unbind is a view"):
        gm(x, y)
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, x, y, cache=cache)
        assert not isinstance(caught.value, fxprop.InternalError)
        assert caught.value.error_type is RuntimeError


def test_a_view_made_under_no_grad_keeps_autograd_s_refusal_from_a_warm_cache():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.mul, (x, 2))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    row = graph.call_function(operator.getitem, (a, 0))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.call_method("add_", (row, 1))
    graph.output(a)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(RuntimeError, match="no_grad mode"):
        gm(torch.randn(3, requires_grad=True))
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, torch.randn(3, requires_grad=True))
        assert caught.value.error_type is RuntimeError
