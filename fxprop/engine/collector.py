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

_paused_from: tuple | None = None  # the thresholds a call in flight paused the collector from


@contextlib.contextmanager
def garbage_collection_paused():
    """The collector's automatic passes paused for the call, and resumed (when this call paused
    them) even when the call fails.

    Paused by a zero allocation threshold, not ``gc.disable()``: the enabled flag stays the
    caller's, so a thread that disables the collector meanwhile (``timeit`` does) finds it still
    disabled afterwards, and thresholds set meanwhile are kept (told from the pause by all three).
    A call that starts while another has paused the collector leaves the resuming to that one:
    calls that overlap one another, thread after thread, must not keep it paused for good."""
    global _paused_from
    thresholds = gc.get_threshold()
    pausing = thresholds[0] != 0
    paused = (0, *thresholds[1:])
    try:
        if pausing:
            gc.set_threshold(*paused)
            _paused_from = thresholds
        yield
    finally:
        if pausing and gc.get_threshold() == paused:
            gc.set_threshold(*thresholds)
            _paused_from = None
        if gc.isenabled():
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
