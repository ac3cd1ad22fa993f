"""Python's cyclic garbage collector around a propagation.

A propagation makes many objects and keeps nearly all of them (node values, the cache's
entries). While it runs, the collector's passes would walk every live object again and again,
so time per node would grow with the graph: it is paused for the call. On resuming, the
collector walks what the call made, once, in its youngest generation, and frees what died
meanwhile (a value a node held before, garbage a callback made). It is asked to: left to its
allocation count, it may never come, since a call frees most of what it made before it returns
(a graph propagated again frees its earlier values), which can leave the count under the
collector's threshold call after call, and the garbage waits for allocations the caller may
never make.

Handing what a call made to the oldest generation unwalked (``gc.freeze()`` then
``gc.unfreeze()``) saved Llama-800 65–220 ms a call and was reverted: the garbage went with
it, and the reset generation counts kept full collections from running at all
(``tests/test_leaks.py``).
"""

from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_paused_calls = 0
_thresholds: tuple = ()  # the collector's thresholds when the first call in progress paused it


@contextlib.contextmanager
def garbage_collection_paused():
    """The collector's automatic passes paused while any propagation runs (in any thread), and
    resumed when the last one returns or fails.

    Paused by a zero allocation threshold, not ``gc.disable()``: the enabled flag stays the
    caller's, so a thread that disables the collector meanwhile (``timeit`` does) finds it still
    disabled afterwards. Thresholds someone sets meanwhile are kept too."""
    global _paused_calls, _thresholds
    with _lock:
        if _paused_calls == 0:
            _thresholds = gc.get_threshold()
            gc.set_threshold(0, *_thresholds[1:])
        _paused_calls += 1
    try:
        yield
    finally:
        with _lock:
            _paused_calls -= 1
            last = _paused_calls == 0
            if last and gc.get_threshold()[0] == 0:
                gc.set_threshold(*_thresholds)
        if last and gc.isenabled():
            gc.collect(0)
