"""Progress on stderr: the stage being worked on, how far it is, and how long it has taken.

During propagation `propagate(..., progress=...)` reports each node, so the line shows
"done/total nodes"; other stages show a live elapsed time. On a TTY the line redraws in
place; otherwise each finished stage prints one line.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

LARGE_GRAPH_NODES = 500


class Progress:
    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = enabled and self.stream.isatty()
        self._stage: str | None = None
        self._count = ""
        self._started = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @classmethod
    def choose(cls, mode: str, nodes: int) -> "Progress":
        """``mode`` "auto": only for graphs of `LARGE_GRAPH_NODES` nodes or more, and only on a TTY."""
        if mode == "always":
            return cls(True)
        if mode == "never":
            return cls(False)
        return cls(nodes >= LARGE_GRAPH_NODES and sys.stderr.isatty())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.done(failed=exc[0] is not None)

    def advance(self, done: int, total: int) -> None:
        """Per-item progress for the current stage (a `propagate` progress callback)."""
        self._count = f" {done:,}/{total:,}"

    def stage(self, text: str) -> None:
        self.done()
        if not self.enabled:
            return
        self._stage, self._started, self._count = text, time.perf_counter(), ""
        if self.live:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def done(self, failed: bool = False) -> None:
        if self._stage is None:
            return
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
        elapsed = time.perf_counter() - self._started
        status = "failed after" if failed else "done in"
        self._write(f"fxprop: {self._stage} ... {status} {elapsed:.2f} s", final=True)
        self._stage = None

    def _tick(self) -> None:
        spinner = "|/-\\"
        turn = 0
        while not self._stop.wait(0.2):
            elapsed = time.perf_counter() - self._started
            self._write(f"fxprop: {self._stage}{self._count} {spinner[turn % 4]} {elapsed:.1f} s", final=False)
            turn += 1

    def _write(self, text: str, final: bool) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()
