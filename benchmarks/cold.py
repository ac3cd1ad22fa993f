"""One method's first call in a fresh process: `python benchmarks/cold.py CASE METHOD` prints JSON.

The graph is built before the clock starts; the clock covers importing the method and its
first call. Peak RSS delta is the growth of the process's peak RSS over the same span.
"""
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import CASES  # noqa: E402

case_name, method = sys.argv[1], sys.argv[2]
case = CASES[case_name]()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
from methods import METHODS  # noqa: E402  (each method imports what it needs inside)

METHODS[method](case.gm, case)
seconds = time.perf_counter() - start
peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_rss_mb": (peak_after - peak_before) / 1024}))
