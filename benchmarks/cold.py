"""One method's first call in a fresh process: `python benchmarks/cold.py CASE METHOD [PROFILE]` prints JSON.

The graph is built before the clock starts (building it does not import fxprop: models.py
loads fxprop/examples/__init__.py on its own). The clock covers importing the method and its first
call; both parts are also reported separately. The peak RSS deltas are the highest resident
set size seen (sampled every millisecond from /proc/self/statm) minus the resident set size
just before the import ("with import") and just before the call ("call").
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


def import_method(method: str) -> None:
    if method == "fxprop":
        import fxprop  # noqa: F401
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: F401


case_name, method = sys.argv[1], sys.argv[2]
profile_path = sys.argv[3] if len(sys.argv) > 3 else None  # write cProfile stats of import + call here
case = CASES[case_name]()
if profile_path:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
preloaded = "fxprop" in sys.modules
before_import = resident_bytes()
with PeakResident() as with_import:
    start = time.perf_counter()
    import_method(method)
    imported = time.perf_counter()
    from methods import METHODS  # noqa: E402

    before_call = resident_bytes()
    with PeakResident() as call:
        call_start = time.perf_counter()
        METHODS[method](case.gm, case)
        end = time.perf_counter()
if profile_path:
    profiler.disable()
    profiler.dump_stats(profile_path)
print(json.dumps({"seconds": end - start, "import_s": imported - start, "call_s": end - call_start,
                  "peak_rss_mb": (with_import.peak - before_import) / 2**20,
                  "call_peak_rss_mb": (call.peak - before_call) / 2**20, "fxprop_preloaded": preloaded}))
