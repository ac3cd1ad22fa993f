"""The memo within one propagation: symbolic calls keyed by their sizes' expressions, and tensor
signatures computed once per value. A memoized result must equal the one computed afresh."""
from __future__ import annotations

import copy
import operator
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


@pytest.mark.parametrize("shape", [(2, 5, 16), ("B", "T", 16)])
def test_views_of_split_outputs_from_a_warm_cache_equal_fresh_ones_and_real_execution(shape):
    cache = fxprop.RuleCache()
    warm = torch.fx.symbolic_trace(SplitHeads())
    for _ in range(2):
        fxprop.propagate(warm, TensorSpec(shape), cache=cache)
    fresh = torch.fx.symbolic_trace(SplitHeads())
    fxprop.propagate(fresh, TensorSpec(shape), cache=False)
    assert _values(warm) == _values(fresh)
    if isinstance(shape[0], int):
        real = SplitHeads()(torch.randn(shape))
        out = next(node for node in warm.graph.nodes if node.op == "output").args[0].meta["val"]
        assert (out.shape, out.stride(), out.requires_grad) == (real.shape, real.stride(), real.requires_grad)


def _write_into_a_view_of_a_split_output(x):
    q, k = (x * 2).split(2, dim=0)
    q.view(-1).add_(1)
    return k


def _write_into_a_split_output_of_an_ordinary_view(x):
    first = (x * 2).split(2, dim=1)[0]
    first.split(1, dim=1)  # split of a split output: its outputs' restriction equals their input's
    ordinary = (x * 3)[:, 0:2]  # the same signature as ``first``, not restricted
    ordinary.split(1, dim=1)[0].add_(1)  # split's outputs are restricted whatever their input
    return ordinary


@pytest.mark.parametrize("program", [_write_into_a_view_of_a_split_output,
                                     _write_into_a_split_output_of_an_ordinary_view])
@pytest.mark.parametrize("cache", [False, True, "verify"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_writing_into_a_split_output_or_a_view_of_one_is_refused_from_a_warm_cache_as_autograd_refuses_it(
        program, cache, symbolic):
    """Adversary finding: outputs of a ``split`` whose input is itself a split output were kept,
    and rebuilt over an ordinary view of the same signature without split's restriction."""
    gm = torch.fx.symbolic_trace(program)
    x = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        gm(x)
    memo = fxprop.RuleCache() if cache is True else cache
    split_sizes = (4, "T") if program is _write_into_a_view_of_a_split_output else ("B", 4)  # the split dim concrete
    given = TensorSpec(split_sizes, requires_grad=True) if symbolic else x
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, given, cache=memo)
        assert not isinstance(caught.value, fxprop.InternalError)
        assert caught.value.error_type is RuntimeError and "returns multiple views" in str(caught.value)


def _gradients_of_two_outputs(x):
    y, z = x * 2, x * 3
    first = torch.autograd.grad((y * 1).sum(), [y, z], allow_unused=True, retain_graph=True)
    second = torch.autograd.grad((z * 1).sum(), [y, z], allow_unused=True, retain_graph=True)
    return first, second


def _gradients_with_and_without_history(x):
    y = x * 2
    first = torch.autograd.grad((y * y).sum(), [y], create_graph=True)  # 2 * y: has history
    second = torch.autograd.grad((y * 1).sum(), [y], create_graph=True)  # ones: none
    return first, second


def _versions(x):
    y, z = x * 2, x * 3
    z.add_(1)
    return y._version, z._version


def _meshgrids_of_a_shared_base_then_of_two(x):
    y = x * 2
    torch.meshgrid(y[:3], y, indexing="ij")  # both inputs view one base
    return torch.meshgrid((x * 3)[:3], x * 4, indexing="ij")  # the same signatures, two bases


def _tensor_values(value: Any) -> Any:
    def describe(tensor):
        return None if tensor is None else (tuple(tensor.shape), tensor.stride(), tensor.requires_grad)
    return torch.utils._pytree.tree_map(lambda leaf: describe(leaf) if isinstance(leaf, torch.Tensor) else leaf,
                                        value, is_leaf=lambda leaf: leaf is None)


@pytest.mark.parametrize("program", [_gradients_of_two_outputs, _gradients_with_and_without_history, _versions])
def test_results_of_autograd_s_history_and_state_are_never_memoized(program):
    """Adversary findings: ``autograd.grad`` (which inputs are unused, whether the gradient has
    history) and a tensor's ``_version`` depend on more than the arguments' signatures."""
    x = torch.randn(4, 6, requires_grad=True)
    real = _tensor_values(torch.fx.symbolic_trace(program)(x))
    cache = fxprop.RuleCache()
    for _ in range(2):
        gm = torch.fx.symbolic_trace(program)
        assert _tensor_values(fxprop.propagate(gm, x, cache=cache)) == real
    gm = torch.fx.symbolic_trace(program)
    assert _tensor_values(fxprop.propagate(gm, x, cache="verify")) == real


def test_a_view_of_one_of_two_inputs_sharing_a_base_is_not_memoized_as_a_view_of_the_first():
    """Adversary finding: the second meshgrid's second output views its second input, yet a hit
    rebuilt it over the first (the first call's inputs shared a base, which the key does not hold)."""
    gm = torch.fx.symbolic_trace(_meshgrids_of_a_shared_base_then_of_two)
    fxprop.propagate(gm, torch.randn(6), cache=fxprop.RuleCache())
    values = {node.name: node.meta["val"] for node in gm.graph.nodes}
    second = values["meshgrid_1"]
    assert second[1].untyped_storage()._cdata == values["mul_2"].untyped_storage()._cdata
    assert second[0].untyped_storage()._cdata == values["mul_1"].untyped_storage()._cdata


def test_an_input_given_twice_is_not_memoized_as_the_first_position():
    """``getitem((y, y), 1)`` is its second input, which a later call with two tensors of the same
    signature must also be: an entry may not say "the first input"."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.mul, (x, 2))
    graph.call_function(operator.getitem, ((y, y), 1))
    p, q = graph.call_function(torch.mul, (x, 3)), graph.call_function(torch.mul, (x, 4))
    second = graph.call_function(operator.getitem, ((p, q), 1))
    graph.output(second)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fxprop.propagate(gm, torch.randn(6), cache=fxprop.RuleCache())
    assert second.meta["val"].untyped_storage()._cdata == q.meta["val"].untyped_storage()._cdata


def _counts_of_masks_of_one_signature(x):
    """Two boolean masks of one shape and dtype whose known values differ (value flow): their
    counts, read with ``item``, size the results."""
    positions = torch.arange(x.size(1))
    every_other, all_but_last = positions % 2 == 0, positions < x.size(1) - 1
    counts = [mask.sum().item() for mask in (every_other, all_but_last)]
    counts += [mask.expand_as(x).sum().item() for mask in (every_other, all_but_last)]
    return [x.new_zeros(count) for count in counts]


def _select_within_then_past_the_end(x):
    positions = torch.arange(x.size(1))
    return x.index_select(1, positions), x.index_select(1, positions + 1)


@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_calls_on_known_values_are_keyed_by_the_values(cache):
    """A call whose inputs hold known values is memoized by those values too (an expanded mask by
    the values it was expanded from): a mask of the same signature but other values is another
    key, and so is an index that runs past the end where the first did not."""
    x = torch.randn(4, 6)
    real = [tuple(t.shape) for t in _counts_of_masks_of_one_signature(x)]
    assert real == [(3,), (5,), (12,), (20,)]
    with pytest.raises(RuntimeError) as refused:
        _select_within_then_past_the_end(x)
    memo = fxprop.RuleCache() if cache is True else cache
    for _ in range(2):
        gm = torch.fx.symbolic_trace(_counts_of_masks_of_one_signature)
        assert [tuple(t.shape) for t in fxprop.propagate(gm, x, cache=memo)] == real
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(torch.fx.symbolic_trace(_select_within_then_past_the_end), x, cache=memo)
        assert caught.value.error_type is type(refused.value) and caught.value.node_name == "index_select_1"


def _one_mask_added_twice(x):
    mask = torch.zeros(1, x.size(1)).masked_fill(torch.arange(x.size(1)) > 3, float("-inf")).expand_as(x)
    return (x + mask).softmax(-1), (x + mask).softmax(-1)


def test_a_call_repeated_on_the_same_known_values_is_a_hit():
    """Attention adds one mask in every layer: the calls after the first are hits."""
    cache = fxprop.RuleCache()
    gm = torch.fx.symbolic_trace(_one_mask_added_twice)
    out = fxprop.propagate(gm, torch.randn(4, 6), cache=cache)
    assert cache.stats()["hits"] >= 2  # the second add and softmax
    real = _one_mask_added_twice(torch.randn(4, 6))
    assert [(t.shape, t.stride()) for t in out] == [(t.shape, t.stride()) for t in real]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_replayed_or_refused_propagation_leaves_nothing_for_the_cyclic_collector():
    """A replay never walks the graph, which is where a propagation dropped the session's callbacks
    into itself; the cycle they made left all it held to the collector, which then walked it inside
    the next call."""
    import gc
    gm = torch.fx.symbolic_trace(RepeatedBlocks())
    cache = fxprop.RuleCache()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):  # the third is a replay
            fxprop.propagate(gm, TensorSpec((2, 3, 16)), cache=cache)
        assert cache.stats()["replays"] == 1
        left = [obj for obj in gc.get_objects() if type(obj).__name__ == "Propagation"]
        assert left == []
        # adversary finding: an input refused once the propagation was built never reached the walk either
        with pytest.raises(fxprop.InputError):
            fxprop.propagate(gm, torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(2, 16)]), cache=cache)
        left = [obj for obj in gc.get_objects() if type(obj).__name__ == "Propagation"]
        assert left == []
    finally:
        gc.enable()


def _checks_of_metadata(expected_dtypes: tuple) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for dtype in expected_dtypes:
        graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,), {"dtype": dtype})
    graph.output(x)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_a_check_that_returns_none_is_memoized_by_what_it_checks(cache):
    """``_assert_tensor_metadata`` (every export checks its inputs with it) returns None: a repeat of
    a check that passed is a hit, and a check of another dtype is not, and raises as real execution."""
    x = torch.randn(2, 3)
    memo = fxprop.RuleCache() if cache is True else cache
    passing = _checks_of_metadata((torch.float32, torch.float32))
    fxprop.propagate(passing, x, cache=memo)
    if cache is True:
        assert memo.stats()["hits"] == 1
    failing = _checks_of_metadata((torch.float32, torch.float64))
    with pytest.raises(RuntimeError) as refused:
        failing(x)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(failing, x, cache=memo)
    assert caught.value.error_type is type(refused.value) and caught.value.node_name == "_assert_tensor_metadata_default_1"


def _two_splits_then_a_write(x):
    first = (x * 2).split(2, dim=1)
    second = (x * 3).split(2, dim=1)  # the same key as the first
    second[1].mul_(2)
    return first[0], second[0].transpose(0, 1)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_a_split_from_a_warm_cache_is_restricted_as_autograd_restricts_it(cache, requires_grad):
    """``split``'s outputs are restricted in place whatever its input: a hit calls torch's split again
    on the new input, so a write into an output is refused where real execution refuses it."""
    x = torch.randn(4, 4, requires_grad=requires_grad)
    gm = torch.fx.symbolic_trace(_two_splits_then_a_write)
    memo = fxprop.RuleCache() if cache is True else cache
    if requires_grad:
        with pytest.raises(RuntimeError, match="returns multiple views"):
            gm(x)
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, x, cache=memo)
        assert caught.value.error_type is RuntimeError and caught.value.node_name == "mul_"
    else:
        real = gm(x)
        out = fxprop.propagate(gm, x, cache=memo)
        assert [(t.shape, t.stride(), t.storage_offset()) for t in out] == [
            (t.shape, t.stride(), t.storage_offset()) for t in real]
    if cache is True:
        assert memo.stats()["hits"] >= 1


def _torch_split_twice_then_a_write_with_grad(x, w):
    torch.split(x, 2)  # the same key as the next: the next is a hit
    first, _ = torch.split(x, 2)
    return first.mul_(w)


def _unbind_twice_then_a_write_with_grad(x, w):
    x.unbind(1)
    first, _ = x.unbind(1)
    return first.mul_(w)


@pytest.mark.parametrize("fn, x_spec", [
    (_torch_split_twice_then_a_write_with_grad, TensorSpec((4, 3))),
    (_unbind_twice_then_a_write_with_grad, TensorSpec(("B", 2))),  # symbolic sizes: the hit rebuilds
])
@pytest.mark.parametrize("cache", [False, True, "verify"])
def test_split_outputs_of_an_input_without_grad_stay_restricted_on_a_hit(fn, x_spec, cache):
    """Adversary findings: the outputs of ``torch.split`` (a python function) and of ``unbind`` over
    symbolic sizes were kept as plain views when their input did not require grad; a hit rebuilt
    them unrestricted, and an in-place op with an operand that requires grad was accepted, which
    autograd refuses whatever the input."""
    x = torch.randn(4, 3) if x_spec.shape[0] != "B" else torch.randn(5, 2)
    w = torch.randn(x.shape[1] if fn is _torch_split_twice_then_a_write_with_grad else x.shape[0], requires_grad=True)
    with pytest.raises(RuntimeError) as refused:
        fn(x, w)
    gm = torch.fx.symbolic_trace(fn)
    memo = fxprop.RuleCache() if cache is True else cache
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, x_spec, w, cache=memo)
        assert caught.value.error_type is type(refused.value) and caught.value.node_name == "mul_"
        assert "modified inplace" in str(caught.value)


def _split_viewed_and_written(x):
    second = torch.split(x, 2)[1]
    return second.view(-1).add_(1)


def test_views_of_split_outputs_under_inference_mode():
    """Adversary finding: under inference mode, the check of a rebuilt view's restriction asked
    autograd about a tensor it keeps no metadata for, and failed as fxprop's own error."""
    gm = torch.fx.symbolic_trace(_split_viewed_and_written)
    memo = fxprop.RuleCache()
    with torch.no_grad():  # the key holds grad mode, which inference mode turns off too
        fxprop.propagate(gm, torch.randn(4, 4), cache=memo)
    with torch.inference_mode():
        real = gm(torch.randn(4, 4))
        out = fxprop.propagate(gm, torch.randn(4, 4), cache=memo)
    assert (out.shape, out.stride()) == (real.shape, real.stride())


def _views_twice(x):
    return x.view(-1), x.view(-1), x.view(2, 8), x.view(2, 8)


def test_views_made_without_grad_are_hits():
    """Views made under no_grad are restricted in place (``CreationMeta.NO_GRAD_MODE``); a rebuild
    under the same grad mode, which the key holds, is restricted alike, so they are kept (AOT's
    compilers propagate without grad: refusing them cost a third of their hits)."""
    gm = torch.fx.symbolic_trace(_views_twice)
    memo = fxprop.RuleCache()
    with torch.no_grad():
        fxprop.propagate(gm, torch.randn(4, 4), cache=memo)
    assert memo.stats()["hits"] == 2


def _product_summed(x, w):
    return (x * w).sum()


def test_inference_mode_is_part_of_the_key():
    """Adversary finding: with grad on, inference mode still makes results that do not require grad;
    the key held grad mode only, so one mode's entry answered the other's call."""
    import contextlib
    gm = torch.fx.symbolic_trace(_product_summed)
    memo = fxprop.RuleCache()
    for inference in (False, True, False):
        with contextlib.ExitStack() as modes:
            if inference:
                modes.enter_context(torch.inference_mode())
            modes.enter_context(torch.enable_grad())
            real = _product_summed(torch.randn(4), torch.randn(4, requires_grad=True))
            out = fxprop.propagate(gm, TensorSpec((4,)), TensorSpec((4,), requires_grad=True), cache=memo)
        assert out.requires_grad == real.requires_grad == (not inference)


@pytest.mark.parametrize("shape", [(3, 5, 8), ("B", "T", 8)])
def test_a_view_made_under_no_grad_stays_restricted_on_a_hit(shape):
    """``F.linear`` of a 3-D input under no_grad returns a view of its ``addmm``, made in no_grad
    mode: modifying it in place with an operand that needs grad is refused. The second of two
    identical calls is a hit, which must not rebuild it as a fresh tensor autograd lets be modified."""
    graph = torch.fx.Graph()
    x, w, b, s = (graph.placeholder(name) for name in "xwbs")
    graph.call_function(torch._C._set_grad_enabled, (False,))
    first = graph.call_function(F.linear, (x, w, b))
    second = graph.call_function(F.linear, (x, w, b))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output((first, graph.call_method("add_", (second, s))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    real = (torch.randn(3, 5, 8), torch.randn(6, 8), torch.randn(6), torch.randn((), requires_grad=True))
    with pytest.raises(RuntimeError, match="no_grad"):
        gm(*real)
    fxprop.rule_cache.clear()
    for _ in range(3):  # the call computed, then kept and replayed
        with pytest.raises(fxprop.PropagationError, match="no_grad") as refused:
            fxprop.propagate(gm, TensorSpec(shape), TensorSpec((6, 8)), TensorSpec((6,)),
                             TensorSpec((), requires_grad=True))
        assert refused.value.error_type is RuntimeError
