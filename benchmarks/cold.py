"""One method's first call in a fresh process: `python benchmarks/cold.py CASE METHOD` prints JSON.

The graph is built before the clock starts; the clock covers importing the method and its
first call. The peak RSS delta is the highest resident set size seen during that span (sampled
every millisecond from /proc/self/statm) minus the resident set size just before it.
"""
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import CASES  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakResident:
    def __init__(self):
        self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, resident_bytes())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


case_name, method = sys.argv[1], sys.argv[2]
case = CASES[case_name]()
before = resident_bytes()
with PeakResident() as watch:
    start = time.perf_counter()
    from methods import METHODS  # noqa: E402  (each method imports what it needs inside)

    METHODS[method](case.gm, case)
    seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_rss_mb": (watch.peak - before) / 2**20}))
