"""No leaks: many propagate calls keep memory and every cache bounded.

RSS is read from /proc/self/statm (Linux). The bounds are generous: they catch a leak of a
tensor, a FakeTensorMode or a cache entry per call (1,000 calls), not allocator noise.
"""
import contextlib
import gc
import os
import threading
import time
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import fxprop
from fxprop import examples
from fxprop.resolve import order as resolution

CALLS = 1000
RSS_GROWTH_LIMIT = 96 * 2**20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def live(kind) -> int:
    gc.collect()
    with warnings.catch_warnings():  # isinstance on deprecated torch proxies in gc warns
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc (Linux)")
def test_a_thousand_calls_keep_rss_and_caches_bounded():
    model, (tokens,) = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)  # 64 nodes: embeddings, attention, layer norms, MLPs
    batches = [fxprop.TensorSpec((batch, 16), dtype=torch.int64) for batch in (1, 2, 3, 4)]
    small = fxprop.RuleCache(max_entries=64)

    def call(i):
        cache = {0: False, 1: small}.get(i % 10, True)  # mostly as callers call it: with the shared cache
        fxprop.propagate(gm, tokens if i % 5 == 0 else batches[i % 4], cache=cache)

    for i in range(100):  # warm up: caches fill, lazy imports and allocator pools settle
        call(i)
    gc.collect()
    before_rss, before_fakes, before_modes = rss_bytes(), live(FakeTensor), live(FakeTensorMode)
    started = time.monotonic()
    for i in range(CALLS):
        call(i)
    gc.collect()
    grown = rss_bytes() - before_rss
    assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown / 2**20:.1f} MiB over {CALLS} calls"
    assert live(FakeTensor) <= before_fakes + 8, "FakeTensors outlive their calls"
    assert live(FakeTensorMode) <= before_modes + 2, "FakeTensorModes outlive their calls"
    assert len(small) <= small.max_entries and small.stats()["hits"] > 0
    assert len(fxprop.rule_cache) <= fxprop.rule_cache.max_entries
    assert len(resolution._static) < 2000, "the resolved-rule memo grows per call"
    assert time.monotonic() - started < 120


def test_the_rule_cache_evicts_beyond_its_size():
    cache = fxprop.RuleCache(max_entries=16)
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
    for batch in range(1, 200):
        fxprop.propagate(gm, fxprop.TensorSpec((batch, 8)), cache=cache)
        assert len(cache) <= 16
    stats = cache.stats()
    assert stats["entries"] == 16 and stats["misses"] >= 2 * 199 - 16


def test_failed_calls_do_not_leak():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(4, 4)))
    for _ in range(50):
        with pytest.raises(fxprop.PropagationError):
            fxprop.propagate(gm, fxprop.TensorSpec((2, 8)))
    before = live(FakeTensorMode)
    for _ in range(200):
        with pytest.raises(fxprop.PropagationError):
            fxprop.propagate(gm, fxprop.TensorSpec((2, 8)))
    assert live(FakeTensorMode) <= before + 2, "failed calls keep their modes (tracebacks held?)"


def test_user_tensors_are_not_kept_alive():
    """Real inputs and parameters are read, never retained after the call."""
    import weakref
    model = torch.nn.Linear(8, 8)
    gm = torch.fx.symbolic_trace(model)
    x = torch.randint(0, 3, (4, 8)).float()
    refs = [weakref.ref(x), weakref.ref(gm.weight)]
    fxprop.propagate(gm, x)
    del x, model, gm
    gc.collect()
    assert all(ref() is None for ref in refs), "propagate keeps a user tensor alive"


def _chain(nodes: int) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    for _ in range(nodes):
        value = graph.call_function(torch.relu, (value,))
    graph.output(value)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


class _Cycle:
    def __init__(self):
        self.itself = self


def _cycles_left(gm: torch.fx.GraphModule, calls: int, between=lambda: None) -> int:
    """Propagate ``gm`` ``calls`` times, a progress callback making a reference cycle at each call's
    end (``between`` runs after each call); how many of those cycles are still alive."""
    import weakref
    made = []

    def progress(done, total):
        if done == total:
            made.append(weakref.ref(_Cycle()))

    gc.collect()
    for _ in range(calls):
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), cache=False, progress=progress)
        between()
    return sum(ref() is not None for ref in made)


def test_garbage_made_during_a_large_propagation_is_collected_without_asking():
    """Adversary finding: moving what a call made into the oldest generation unwalked (``gc.freeze()``
    then ``gc.unfreeze()``) moved the call's garbage too, and kept full collections from running:
    cycles a progress callback made piled up, 8 MB each. The collector alone must free them."""
    def what_a_caller_allocates_between_calls():
        for _ in range(3000):
            [[]]
    assert _cycles_left(_chain(1000), 30, what_a_caller_allocates_between_calls) <= 2


def test_garbage_made_during_calls_that_free_as_much_as_they_make_is_collected():
    """A graph propagated again frees its earlier values, so a call can end with the collector's
    allocation count under its threshold, call after call: garbage a callback made must not wait
    for allocations the caller may never make."""
    assert _cycles_left(_chain(300), 20) <= 1


def test_the_collector_is_left_as_the_caller_set_it_during_a_propagation():
    """Adversary findings: a propagation resumed the collector with ``gc.enable()``, undoing a
    ``gc.disable()`` made meanwhile (by another thread; ``timeit`` disables it around what it
    times). Thresholds set meanwhile stay too, a zero threshold (automatic passes off) included."""
    def disabling(done, total):
        if done == 1:
            gc.disable()

    try:
        fxprop.propagate(_chain(5), fxprop.TensorSpec((2, 3)), cache=False, progress=disabling)
        assert not gc.isenabled()
    finally:
        gc.enable()
    thresholds = gc.get_threshold()
    for meanwhile in ((500, 5, 5), (0, 5, 5)):
        def setting_thresholds(done, total, meanwhile=meanwhile):
            if done == 1:
                gc.set_threshold(*meanwhile)

        try:
            fxprop.propagate(_chain(5), fxprop.TensorSpec((2, 3)), cache=False, progress=setting_thresholds)
            assert gc.get_threshold() == meanwhile
        finally:
            gc.set_threshold(*thresholds)


@contextlib.contextmanager
def _propagating_in_another_thread():
    """A block run while another thread's propagation is in flight (waiting in its progress
    callback); the block gets a function that lets that propagation return, and waits for it."""
    inside, release = threading.Event(), threading.Event()

    def waiting_inside(done, total):
        if done == 1:
            inside.set()
            release.wait(60)

    other = threading.Thread(target=fxprop.propagate, args=(_chain(5), fxprop.TensorSpec((2, 3))),
                             kwargs={"cache": False, "progress": waiting_inside})

    def letting_it_return():
        release.set()
        other.join(60)

    other.start()
    try:
        assert inside.wait(60)
        yield letting_it_return
    finally:
        letting_it_return()


def test_the_call_that_paused_the_collector_resumes_it_while_other_calls_are_in_flight():
    """Adversary finding: with the collector resumed only when no call was in flight, two threads
    propagating back to back kept it paused for good, and garbage piled up without bound."""
    thresholds = gc.get_threshold()
    collections = []

    def counting(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    with _propagating_in_another_thread() as letting_it_return:
        def once_the_first_call_has_returned(done, total):
            if done == 1:
                letting_it_return()
                gc.callbacks.append(counting)
                try:
                    for _ in range(20 * thresholds[0]):
                        _Cycle()
                finally:
                    gc.callbacks.remove(counting)

        fxprop.propagate(_chain(5), fxprop.TensorSpec((2, 3)), cache=False, progress=once_the_first_call_has_returned)
    assert len(collections) >= 10  # automatic passes, while this call was still in flight
    assert gc.get_threshold() == thresholds and gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_while_a_call_is_in_flight_collects_garbage():
    """Adversary finding: a child forked while another thread propagated (a DataLoader starting its
    workers beside a compile thread) inherited the paused collector, and nothing there resumed it."""
    thresholds = gc.get_threshold()
    with _propagating_in_another_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork while a thread runs
        assert gc.get_threshold()[0] == 0  # paused by the call in flight
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.get_threshold() == thresholds else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_thresholds_set_while_calls_overlap_are_kept():
    """Adversary finding: a call that paused the collector resumed it from the thresholds it had
    seen, over thresholds another thread set while calls overlapped."""
    thresholds = gc.get_threshold()
    try:
        with _propagating_in_another_thread() as letting_it_return:
            gc.set_threshold(500, *thresholds[1:])

            def once_the_first_call_has_returned(done, total):
                if done == 1:
                    letting_it_return()

            fxprop.propagate(_chain(5), fxprop.TensorSpec((2, 3)), cache=False,
                             progress=once_the_first_call_has_returned)
        assert gc.get_threshold() == (500, *thresholds[1:])
    finally:
        gc.set_threshold(*thresholds)


def test_garbage_that_outlives_a_young_pass_is_collected_while_calls_run_back_to_back():
    """Adversary finding: calls made back to back (a thread propagating in a loop) kept the
    collector's automatic passes from ever running, and each call ended with a young pass only:
    cycles that survived one and died later were never freed (2.3 GB in 20 s)."""
    import weakref
    gm = _chain(5)
    held = [_Cycle() for _ in range(200)]
    alive = [weakref.ref(cycle) for cycle in held]
    fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), cache=False)
    gc.collect(1)  # now in the oldest generation
    del held
    deadline = time.monotonic() + 60  # a forced oldest-generation pass waits for thirty times its last duration
    while any(ref() is not None for ref in alive) and time.monotonic() < deadline:
        fxprop.propagate(gm, fxprop.TensorSpec((2, 3)), cache=False)
    assert not any(ref() is not None for ref in alive)
