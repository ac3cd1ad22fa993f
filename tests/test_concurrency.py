"""propagate on 4 threads gives what a sequential run gives, node for node.

Threads share the process-wide rule cache, the rule registry and torch's global state; each
works on its own graph module (propagate writes ``node.meta``, so one module must not be
annotated by two threads at once). Compared per node: every tensor's shape, strides, dtype,
device and requires_grad in ``meta["val"]``, python values, and the provenance.
"""
import copy
import threading

import pytest
import torch

import fxprop
from fxprop import examples

THREADS = 4
ROUNDS = 3


def annotations(gm):
    def describe(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(describe(item) for item in value))
        if isinstance(value, dict):
            return ("dict", tuple((key, describe(item)) for key, item in value.items()))
        return ("value", repr(value))
    return {node.name: (describe(node.meta.get("val")), node.meta.get("fxprop")) for node in gm.graph.nodes}


def cnn_on_cuda():
    """Parameters on the meta device, placed on cuda:0 by param_device: nothing is allocated."""
    model, (x,) = examples.cnn_example()
    return model.to("meta"), (fxprop.TensorSpec(tuple(x.shape), device="cuda:0"),)


def gpt_as_specs():
    model, (tokens,) = examples.gpt_example()
    return model, (fxprop.TensorSpec(tuple(tokens.shape), dtype=torch.int64),)


CASES = {"mlp": examples.mlp_example, "cnn_channels_last": lambda: examples.cnn_example(channels_last=True),
         "cnn_on_cuda": cnn_on_cuda, "gpt": gpt_as_specs, "lstm": examples.lstm_example}


def run_threads(jobs):
    """Run each job on its own thread, all released at once; re-raise the first failure."""
    barrier = threading.Barrier(len(jobs))
    results, errors = [None] * len(jobs), []

    def work(i, job):
        barrier.wait()
        try:
            results[i] = job()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a propagate thread hung"
    if errors:
        raise errors[0]
    return results


def propagated(gm, inputs, cache):
    fxprop.propagate(gm, *inputs, cache=cache, param_device="cuda:0")
    return annotations(gm)


@pytest.fixture(scope="module")
def graphs():
    built = {}
    for name, make in CASES.items():
        model, inputs = make()
        built[name] = (torch.fx.symbolic_trace(model), inputs)
    return built


@pytest.mark.parametrize("cache", [True, False], ids=["shared_cache", "no_cache"])
def test_different_graphs_on_four_threads(graphs, cache):
    names = list(graphs)
    expected = {name: propagated(copy.deepcopy(gm), inputs, cache) for name, (gm, inputs) in graphs.items()}
    for round_ in range(ROUNDS):
        chosen = [names[(round_ + i) % len(names)] for i in range(THREADS)]
        jobs = [lambda name=name: propagated(copy.deepcopy(graphs[name][0]), graphs[name][1], cache)
                for name in chosen]
        for name, got in zip(chosen, run_threads(jobs)):
            assert got == expected[name], f"{name} differs on a thread"


@pytest.mark.parametrize("name", ["gpt", "cnn_on_cuda"])
def test_copies_of_one_graph_on_four_threads(graphs, name):
    gm, inputs = graphs[name]
    expected = propagated(copy.deepcopy(gm), inputs, False)
    for _ in range(ROUNDS):
        copies = [copy.deepcopy(gm) for _ in range(THREADS)]
        caches = [True, fxprop.RuleCache(), False, True]
        results = run_threads([lambda c=c, cache=cache: propagated(c, inputs, cache) for c, cache in zip(copies, caches)])
        assert all(result == expected for result in results)


def test_errors_on_threads_name_their_own_node(graphs):
    """A failing graph on one thread leaves the others' results and errors their own."""
    gm, _ = graphs["mlp"]
    wrong = fxprop.TensorSpec((2, 7))
    right = examples.mlp_example()[1]

    def fail():
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(copy.deepcopy(gm), wrong)
        return caught.value.node_name

    expected_node = fail()
    expected = propagated(copy.deepcopy(gm), right, True)
    results = run_threads([fail, lambda: propagated(copy.deepcopy(gm), right, True)] * 2)
    assert results[0] == results[2] == expected_node and results[1] == results[3] == expected


def test_the_shared_cache_stays_consistent_under_threads():
    cache = fxprop.RuleCache(max_entries=32)
    model, inputs = examples.mlp_example()
    gm = torch.fx.symbolic_trace(model)
    shapes = [(n, 16) for n in range(1, 13)]

    def work(offset):
        for i in range(len(shapes)):
            fxprop.propagate(copy.deepcopy(gm), fxprop.TensorSpec(shapes[(i + offset) % len(shapes)]), cache=cache)
        return True

    assert all(run_threads([lambda o=o: work(o) for o in range(THREADS)]))
    stats = cache.stats()
    assert len(cache) <= 32 and stats["entries"] <= stats["max_entries"] == 32
    assert stats["hits"] + stats["misses"] > 0


def test_forward_ad_graphs_on_four_threads_take_turns_at_the_dual_level():
    """torch has one forward-AD level open in the process at a time: dynamo graphs of
    ``torch.func.jvp`` propagated on four threads at once refused each other ("Nested forward mode
    AD is not supported") until their propagations took turns."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(lambda x, w: torch.func.jvp(lambda y: (y @ w).sin(), (x,), (x,)), backend=backend,
                  fullgraph=True)(torch.randn(3, 3), torch.randn(3, 3))
    gm, inputs = graphs[0], (torch.randn(3, 3), torch.randn(3, 3))
    first = copy.deepcopy(gm)
    fxprop.propagate(first, *inputs, cache=False)
    expected = annotations(first)

    def work():
        results = []
        for _ in range(10):
            copied = copy.deepcopy(gm)
            fxprop.propagate(copied, *inputs, cache=False)
            results.append(annotations(copied))
        return results

    assert all(result == expected for results in run_threads([work] * THREADS) for result in results)
    with torch.autograd.forward_ad.dual_level():  # and no level is left open
        pass
