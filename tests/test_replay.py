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
    """Every node's annotation, storages named by the order they are first met."""
    storages: dict[int, int] = {}

    def described(value):
        if isinstance(value, torch.Tensor):
            storage = storages.setdefault(value.untyped_storage()._cdata, len(storages))
            return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                    value.requires_grad, storage)
        if isinstance(value, (tuple, list)):
            return (type(value), tuple(described(item) for item in value))
        return (type(value), value)
    return [(node.name, described(node.meta.get("val")), node.meta.get("tensor_meta"), node.meta.get("type"),
             node.meta.get("fxprop")) for node in gm.graph.nodes]


def replays(cache: fxprop.RuleCache) -> int:
    return cache.stats()["replays"]


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
