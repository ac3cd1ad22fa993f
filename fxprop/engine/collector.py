"""Python's cyclic garbage collector around a propagation.

A propagation makes many objects and keeps nearly all of them (node values, the cache's
entries) and leaves no cycles behind (``tests/test_memo.py``, ``tests/test_leaks.py``). While
it runs, the collector's passes would walk every live object again and again, so time per node
would grow with the graph. Paused, the objects pile up in the youngest generation instead, and
on resuming the collector walks them all at the next allocation, then again a generation later,
finding nothing to free.
"""

from __future__ import annotations

import contextlib
import gc

# From this many nodes a successful call hands what it made to the oldest generation unwalked.
LARGE_GRAPH_NODES = 1000


@contextlib.contextmanager
def garbage_collection_paused(nodes: int = 0):
    """The collector paused for the call, and resumed (when this call paused it) even when the
    call fails.

    A call over ``nodes`` ≥ `LARGE_GRAPH_NODES` first collects the young generations (the caller's
    garbage, a few thousand objects at most), and on success moves everything younger than the
    oldest generation into it without walking it: ``gc.freeze()`` then ``gc.unfreeze()``, each a
    splice of the collector's lists. All it moves is alive: the caller's young objects survived
    that collection, and the call's are the values it made (with what other threads made
    meanwhile). A call that fails leaves its objects young, as a failure may leave a cycle (a
    traceback's) to collect. Objects someone froze stay frozen: with any, nothing moves.
    """
    paused = gc.isenabled()
    promote = paused and nodes >= LARGE_GRAPH_NODES and gc.get_freeze_count() == 0
    if promote:
        gc.collect(1)
    gc.disable()
    succeeded = False
    try:
        yield
        succeeded = True
    finally:
        if paused:
            if promote and succeeded and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
