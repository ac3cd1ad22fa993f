"""The memo within one propagation: symbolic calls keyed by their sizes' expressions, and tensor
signatures computed once per value. A memoized result must equal the one computed afresh."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop import TensorSpec


class RepeatedBlocks(torch.nn.Module):
    """The same block three times: every call after the first has an identical key."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16))
                                          for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = x + F.gelu(block(x)).transpose(0, 1).transpose(0, 1)
        return x.view(-1, 16)[1:]


def _size_read_by_cpp(storage) -> Any:
    try:
        return len(storage)
    except RuntimeError:  # a symbolic size, which C++ refuses to read as an int
        return "refused"


def _values(gm: torch.fx.GraphModule) -> dict:
    """Each node's value, and the first node whose value shares its storage (aliases as torch's would)."""
    storages: dict = {}

    def describe(value, name):
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            return (tuple(map(str, value.shape)), tuple(map(str, value.stride())), str(value.storage_offset()),
                    value.dtype, value.device, value.requires_grad, str(storage.nbytes()), _size_read_by_cpp(storage),
                    storages.setdefault(storage._cdata, name))
        return str(value)
    return {node.name: torch.utils._pytree.tree_map(lambda value: describe(value, node.name), node.meta.get("val"))
            for node in gm.graph.nodes}


@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_symbolic_calls_memoized_in_a_propagation_equal_fresh_ones(cache):
    gm = torch.fx.symbolic_trace(RepeatedBlocks())
    fxprop.propagate(gm, TensorSpec(("B", "T", 16)), cache=cache)
    fresh = torch.fx.symbolic_trace(RepeatedBlocks())
    fxprop.propagate(fresh, TensorSpec(("B", "T", 16)), cache=False)
    assert _values(gm) == _values(fresh)
    assert gm.meta["fxprop"]["assumptions"] == fresh.meta["fxprop"]["assumptions"]


def test_identical_data_dependent_calls_each_get_their_own_symbol():
    class TwoNonzeros(torch.nn.Module):
        def forward(self, x):
            return x.nonzero(), x.nonzero()

    gm = torch.fx.symbolic_trace(TwoNonzeros())
    first, second = fxprop.propagate(gm, TensorSpec(("B", 4)))
    assert str(first.shape[0]) != str(second.shape[0])
    defining = {info.node for info in gm.meta["fxprop"]["symbols"].values() if info.kind == "size"}
    assert defining == {"nonzero", "nonzero_1"}


def test_a_symbolic_program_assumes_the_same_with_and_without_the_memo():
    model = RepeatedBlocks().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(model, (torch.randn(4, 5, 16),), dynamic_shapes=({0: batch},))
    assumed = []
    for cache in (False, True):
        copied = copy.deepcopy(program)
        fxprop.propagate(copied, cache=cache)
        assumed.append([str(a) for a in copied.graph_module.meta["fxprop"]["assumptions"]])
    assert assumed[0] == assumed[1]


def test_setattr_is_never_memoized():
    """A call the memo would skip must change nothing: setattr changes the object it is given."""
    from fxprop.memo.purity import is_pure
    assert not is_pure("call_function", setattr, (), {})
    assert not is_pure("call_function", delattr, (), {})


def test_a_tensor_changed_in_place_between_identical_calls_is_signed_again():
    class Reshaped(torch.nn.Module):
        def forward(self, x):
            before = x.sum(0)
            x.unsqueeze_(0)
            after = x.sum(0)
            x.requires_grad_(True)
            return before, after, x.sum(0)

    gm = torch.fx.symbolic_trace(Reshaped())
    before, after, last = fxprop.propagate(gm, torch.empty(3, 4, device="meta"))
    assert (tuple(before.shape), tuple(after.shape), tuple(last.shape)) == ((4,), (3, 4), (3, 4))
    assert (before.requires_grad, after.requires_grad, last.requires_grad) == (False, False, True)


def _grad_toggled_graph() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    before = graph.call_function(torch.mul, (x, 2))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    after = graph.call_function(torch.mul, (x, 2))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output((before, after))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("shape", [(4, 3), ("B", 3)])
@pytest.mark.parametrize("cache", [True, "verify"])
def test_a_call_after_the_graph_turns_grad_off_is_keyed_by_the_new_mode(shape, cache):
    gm = _grad_toggled_graph()
    before, after = fxprop.propagate(gm, TensorSpec(shape, requires_grad=True),
                                     cache=fxprop.RuleCache() if cache is True else cache)
    real_before, real_after = _grad_toggled_graph()(torch.randn(4, 3, requires_grad=True))
    assert (before.requires_grad, after.requires_grad) == (real_before.requires_grad, real_after.requires_grad)


@pytest.mark.parametrize("shape", [(4,), ("B",)])
@pytest.mark.parametrize("cache", [True, "verify"])
def test_a_default_dtype_the_graph_sets_keys_later_calls_and_is_undone_after(shape, cache):
    graph = torch.fx.Graph()
    size = graph.call_method("size", (graph.placeholder("x"), 0))
    first = graph.call_function(torch.ones, (size,))
    graph.call_function(torch.set_default_dtype, (torch.float64,))
    second = graph.call_function(torch.ones, (size,))
    graph.call_function(torch.set_default_dtype, (torch.float32,))
    third = graph.call_function(torch.ones, (size,))
    graph.call_function(torch.set_default_dtype, (torch.float64,))  # left set: propagation must not leave it so
    graph.output((first, second, third))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    try:
        outputs = fxprop.propagate(gm, TensorSpec(shape), cache=fxprop.RuleCache() if cache is True else cache)
        assert torch.get_default_dtype() == torch.float32
        real = gm(torch.randn(4))
    finally:
        torch.set_default_dtype(torch.float32)
    assert [t.dtype for t in outputs] == [t.dtype for t in real] == [torch.float32, torch.float64, torch.float32]


def test_setters_of_process_wide_state_are_never_memoized():
    from fxprop.memo.purity import is_pure
    for setter in (torch.set_default_dtype, torch.set_grad_enabled, torch.use_deterministic_algorithms):
        assert not is_pure("call_function", setter, (), {}), setter


@pytest.mark.parametrize("fn", [lambda x: x[:, : x.shape[1] // 3] * 2, lambda x: x[:, ::2] * 2])
def test_propagating_in_dynamos_shape_env_adds_no_guard_for_the_memory_format(fn):
    added = []

    def backend(gm, example_inputs):
        from torch._guards import detect_fake_mode
        shape_env = detect_fake_mode(example_inputs).shape_env
        before = len(shape_env.guards)
        fxprop.propagate(gm, *example_inputs)
        added.extend(str(guard.expr) for guard in shape_env.guards[before:])
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=True)(torch.randn(6, 8))
    assert added == []


def test_the_garbage_collector_is_paused_only_while_propagating():
    import gc
    gm = torch.fx.symbolic_trace(RepeatedBlocks())
    fxprop.propagate(gm, TensorSpec((2, 3, 16)))
    assert gc.isenabled()
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(gm, TensorSpec((2, 3, 15)))
    assert gc.isenabled()
    gc.disable()
    try:
        fxprop.propagate(gm, TensorSpec((2, 3, 16)))
        assert not gc.isenabled()  # the caller's choice is kept
    finally:
        gc.enable()


def test_a_memoized_result_keeps_its_known_values_on_a_hit():
    """``arange(5)`` has known values (value flow); a warm cache rebuilds it with them, so what is
    computed from it afterwards is the real value on every propagation, cold or warm."""
    first = torch.fx.symbolic_trace(lambda x: x + torch.arange(x.size(0)).sum().item())
    second = torch.fx.symbolic_trace(lambda x: -(x + torch.arange(x.size(0)).sum().item()))  # not a replay
    cache = fxprop.RuleCache()
    items = []
    for gm in (first, second):
        fxprop.propagate(gm, TensorSpec((5,)), cache=cache)
        items.append(next(node for node in gm.graph.nodes if node.target == "item").meta["val"])
    assert cache.stats()["hits"] > 0 and cache.stats()["replays"] == 0
    assert items == [10, 10]  # sum(range(5)), as real execution computes it


def test_a_user_module_inside_a_torch_container_under_two_names_may_differentiate():
    """The graph calls a torch container by its second name; what it holds is the user's code,
    which may walk the autograd graph, so the memo must not hand it results without history."""
    from fxprop.memo.purity import may_differentiate

    class Doubles(torch.nn.Module):
        def forward(self, x):
            return x * 2

    root = torch.nn.Module()
    root.first = root.second = torch.nn.Sequential(Doubles())
    graph = torch.fx.Graph()
    graph.output(graph.call_module("second", (graph.placeholder("x"),)))
    assert may_differentiate(torch.fx.GraphModule(root, graph))

    plain = torch.nn.Module()
    plain.first = plain.second = torch.nn.Sequential(torch.nn.ReLU())
    graph = torch.fx.Graph()
    graph.output(graph.call_module("second", (graph.placeholder("x"),)))
    assert not may_differentiate(torch.fx.GraphModule(plain, graph))


@pytest.mark.parametrize("layout", [((2, 3, 4, 5), None), ((2, 3, 4, 5), "channels_last"), ((2, 1, 4, 5), "channels_last"),
                                    ((2, 3, 1, 1), "channels_last"), ((1, 3, 1, 4, 5), "channels_last_3d"),
                                    ((0, 3, 4, 5), "channels_last"), ((4, 6), "transposed"), ((4, 6), "sliced")])
def test_tensor_meta_memory_formats_match_shape_prop_on_every_call(layout):
    """fxprop keeps the memory format it decides per sizes and strides; the second propagation (a
    memo hit, the format remembered) records what ShapeProp records as the first did."""
    from torch.fx.passes.shape_prop import ShapeProp
    shape, form = layout

    def laid_out(x):
        if form == "transposed":
            return x.t().contiguous().t() + 1
        if form == "sliced":
            return x[:, ::2] + 1
        return x.contiguous(memory_format=getattr(torch, form) if form else torch.contiguous_format) + 1

    gm = torch.fx.symbolic_trace(laid_out)
    ShapeProp(gm).propagate(torch.randn(shape))
    expected = {node.name: node.meta["tensor_meta"].memory_format for node in gm.graph.nodes if "tensor_meta" in node.meta}
    for _ in range(2):
        fxprop.propagate(gm, TensorSpec(shape))
        assert {node.name: node.meta["tensor_meta"].memory_format for node in gm.graph.nodes} == expected


def test_torch_functional_is_not_a_functorch_package():
    """``torch.functional`` (split, einsum, broadcast_tensors) starts with ``torch.func``: its functions were
    judged functorch transforms, never memoized, never replayed, and said to reach autograd."""
    from fxprop.memo.purity import may_differentiate
    def program(x):
        top, bottom = torch.split(x, [2, 2])
        return torch.einsum("ij,kj->ik", top, bottom)

    gm = torch.fx.symbolic_trace(program)
    assert not may_differentiate(gm)
    cache = fxprop.RuleCache()
    values = []
    for _ in range(3):
        copied = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        out = fxprop.propagate(copied, TensorSpec((4, 2)), cache=cache)
        values.append((tuple(out.shape), out.stride()))
    real = gm(torch.randn(4, 2))
    assert values == [(tuple(real.shape), real.stride())] * 3
    assert cache.stats()["hits"] > 0 and cache.stats()["replays"] == 1


class SplitHeads(torch.nn.Module):
    """Attention's split of a projection into query, key and value, viewed as heads, twice over:
    views of ``split``'s outputs, which autograd restricts in place as it restricts the outputs."""

    def __init__(self):
        super().__init__()
        self.projections = torch.nn.ModuleList(torch.nn.Linear(16, 48) for _ in range(2))

    def forward(self, x):
        for projection in self.projections:
            q, k, v = projection(x).split(16, dim=-1)
            heads = [t.view(x.size(0), x.size(1), 4, 4).transpose(1, 2) for t in (q, k, v)]
            x = x + (heads[0] * heads[1] + heads[2]).transpose(1, 2).reshape(x.shape)
        return x


def _write_into_a_view_of_a_split_output(x):
    q, k = (x * 2).split(2, dim=0)
    q.view(-1).add_(1)
    return k


@pytest.mark.parametrize("shape", [(2, 5, 16), ("B", "T", 16)])
def test_views_of_split_outputs_are_memoized_and_equal_fresh_ones(shape):
    """A view of a view autograd restricts in place (one of ``split``'s outputs) is rebuilt over the
    same input, which gives it the same restriction: such views are kept, and equal fresh ones."""
    cache = fxprop.RuleCache()
    warm = torch.fx.symbolic_trace(SplitHeads())
    for _ in range(2):
        fxprop.propagate(warm, TensorSpec(shape), cache=cache)
    fresh = torch.fx.symbolic_trace(SplitHeads())
    fxprop.propagate(fresh, TensorSpec(shape), cache=False)
    assert _values(warm) == _values(fresh)
    if isinstance(shape[0], int):
        assert cache.stats()["hits"] > 0
        real = SplitHeads()(torch.randn(shape))
        out = next(node for node in warm.graph.nodes if node.op == "output").args[0].meta["val"]
        assert (out.shape, out.stride(), out.requires_grad) == (real.shape, real.stride(), real.requires_grad)


@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_writing_into_a_view_of_a_split_output_is_refused_from_a_warm_cache_as_autograd_refuses_it(cache):
    gm = torch.fx.symbolic_trace(_write_into_a_view_of_a_split_output)
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        gm(x)
    memo = fxprop.RuleCache() if cache is True else cache
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, x, cache=memo)
        assert not isinstance(caught.value, fxprop.InternalError)
        assert caught.value.error_type is RuntimeError and "returns multiple views" in str(caught.value)
