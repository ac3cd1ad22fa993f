"""Python's cyclic garbage collector around a propagation.

A propagation makes many objects and keeps nearly all of them (node values, the cache's
entries). While it runs, the collector's passes would walk every live object again and again,
so time per node would grow with the graph: it is paused for the call. As the call ends, the
collector makes a pass (`_pass_due`) and frees what died meanwhile (a value a node held before,
garbage a callback made). Where its allocation count is under the threshold the pass is asked
for: a call frees most of what it made before it returns (a graph propagated again frees its
earlier values), which can leave the count under the threshold call after call, and the garbage
would wait for allocations the caller may never make.

Handing what a call made to the oldest generation unwalked (``gc.freeze()`` then
``gc.unfreeze()``) saved Llama-800 65–220 ms a call and was reverted: the garbage went with
it, and the reset generation counts kept full collections from running at all
(``tests/test_leaks.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

_lock = threading.RLock()  # reentrant: a finalizer run by a pass may itself propagate
_paused_from: tuple | None = None  # the thresholds the latest pausing call paused the collector from
_OLDEST_PASS_SHARE = 30  # a forced oldest-generation pass at most once per this many times its own duration
_last_oldest_pass = (0.0, 0.0)  # (when it started, how long it took), time.monotonic()


@contextlib.contextmanager
def garbage_collection_paused():
    """The collector's automatic passes paused for the call, and resumed (when this call paused
    them) even when the call fails.

    Paused by a zero allocation threshold, not ``gc.disable()``: the enabled flag stays the
    caller's, so a thread that disables the collector meanwhile (``timeit`` does) finds it still
    disabled afterwards, and thresholds set meanwhile are kept. A call that starts while the
    collector is paused leaves the resuming to the call that paused it; a call that pauses it
    after thresholds changed meanwhile takes the resuming over. Each call ends with the pass the
    collector would have made by then (`_pass_due`)."""
    global _paused_from
    thresholds, pausing = None, False
    try:
        with _lock:
            thresholds = gc.get_threshold()
            pausing = thresholds[0] != 0
            if pausing:
                _paused_from = thresholds  # before the pause: a child forked in between resumes it
                gc.set_threshold(0, *thresholds[1:])
        yield
    finally:
        with _lock:
            if pausing and _paused_from is thresholds:
                if gc.get_threshold() == (0, *thresholds[1:]):
                    gc.set_threshold(*thresholds)
                _paused_from = None
        if gc.isenabled():
            _pass_due()


def _pass_due() -> None:
    """The collector's pass at the end of a call. Where its allocation count is over the threshold,
    the next allocation makes the automatic pass, whose generation the collector chooses (it
    spares a large long-lived heap its full passes). Otherwise the pass its counts make due is
    asked for: calls made back to back that free what they make keep the automatic passes from
    ever running, and what outlived one young pass and died later would never be freed. A forced
    oldest-generation pass walks every object of the process: at most once per
    `_OLDEST_PASS_SHARE` times its last duration."""
    global _last_oldest_pass
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if thresholds[0] and counts[0] > thresholds[0]:
        [].append(None)  # an allocation: the collector's own pass runs
        return
    started, took = _last_oldest_pass
    now = time.monotonic()
    if counts[2] > thresholds[2] and now - started >= _OLDEST_PASS_SHARE * took:
        gc.collect(2)
        _last_oldest_pass = (now, time.monotonic() - now)
    elif counts[1] > thresholds[1]:
        gc.collect(1)
    else:
        gc.collect(0)


def _resume_in_a_forked_child() -> None:
    """A process forked while a call had the collector paused: the call does not run in the child
    (fork copies only the forking thread), so nothing there would resume it."""
    global _paused_from
    if _paused_from is not None and gc.get_threshold() == (0, *_paused_from[1:]):
        gc.set_threshold(*_paused_from)
    _paused_from = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_resume_in_a_forked_child)
