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
import os
import time

_paused_from: tuple | None = None  # the thresholds the latest pausing call paused the collector from
_OLDEST_PASS_SHARE = 10  # an oldest-generation pass at most once per this many times its own duration
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
    thresholds = gc.get_threshold()
    pausing = thresholds[0] != 0
    paused = (0, *thresholds[1:])
    try:
        if pausing:
            _paused_from = thresholds  # before the pause: a child forked in between resumes it
            gc.set_threshold(*paused)
        yield
    finally:
        if pausing and _paused_from is thresholds:
            if gc.get_threshold() == paused:
                gc.set_threshold(*thresholds)
            _paused_from = None
        if gc.isenabled():
            _pass_due()


def _pass_due() -> None:
    """The collector's pass at the end of a call, in the generation its counts make due. Calls made
    back to back keep its automatic passes from ever running, so without the older generations'
    passes what survived one young pass and died later would never be freed, however much of it
    there is. The oldest generation's pass walks every object of the process: it is made at most
    once per `_OLDEST_PASS_SHARE` times its last duration."""
    global _last_oldest_pass
    counts, thresholds = gc.get_count(), gc.get_threshold()
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
