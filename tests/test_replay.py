"""Whole-graph replay (`fxprop.memo.replay`): a graph propagated again with the same key gets what a
walk would give, as fresh objects, and anything a walk would read differently is a different key."""
from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop import TensorSpec


def fresh(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Another graph of the same structure over the same modules (no node identity shared)."""
    copied = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    copied.graph._codegen = copy.deepcopy(gm.graph._codegen)
    copied.recompile()
    return copied


def annotations(gm: torch.fx.GraphModule) -> list:
    """Every node's annotation, storages named by the order they are first met, with their sizes."""
    storages: dict[int, int] = {}

    def described(value):
        if isinstance(value, torch.Tensor):
            storage = storages.setdefault(value.untyped_storage()._cdata, len(storages))
            return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                    value.requires_grad, value.is_conj(), value.is_neg(), storage, value.untyped_storage().nbytes(),
                    value.untyped_storage().resizable())
        if isinstance(value, (tuple, list)):
            return (type(value), tuple(described(item) for item in value))
        if isinstance(value, dict):
            return (type(value), tuple(value), tuple(described(item) for item in value.values()))
        return (type(value), value)
    return [(node.name, described(node.meta.get("val")), node.meta.get("tensor_meta"), node.meta.get("type"),
             node.meta.get("fxprop")) for node in gm.graph.nodes]


def replays(cache: fxprop.RuleCache) -> int:
    return cache.stats()["replays"]


@pytest.fixture(autouse=True)
def every_graph_kept_on_its_first_walk(request, monkeypatch):
    """A cache keeps a graph's walk from its second sighting on (`test_a_graph_is_kept_from_its_second_sighting`
    checks that); the other tests are about what a kept walk gives back, so every walk is kept."""
    if "second_sighting" not in request.node.name:
        monkeypatch.setattr(fxprop.RuleCache, "seen_before", lambda self, sighting: True)


def test_a_graph_is_kept_from_its_second_sighting():
    gm = torch.fx.symbolic_trace(lambda x: x.sin().cos())
    cache = fxprop.RuleCache()
    expected = []
    for calls in range(1, 4):
        copied = fresh(gm)
        fxprop.propagate(copied, TensorSpec((2, 3)), cache=cache)
        expected.append(annotations(copied))
        stats = cache.stats()
        assert (stats["graphs"], stats["replays"]) == {1: (0, 0), 2: (1, 0), 3: (1, 1)}[calls]
    assert expected[0] == expected[1] == expected[2]
    other = torch.fx.symbolic_trace(lambda x: x.sin())  # another size: noted, not kept
    fxprop.propagate(other, TensorSpec((2, 3)), cache=cache)
    assert cache.stats()["graphs"] == 1
    cache.clear()
    fxprop.propagate(fresh(gm), TensorSpec((2, 3)), cache=cache)  # cleared: a first sighting again
    assert cache.stats()["graphs"] == 0


class ViewsAndInPlace(torch.nn.Module):
    def forward(self, x, y):
        a = x.t()
        b = a.unsqueeze(0)
        b.add_(1)
        c = y.view(-1)[2:]
        d = torch.cat([b.flatten(), c])
        e = x.transpose(0, 1).contiguous()
        e.mul_(2)
        return d, e.expand(3, -1, -1), x.unsqueeze_(0)


class Convolutions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x))).sum(dim=(2, 3))


GRAPHS = {
    "views and in-place": lambda: (torch.fx.symbolic_trace(ViewsAndInPlace()), (torch.randn(4, 5), torch.randn(20))),
    "convolutions, train": lambda: (torch.fx.symbolic_trace(Convolutions().train()),
                                    (torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last),)),
    "export of a linear": lambda: (torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)).module(),
                                   (torch.randn(3, 4),)),
    # storages shared by several values, first met filled by a result or at an offset by an input
    "an input viewed at an offset": lambda: (torch.fx.symbolic_trace(lambda x: (x.t(), (x + 1).view(-1)[2:], x[1:])),
                                             (torch.randn(30)[6:].view(4, 6),)),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_a_replay_annotates_as_a_walk_does(name):
    gm, inputs = GRAPHS[name]()
    cache = fxprop.RuleCache()
    walked = fresh(gm)
    fxprop.propagate(walked, *[i.clone() for i in inputs], cache=cache)
    replayed = fresh(gm)
    before = replays(cache)
    fxprop.propagate(replayed, *[i.clone() for i in inputs], cache=cache)
    assert replays(cache) == before + 1
    assert annotations(replayed) == annotations(walked)
    uncached = fresh(gm)
    fxprop.propagate(uncached, *[i.clone() for i in inputs], cache=False)
    assert annotations(uncached) == annotations(walked)
    fxprop.propagate(fresh(gm), *[i.clone() for i in inputs], cache="verify")  # walks and compares: no InternalError


def test_a_replay_matches_real_execution():
    gm, inputs = GRAPHS["views and in-place"]()
    cache = fxprop.RuleCache()
    for _ in range(2):
        copied = fresh(gm)
        fxprop.propagate(copied, *[i.clone() for i in inputs], cache=cache)
    assert replays(cache) == 1
    real = torch.fx.Interpreter(fresh(gm))
    values = {}
    real.run_node = lambda node, run=real.run_node: values.setdefault(node.name, run(node))
    real.run(*[i.clone() for i in inputs])
    for node in copied.graph.nodes:
        if isinstance(values.get(node.name), torch.Tensor) and node.op != "placeholder":
            value, fake = values[node.name], node.meta["val"]
            assert (fake.shape, fake.stride(), fake.dtype) == (value.shape, value.stride(), value.dtype), node.name


def test_replayed_values_are_the_new_graphs_own():
    gm, inputs = GRAPHS["views and in-place"]()
    cache = fxprop.RuleCache()
    first, second = fresh(gm), fresh(gm)
    fxprop.propagate(first, *inputs, cache=cache)
    fxprop.propagate(second, *inputs, cache=cache)
    assert replays(cache) == 1
    described = annotations(first)
    for one, other in zip(first.graph.nodes, second.graph.nodes):
        if isinstance(one.meta["val"], torch.Tensor):
            assert one.meta["val"] is not other.meta["val"]
            assert one.meta["tensor_meta"].qparams is not other.meta["tensor_meta"].qparams
    for node in second.graph.nodes:  # a pass changes the second graph's values in place
        if isinstance(node.meta["val"], torch.Tensor):
            node.meta["val"].unsqueeze_(0)
            node.meta["tensor_meta"].qparams["changed"] = True
    assert annotations(first) == described
    third = fresh(gm)
    fxprop.propagate(third, *inputs, cache=cache)
    assert replays(cache) == 2 and annotations(third) == described


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "device", "same tensor twice", "strides"])
def test_what_a_walk_reads_of_the_inputs_is_part_of_the_key(change):
    def program(x, y):
        return x.add_(1) + y

    gm = torch.fx.symbolic_trace(program)
    cache = fxprop.RuleCache()
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    fxprop.propagate(fresh(gm), x.clone(), y.clone(), cache=cache)
    changed = {"shape": (TensorSpec((4, 1)), y), "dtype": (x.double(), y), "requires_grad": (x, y.requires_grad_()),
               "device": (TensorSpec((4, 4), device="cuda"), TensorSpec((4, 4), device="cuda")),
               "same tensor twice": (x, x), "strides": (x.t(), y)}[change]
    replayed = fresh(gm)
    try:
        fxprop.propagate(replayed, *changed, cache=cache)
        outcome = annotations(replayed)
    except fxprop.PropagationError as error:
        outcome = type(error)
    walked = fresh(gm)
    try:
        fxprop.propagate(walked, *changed, cache=False)
        expected = annotations(walked)
    except fxprop.PropagationError as error:
        expected = type(error)
    assert outcome == expected
    if change != "same tensor twice":  # inputs are propagated as tensors of their own (README, Limits)
        assert replays(cache) == 0


def test_known_index_values_are_part_of_the_key():
    """An embedding given indices in range, then one out of range: the second raises as real execution does."""
    gm = torch.fx.symbolic_trace(torch.nn.Embedding(10, 3))
    cache = fxprop.RuleCache()
    fxprop.propagate(fresh(gm), torch.tensor([1, 2, 3]), cache=cache)
    with pytest.raises(IndexError):
        gm(torch.tensor([1, 2, 30]))
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(fresh(gm), torch.tensor([1, 2, 30]), cache=cache)
    assert caught.value.error_type is IndexError
    assert replays(cache) == 0


def test_module_state_is_part_of_the_key():
    """Train then eval mode, then a batch counter whose value a cumulative average reads."""
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(4, momentum=None))
    gm = torch.fx.symbolic_trace(model)
    cache = fxprop.RuleCache()
    x = torch.randn(3, 4)
    fxprop.propagate(fresh(gm), x, cache=cache)
    gm.eval()
    evaluated = fresh(gm)
    fxprop.propagate(evaluated, x, cache=cache)
    assert replays(cache) == 0
    gm.train()
    model[0].num_batches_tracked.fill_(7)
    fxprop.propagate(fresh(gm), x, cache=cache)
    assert replays(cache) == 0
    fxprop.propagate(fresh(gm), x, cache=cache)
    assert replays(cache) == 1
    assert model[0].num_batches_tracked.item() == 7  # the user's module is untouched


def test_tied_state_is_part_of_the_key():
    """Two modules holding one weight, written in place by the first, differ from two weights."""
    class Tied(torch.nn.Module):
        def __init__(self, tied):
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            if tied:
                self.b.weight = self.a.weight

        def forward(self, x):
            return self.a(x), self.b(x)

    cache = fxprop.RuleCache()
    for tied in (False, True):
        fxprop.propagate(torch.fx.symbolic_trace(Tied(tied)), torch.randn(2, 4), cache=cache)
    assert replays(cache) == 0


def test_a_graph_edited_between_calls_is_walked():
    gm = torch.fx.symbolic_trace(lambda x: x.relu())
    cache = fxprop.RuleCache()
    fxprop.propagate(gm, TensorSpec((2, 3)), cache=cache)
    relu = next(node for node in gm.graph.nodes if node.op == "call_method")
    relu.target = "t"
    gm.recompile()
    fxprop.propagate(gm, TensorSpec((2, 3)), cache=cache)
    assert replays(cache) == 0
    assert tuple(relu.meta["val"].shape) == (3, 2)


_CALLS: list[int] = []


@torch.fx.wrap
def counted(x):
    _CALLS.append(1)
    return x * 2


def test_user_code_is_never_replayed():
    class Program(torch.nn.Module):
        def forward(self, x):
            return counted(x) + 1

    gm = torch.fx.symbolic_trace(Program())
    cache = fxprop.RuleCache()
    _CALLS.clear()
    for _ in range(2):
        fxprop.propagate(fresh(gm), TensorSpec((2,)), cache=cache)
    assert replays(cache) == 0 and len(_CALLS) == 2



def test_methods_bound_to_a_module_are_walked_and_kept_by_nothing():
    """A torch module's bound ``forward`` as a call_function target computes from the module's
    state (and the user's code a Sequential holds), which no key holds: every call walks it, and
    no cache keeps the module alive."""
    import gc
    import weakref
    width = [4]

    class UserWidth(torch.nn.Module):
        def forward(self, x):
            return x.new_empty(x.shape[0], width[0])

    held = torch.nn.Sequential(UserWidth())
    linear = torch.nn.Linear(3, 4)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(held.forward, (x,)), graph.call_function(linear.forward, (x,))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    cache = fxprop.RuleCache()
    for _ in range(3):
        fxprop.propagate(fresh(gm), TensorSpec((2, 3)), cache=cache)
    width[0] = 7
    linear.weight, linear.bias = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(5))
    out = fxprop.propagate(fresh(gm), TensorSpec((2, 3)), cache=cache)
    real = torch.fx.Interpreter(gm).run(torch.randn(2, 3))  # fx's codegen cannot name a bound method
    assert [tuple(value.shape) for value in out] == [tuple(value.shape) for value in real] == [(2, 7), (2, 5)]
    assert replays(cache) == 0
    alive = weakref.ref(linear)
    del gm, graph, x, linear, out, real
    gc.collect()
    assert alive() is None

def test_a_failed_propagation_is_not_kept():
    gm = torch.fx.symbolic_trace(lambda x, y: x @ y)
    cache = fxprop.RuleCache()
    for _ in range(2):
        with pytest.raises(fxprop.PropagationError):
            fxprop.propagate(fresh(gm), TensorSpec((2, 3)), TensorSpec((4, 5)), cache=cache)
    assert cache.stats()["graphs"] == 0


def test_clearing_the_cache_empties_its_graphs_and_cache_false_keeps_none():
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    cache = fxprop.RuleCache()
    fxprop.propagate(gm, TensorSpec((2,)), cache=cache)
    assert cache.stats()["graphs"] == 1
    cache.clear()
    assert cache.stats()["graphs"] == 0
    fxprop.propagate(gm, TensorSpec((2,)), cache=False)
    assert cache.stats()["graphs"] == 0


def test_a_replay_keeps_what_repropagate_reads():
    """The known values of inputs passed for real (``gm.meta``) come back with a replay."""
    gm = torch.fx.symbolic_trace(lambda x, i: x[i] * 2)
    cache = fxprop.RuleCache()
    inputs = (torch.randn(5, 3), torch.tensor([0, 4]))
    fxprop.propagate(fresh(gm), *inputs, cache=cache)
    replayed = fresh(gm)
    fxprop.propagate(replayed, *inputs, cache=cache)
    assert replays(cache) == 1
    mul = next(node for node in replayed.graph.nodes if node.name == "mul")
    assert sorted(node.name for node in fxprop.repropagate(replayed, [mul], cache=cache)) == ["mul", "output"]
    assert tuple(mul.meta["val"].shape) == (2, 3)


def test_progress_is_reported_on_a_replay():
    gm = torch.fx.symbolic_trace(lambda x: x.sin().cos())
    cache = fxprop.RuleCache()
    seen: list[list] = [[], []]
    for calls in seen:
        fxprop.propagate(fresh(gm), TensorSpec((2,)), cache=cache, progress=lambda done, total: calls.append(done))
    assert replays(cache) == 1 and seen[0] == seen[1]


def test_exported_guards_still_refuse_other_sizes():
    """torch.export's .module() checks its inputs' sizes in its _guards_fn: a replay is keyed by them."""
    class Half(torch.nn.Module):
        def forward(self, x):
            return x[: x.shape[0] // 2]

    batch = 2 * torch.export.Dim("half", min=1, max=4)
    gm = torch.export.export(Half(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},)).module()
    cache = fxprop.RuleCache()
    fxprop.propagate(fresh(gm), torch.randn(4, 3), cache=cache)
    fxprop.propagate(fresh(gm), torch.randn(4, 3), cache=cache)
    assert replays(cache) == 1
    with pytest.raises(Exception) as real:
        gm(torch.randn(9, 3))
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(fresh(gm), torch.randn(9, 3), cache=cache)
    assert caught.value.error_type is type(real.value)


def test_threads_replaying_one_graph_agree():
    gm, inputs = GRAPHS["convolutions, train"]()
    cache = fxprop.RuleCache()
    expected = fresh(gm)
    fxprop.propagate(expected, *inputs, cache=cache)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                copied = fresh(gm)
                fxprop.propagate(copied, *inputs, cache=cache)
                results.append(annotations(copied))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 20
    assert all(result == annotations(expected) for result in results)


def _graph(build) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    build(graph)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_the_sign_of_a_known_zero_is_part_of_the_key():
    """-0.0 == 0.0, yet copysign tells them apart: known values are keyed by their bits."""
    import math
    import operator

    def build(extra):
        def built(graph):
            x, s = graph.placeholder("x"), graph.placeholder("s")
            sign = graph.call_function(math.copysign, (1.0, graph.call_method("item", (s,))))
            size = graph.call_function(int, (graph.call_function(operator.add, (sign, extra)),))
            graph.output(graph.call_function(torch.zeros, (size,)))
        return _graph(built)

    cache = fxprop.RuleCache()
    fxprop.propagate(build(2.0), torch.ones(2), torch.tensor(0.0), cache=cache)
    for gm in (build(2.0), build(3.0)):  # the same graph (a replay), another graph (the rule cache: copysign's -0.0)
        out = fxprop.propagate(gm, torch.ones(2), torch.tensor(-0.0), cache=cache)
        assert tuple(out.shape) == tuple(gm(torch.ones(2), torch.tensor(-0.0)).shape)


def test_replayed_values_share_no_storage_with_other_graphs():
    """A pass that resizes one graph's annotation (its meta storage) changes no other graph's."""
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    cache = fxprop.RuleCache()
    graphs = [fresh(gm) for _ in range(3)]
    for copied in graphs[:2]:
        fxprop.propagate(copied, TensorSpec((4,)), cache=cache)
    assert replays(cache) == 1

    def sin(copied):
        return next(node for node in copied.graph.nodes if node.name == "sin").meta["val"]
    assert sin(graphs[0]).untyped_storage()._cdata != sin(graphs[1]).untyped_storage()._cdata
    sin(graphs[0]).untyped_storage().resize_(4096)
    assert sin(graphs[1]).untyped_storage().nbytes() == 16
    fxprop.propagate(graphs[2], TensorSpec((4,)), cache=cache)
    assert replays(cache) == 2 and sin(graphs[2]).untyped_storage().nbytes() == 16


def test_known_inputs_follow_the_placeholders_names():
    """What repropagate reads (``gm.meta``) is keyed by the replayed graph's own placeholder names."""
    from fxprop.engine.walk import KNOWN_INPUTS
    first = torch.fx.symbolic_trace(lambda x, i: x[i] * 2)
    second = copy.deepcopy(first)
    placeholder = next(node for node in second.graph.nodes if node.name == "i")
    placeholder.name = "renamed"
    second.recompile()
    cache = fxprop.RuleCache()
    for gm in (first, second):
        fxprop.propagate(gm, torch.randn(5, 3), torch.tensor([0, 4]), cache=cache)
    assert replays(cache) == 1
    assert list(second.meta[KNOWN_INPUTS]) == ["renamed"]


def test_settings_a_graph_leaves_changed_are_changed_by_every_propagation():
    """A walk runs use_deterministic_algorithms(True) as real execution does; a replay must too."""
    def build(graph):
        x = graph.placeholder("x")
        graph.call_function(torch.use_deterministic_algorithms, (True,))
        graph.output(graph.call_function(torch.sin, (x,)))

    gm = _graph(build)
    cache = fxprop.RuleCache()
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for _ in range(2):
            torch.use_deterministic_algorithms(False)
            fxprop.propagate(fresh(gm), TensorSpec((2,)), cache=cache)
            assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_forward_ad_level_open_in_the_caller_refuses_as_a_walk_does():
    import operator
    import torch.autograd.forward_ad as fwAD

    def build(graph):
        x, t = graph.placeholder("x"), graph.placeholder("t")
        level = graph.call_function(torch._C._enter_dual_level, ())
        dual = graph.call_function(torch._make_dual, (x, t), {"level": level})
        unpacked = graph.call_function(torch._unpack_dual, (dual,), {"level": level})
        tangent = graph.call_function(operator.getitem, (unpacked, 1))
        graph.call_function(torch._C._exit_dual_level, (), {"level": level})
        graph.output(tangent)

    gm = _graph(build)
    cache = fxprop.RuleCache()
    fxprop.propagate(fresh(gm), torch.randn(3), torch.randn(3), cache=cache)
    with fwAD.dual_level():
        with pytest.raises(RuntimeError):
            gm(torch.randn(3), torch.randn(3))
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(fresh(gm), torch.randn(3), torch.randn(3), cache=cache)
    assert caught.value.error_type is RuntimeError


def test_process_state_a_call_reads_is_read_on_every_propagation():
    """torch.initial_seed() takes no argument: its answer is the process's, never a cached one."""
    import operator

    def build(extra):
        def built(graph):
            graph.placeholder("x")
            seed = graph.call_function(torch.initial_seed, ())
            size = graph.call_function(operator.add, (graph.call_function(operator.mod, (seed, 5)), extra))
            graph.output(graph.call_function(torch.zeros, (size,)))
        return _graph(built)

    cache = fxprop.RuleCache()
    state = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        fxprop.propagate(build(1), torch.ones(1), cache=cache)
        torch.manual_seed(3)
        for gm in (build(1), build(2)):  # the same graph (a replay), another graph (the rule cache)
            out = fxprop.propagate(gm, torch.ones(1), cache=cache)
            assert tuple(out.shape) == tuple(gm(torch.ones(1)).shape)
    finally:
        torch.set_rng_state(state)


def test_lazy_conjugations_and_negations_are_kept():
    """x.conj() is a view with the conjugate bit, its .imag one with the negative bit: a second
    conj node (a rule-cache hit) and a replay keep them, as real execution does."""
    gm = torch.fx.symbolic_trace(lambda x: (x.conj(), x.conj().imag))
    x = torch.randn(2, 3, dtype=torch.complex64)
    cache = fxprop.RuleCache()
    first, second = fresh(gm), fresh(gm)
    fxprop.propagate(first, x, cache=cache)
    fxprop.propagate(second, x, cache=cache)
    assert replays(cache) == 1
    real = gm(x)
    for annotated in (first, second):
        out = next(node for node in annotated.graph.nodes if node.op == "output").meta["val"]
        assert [(t.is_conj(), t.is_neg()) for t in out] == [(t.is_conj(), t.is_neg()) for t in real] == [(True, False),
                                                                                                          (False, True)]


def test_a_container_attribute_the_graph_appends_to_is_the_users_own():
    """get_attr of a list the graph then appends to: every propagation sees the list as the user
    holds it, and leaves it so (a walk appended to the user's list, and the next call's key changed)."""
    root = torch.nn.Module()
    root.sizes = [2, 3]

    def build(graph):
        graph.placeholder("x")
        sizes = graph.get_attr("sizes")
        graph.call_method("append", (sizes, 4))
        graph.output(graph.call_function(torch.zeros, (graph.call_function(len, (sizes,)),)))

    graph = torch.fx.Graph()
    build(graph)
    gm = torch.fx.GraphModule(root, graph)
    cache = fxprop.RuleCache()
    shapes = [tuple(fxprop.propagate(gm, torch.ones(1), cache=cache).shape) for _ in range(2)]
    assert gm.sizes == [2, 3] and shapes == [(3,), (3,)] and replays(cache) == 1


def test_a_storage_shrunk_after_its_views_stays_shrunk():
    """FSDP's graphs free a parameter's storage (inductor.resize_storage_bytes_) after viewing it: a
    replay sets its views over a storage the walk's size, and leaves it that size (set_ grows it)."""
    import torch._inductor  # noqa: F401  (registers torch.ops.inductor)

    def build(graph):
        x = graph.placeholder("x")
        flat = graph.call_function(torch.ops.aten.new_empty.default, (x, [4]))
        view = graph.call_function(torch.ops.aten.view.default, (flat, [2, 2]))
        graph.call_function(torch.ops.inductor.resize_storage_bytes_, (flat, 0))
        graph.output((view, flat))

    gm = _graph(build)
    walked = fresh(gm)
    fxprop.propagate(walked, TensorSpec((3,)), cache=False)
    cache = fxprop.RuleCache()
    for _ in range(2):
        replayed = fresh(gm)
        fxprop.propagate(replayed, TensorSpec((3,)), cache=cache)
    assert replays(cache) == 1
    assert annotations(replayed) == annotations(walked)
    nbytes = [[t.untyped_storage().nbytes() for t in next(iter(reversed(g.graph.nodes))).meta["val"]]
              for g in (walked, replayed)]
    assert nbytes == [[0, 0], [0, 0]]


def test_an_op_named_in_place_is_never_a_cache_hit():
    """``inductor::resize_storage_bytes_``'s schema does not mark its input as written: a hit would
    skip the resize, and the storage a later grow left would stay grown."""
    import torch._inductor  # noqa: F401  (registers torch.ops.inductor)

    def build(graph, negated=False):
        x = graph.placeholder("x")
        doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
        grown = graph.call_function(torch.ops.aten.resize_.default, (doubled, [8]))
        graph.call_function(torch.ops.inductor.resize_storage_bytes_, (doubled, 16))
        if negated:
            graph.call_function(torch.ops.aten.neg.default, (x,))
        graph.output((doubled, grown))

    real = fresh(_graph(build))(torch.ones(4))
    assert [t.untyped_storage().nbytes() for t in real] == [16, 16]
    cache = fxprop.RuleCache()
    for gm in (_graph(build), _graph(build), _graph(lambda graph: build(graph, negated=True))):
        out = fxprop.propagate(gm, TensorSpec((4,)), cache=cache)  # a replay, then another graph's walk
        assert [t.untyped_storage().nbytes() for t in out] == [16, 16]
    assert replays(cache) == 1 and cache.stats()["hits"] >= 1


def test_a_pass_editing_a_kept_walks_tensor_meta_changes_no_replay():
    """A list-valued node's tensor_meta is a list: the entry keeps its own, not the graph's."""
    def build(graph):
        x = graph.placeholder("x")
        graph.output((graph.call_function(torch.ops.aten.split.Tensor, (x, 2)),))

    gm = _graph(build)
    cache = fxprop.RuleCache()
    kept, replayed = fresh(gm), fresh(gm)
    fxprop.propagate(kept, TensorSpec((4,)), cache=cache)
    split = next(node for node in kept.graph.nodes if node.op == "call_function")
    split.meta["tensor_meta"].append("a pass's own")
    split.meta["tensor_meta"][0] = None
    fxprop.propagate(replayed, TensorSpec((4,)), cache=cache)
    assert replays(cache) == 1
    metas = next(node for node in replayed.graph.nodes if node.op == "call_function").meta["tensor_meta"]
    assert len(metas) == 2 and all(meta.shape == (2,) for meta in metas)


def test_verify_compares_what_a_replay_builds(monkeypatch):
    """cache="verify" compares the walk with the values a replay builds from the entry, not only
    with the numbers the entry keeps: a build that loses the negative bit is caught."""
    from fxprop.memo import replay
    from fxprop.memo.cache import rule_cache

    gm = torch.fx.symbolic_trace(lambda x: (x.conj().imag, x[1:].conj()))
    x = torch.randn(2, 3, dtype=torch.complex64)
    rule_cache.clear()
    try:
        fxprop.propagate(fresh(gm), x, cache=True)
        fxprop.propagate(fresh(gm), x, cache="verify")  # a correct replay: no InternalError
        monkeypatch.setattr(replay, "neg_view", lambda tensor: tensor)
        with pytest.raises(fxprop.InternalError, match="replay differs"):
            fxprop.propagate(fresh(gm), x, cache="verify")
    finally:
        rule_cache.clear()


def test_verify_tells_a_kept_zero_from_a_negative_zero():
    from fxprop.memo import replay
    from fxprop.engine.walk import Provenance
    from fxprop import Kind

    def recording(value):
        return replay.NodeRecording(replay.template(value), None, float, Provenance(Kind.PLAIN, "python"))
    assert replay.differences((recording(0.0),), (recording(-0.0),)) == [0]
    assert replay.differences((recording(float("nan")),), (recording(float("nan")),)) == []


def test_graphs_returning_lists_and_dicts_are_replayed():
    """An output node's list or dict is an immutable_list / immutable_dict (torch.fx's map_arg):
    kept as the plain list or dict a walk stages, so such graphs replay too."""
    gm = torch.fx.symbolic_trace(lambda x: {"a": [x, x.t()], "b": (x[0], x.sum())})
    cache = fxprop.RuleCache()
    walked, replayed = fresh(gm), fresh(gm)
    fxprop.propagate(walked, TensorSpec((2, 3)), cache=cache)
    out = fxprop.propagate(replayed, TensorSpec((2, 3)), cache=cache)
    assert replays(cache) == 1
    assert annotations(replayed) == annotations(walked)
    assert type(out) is dict and type(out["a"]) is list and out["a"][1].shape == (3, 2)


def test_a_callable_object_is_not_torchs_own_by_its_class_module():
    """``operator.methodcaller`` takes ``__module__`` from its class: ``methodcaller("resize_", ...)``
    writes its input, ``methodcaller("add", t)`` holds a tensor no key holds, ``attrgetter("_version")``
    reads a tensor's history. None is memoized or replayed; each call is walked."""
    import operator
    held = torch.zeros(4)
    grow, add_held = operator.methodcaller("resize_", [8]), operator.methodcaller("add", held)

    def build(graph):
        x = graph.placeholder("x")
        doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
        graph.create_node("call_function", grow, (doubled,), name="grow")
        graph.output((doubled, graph.create_node("call_function", add_held, (x,), name="added")))

    def lazy_graph():  # fx's codegen cannot name a methodcaller, so the graph is never compiled
        graph = torch.fx.Graph()
        build(graph)
        return _LazyGraphModule(torch.nn.Module(), graph)

    from torch.fx._lazy_graph_module import _LazyGraphModule
    cache = fxprop.RuleCache()
    for _ in range(3):
        out = fxprop.propagate(lazy_graph(), TensorSpec((4,)), cache=cache)
        assert [tuple(value.shape) for value in out] == [(8,), (4,)]
    held.resize_(3, 4)
    out = fxprop.propagate(lazy_graph(), TensorSpec((4,)), cache=cache)
    real = torch.fx.Interpreter(lazy_graph()).run(torch.ones(4))
    assert [tuple(value.shape) for value in out] == [tuple(value.shape) for value in real] == [(8,), (3, 4)]
    assert replays(cache) == 0


def test_tensor_methods_with_effects_as_call_function_targets_are_walked():
    """``torch.Tensor.backward`` (a python function in ``torch._tensor``) as a call_function target
    sets its leaves' grads: a hit or a replay that skipped it would leave ``grad`` None."""
    def build(graph):
        x = graph.placeholder("x")
        total = graph.call_function(torch.ops.aten.sum.default, (graph.call_function(torch.mul, (x, x)),))
        graph.call_function(torch.Tensor.backward, (total,))
        graph.output((graph.call_function(getattr, (x, "grad")),))

    cache = fxprop.RuleCache()
    for _ in range(3):
        out = fxprop.propagate(_graph(build), TensorSpec((3,), requires_grad=True), cache=cache)
        assert isinstance(out[0], torch.Tensor) and tuple(out[0].shape) == (3,)
    assert replays(cache) == 0
    assert fxprop.memo.purity.may_differentiate(_graph(build))


def _a_users_function() -> type:
    """A new autograd Function class of the user's on every call, for a test to watch it go."""
    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2
    return Doubled


def test_a_classmethod_of_a_users_subclass_is_kept_by_no_table():
    """A classmethod bound to a user's class (``MyTensor.__torch_function__``, a Function's ``apply``)
    is the user's code: no purity, replay or rule table keeps the class alive."""
    import gc
    import weakref

    Doubled = _a_users_function()

    def build(graph):
        x = graph.placeholder("x")
        graph.output((graph.call_function(Doubled.apply, (x,)),))

    cache = fxprop.RuleCache()
    for _ in range(2):
        out = fxprop.propagate(_graph(build), TensorSpec((3,)), cache=cache)
        assert tuple(out[0].shape) == (3,)
    alive = weakref.ref(Doubled)
    del Doubled, build
    cache.clear()
    fxprop.rule_cache.clear()
    gc.collect()
    assert alive() is None


def _lazy_graph(build) -> torch.fx.GraphModule:
    """A graph never compiled: fx's codegen cannot name some targets (a callable object, a class torch made)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    graph = torch.fx.Graph()
    build(graph)
    return _LazyGraphModule(torch.nn.Module(), graph)


def test_a_users_wrapper_of_a_torch_function_is_the_users():
    """``functools.wraps`` copies ``torch.flatten``'s ``__module__`` onto a user's wrapper that reads
    the user's state: it is neither memoized nor replayed, and no table keeps the state alive."""
    import functools
    import gc
    import weakref

    class Config:
        start = 1

    config = Config()

    @functools.wraps(torch.flatten)
    def flatten(x):
        return torch.flatten(x, config.start)

    def build(graph):
        x = graph.placeholder("x")
        first = graph.call_function(flatten, (x,))
        graph.call_function(setattr, (config, "start", 0))
        graph.output((first, graph.call_function(flatten, (x,))))

    cache = fxprop.RuleCache()
    for start in (1, 1, 2):
        config.start = start
        real = torch.fx.Interpreter(_lazy_graph(build)).run(torch.ones(2, 3, 4))
        config.start = start
        out = fxprop.propagate(_lazy_graph(build), TensorSpec((2, 3, 4)), cache=cache)
        assert [tuple(value.shape) for value in out] == [tuple(value.shape) for value in real]
    assert replays(cache) == 0
    alive = weakref.ref(config)
    del config, flatten, build, out, real
    cache.clear()
    gc.collect()
    assert alive() is None


def test_a_call_that_resizes_inside_is_never_a_hit():
    """``torch._refs._maybe_resize_out`` resizes its argument in place though its name does not say
    so: called twice alike in one graph, the second call is computed, not a hit that skips the resize."""
    import torch._refs

    def build(graph):
        first, second = graph.placeholder("first"), graph.placeholder("second")
        graph.call_function(torch._refs._maybe_resize_out, (first, (4, 4)))
        graph.call_function(torch._refs._maybe_resize_out, (second, (4, 4)))
        graph.output((graph.call_function(torch.ops.aten.view.default, (second, [-1])),))

    with pytest.warns(UserWarning, match="was resized"):
        real = torch.fx.Interpreter(_lazy_graph(build)).run(torch.zeros(2), torch.zeros(2))
    for cache in (fxprop.RuleCache(), "verify"):
        with pytest.warns(UserWarning, match="was resized"):
            out = fxprop.propagate(_lazy_graph(build), TensorSpec((2,)), TensorSpec((2,)), cache=cache)
        assert (tuple(out[0].shape), out[0].untyped_storage().nbytes()) == (
            tuple(real[0].shape), real[0].untyped_storage().nbytes()) == ((16,), 64)


def test_backward_reached_through_operator_call_or_getattr_marks_the_graph_as_differentiating():
    import operator
    from fxprop.memo.purity import may_differentiate

    def through_call(graph):
        x = graph.placeholder("x")
        total = graph.call_function(torch.ops.aten.sum.default, (x,))
        graph.call_function(operator.call, (torch.Tensor.backward, total))
        graph.output((x,))

    def through_getattr(graph):
        x = graph.placeholder("x")
        total = graph.call_function(torch.ops.aten.sum.default, (x,))
        graph.call_function(operator.call, (graph.call_function(getattr, (total, "backward")),))
        graph.output((x,))

    assert may_differentiate(_lazy_graph(through_call)) and may_differentiate(_lazy_graph(through_getattr))
    assert not fxprop.memo.purity.is_pure("call_function", operator.call, (torch.Tensor.backward,), {})


def test_classes_torch_makes_around_a_users_class_are_kept_by_no_table():
    """A Function's ``_backward_cls`` and a parametrized module's class carry torch's ``__module__``
    but hold the user's class; no table keeps them, and the user's class can go."""
    import gc
    import weakref
    import torch.nn.utils.parametrize as parametrize
    from fxprop.memo.purity import owned_by_torch

    Doubled = _a_users_function()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.zeros(3, 3))

        def forward(self, x):
            return x @ self.w

    class Upper(torch.nn.Module):
        def forward(self, w):
            return w.triu()

    net = Net()
    parametrize.register_parametrization(net, "w", Upper())
    assert not owned_by_torch(Doubled._backward_cls) and not owned_by_torch(type(net))
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.add_submodule("net", net)
    x = gm.graph.placeholder("x")
    gm.graph.call_function(Doubled._backward_cls, ())
    gm.graph.output((gm.graph.call_module("net", (x,)), gm.graph.call_function(Doubled.apply, (x,))))
    cache = fxprop.RuleCache()
    for _ in range(2):
        out = fxprop.propagate(torch.fx._lazy_graph_module._LazyGraphModule(gm, gm.graph), TensorSpec((2, 3)), cache=cache)
        assert [tuple(value.shape) for value in out] == [(2, 3), (2, 3)]
    alive = [weakref.ref(Doubled), weakref.ref(Net)]
    del Doubled, Net, net, gm, x, out
    cache.clear()
    fxprop.rule_cache.clear()
    gc.collect()
    assert [ref() for ref in alive] == [None, None]


def test_a_class_whose_module_cannot_be_read_is_the_users():
    class Unnamed(type):
        @property
        def __module__(cls):
            raise ValueError("no module")

    class Doubler(metaclass=Unnamed):
        @classmethod
        def double(cls, x):
            return x * 2

    def build(graph):
        graph.output((graph.call_function(Doubler.double, (graph.placeholder("x"),)),))

    out = fxprop.propagate(_lazy_graph(build), TensorSpec((3,)), cache=fxprop.RuleCache())
    assert tuple(out[0].shape) == (3,)


def test_a_call_that_reshapes_only_what_it_made_is_kept():
    """``gru`` with ``batch_first`` transposes its own output in place: that is no write to what it
    was given, and a second alike call is a hit."""
    gru = torch.nn.GRU(4, 5, batch_first=True)
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(gru))
    cache = fxprop.RuleCache()
    fxprop.propagate(gm, TensorSpec((2, 3, 4)), cache=cache)
    other = torch.fx.symbolic_trace(torch.nn.Sequential(gru, torch.nn.Identity()))  # another graph: no replay
    out = fxprop.propagate(other, TensorSpec((2, 3, 4)), cache=cache)
    assert cache.stats()["hits"] >= 1 and tuple(out[0].shape) == (2, 3, 5)


def test_targets_whose_attributes_cannot_be_read_are_the_users():
    """A target whose metaclass raises on ``__qualname__``, ``__func__`` or reports a module that is
    no string is not torch's, and no raw error escapes; a qualified name is looked up without
    importing anything (torch's module ``__getattr__`` imports submodules on access)."""
    import subprocess
    import sys

    class QualnameRaises(type):
        def __getattribute__(cls, name):
            if name == "__qualname__":
                raise ValueError("no qualname")
            return type.__getattribute__(cls, name)

    class FuncRaises(type):
        def __getattr__(cls, name):
            raise KeyError(name) if name == "__func__" else AttributeError(name)

    class ModuleNotAString(type):
        @property
        def __module__(cls):
            return 5

    targets = []
    for metaclass in (QualnameRaises, FuncRaises, ModuleNotAString):
        namespace = {"__new__": lambda cls, x: x * 2}
        if metaclass is not ModuleNotAString:
            namespace["__module__"] = "torch"
        targets.append(metaclass("Doubler", (), namespace))
    for target in targets:
        assert not fxprop.memo.purity.owned_by_torch(target)
        for cache in (fxprop.RuleCache(), "verify"):
            gm = _lazy_graph(lambda graph: graph.output((graph.create_node(
                "call_function", target, (graph.placeholder("x"),), name="doubled"),)))
            assert tuple(fxprop.propagate(gm, TensorSpec((3,)), cache=cache)[0].shape) == (3,)
    code = ("import sys, types, torch, fxprop\n"
            "f = types.FunctionType((lambda x: x).__code__, {}, 'f')\n"
            "f.__module__, f.__qualname__ = 'torch', '_dynamo.f'\n"
            "assert not fxprop.memo.purity.owned_by_torch(f)\n"
            "print('torch._dynamo' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_swap_outside_the_dispatcher_is_never_a_hit_nor_a_stale_signature():
    """``torch._C._swap_tensor_impl`` swaps two tensors outside torch's dispatcher: a hit would skip
    the swap, and a signature taken before it would key the next graph's calls by the old sizes."""
    def swapping(graph):
        a, c = graph.placeholder("a"), graph.placeholder("c")
        graph.create_node("call_function", torch._C._swap_tensor_impl, (a, c), name="swap")
        graph.output((graph.call_function(torch.mul, (a, 1)),))

    def plain(graph):
        graph.output((graph.call_function(torch.mul, (graph.placeholder("x"), 1)),))

    cache = fxprop.RuleCache()
    for build, inputs, shape in ((swapping, (torch.zeros(2, 3), torch.zeros(5)), (5,)),
                                 (plain, (torch.zeros(2, 3),), (2, 3)),
                                 (swapping, (torch.zeros(2, 3), torch.zeros(5)), (5,))):
        real = torch.fx.Interpreter(_lazy_graph(build)).run(*(t.clone() for t in inputs))
        out = fxprop.propagate(_lazy_graph(build), *inputs, cache=cache)
        assert tuple(out[0].shape) == tuple(real[0].shape) == shape


def test_a_torch_function_that_swaps_what_it_is_given_is_never_a_hit():
    """``parametrize._maybe_set`` swaps its destination's contents (``torch.utils.swap_tensors``,
    outside the dispatcher) when module parameters are swapped on conversion: torch's own and
    pure by its name, its call is compared before and after, and not kept."""
    import torch.nn.utils.parametrize as parametrize

    def build(graph):
        a, c = graph.placeholder("a"), graph.placeholder("c")
        graph.call_function(parametrize._maybe_set, (a, c))
        graph.output((graph.call_function(torch.sub, (a, 1)),))

    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        real = torch.fx.Interpreter(_lazy_graph(build)).run(torch.zeros(2, 3), torch.zeros(5))
        cache = fxprop.RuleCache()
        for _ in range(2):
            out = fxprop.propagate(_lazy_graph(build), torch.zeros(2, 3), torch.zeros(5), cache=cache)
            assert tuple(out[0].shape) == tuple(real[0].shape) == (5,)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    assert not fxprop.memo.purity.is_pure("call_function", exec, ("a.data = c",), {})
