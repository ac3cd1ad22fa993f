#!/usr/bin/env python
"""Run the graph fuzzer (tests/test_fuzz.py) for a long time, in chunks, with fresh seeds.

Each chunk is one pytest process running ``test_random_graphs`` with
``FXPROP_FUZZ_EXAMPLES=<chunk>`` (randomized, not derandomized) and ``--hypothesis-seed=<seed>``,
so a crash or a hang costs one chunk, not the campaign. A failing chunk's shrunk example and
its ``@reproduce_failure`` blob are written to the log; the campaign goes on with the next seed.

    nice -n 19 .venv/bin/python tools/fuzz_campaign.py --minutes 30 --log /tmp/fuzz_campaign.log

Reproduce a finding with the seed the log names:

    FXPROP_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/test_fuzz.py -k random_graphs \\
        -p no:cacheprovider --hypothesis-seed=<seed>
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--chunk", type=int, default=1000, help="examples per pytest process (default 1000)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="first seed (default: the time)")
    parser.add_argument("--log", default="/tmp/fuzz_campaign.log", help="log file (default /tmp/fuzz_campaign.log)")
    parser.add_argument("--chunk-timeout", type=float, default=1800.0, help="seconds before a chunk counts as hung")
    args = parser.parse_args()

    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    examples = findings = chunks = 0
    seed = args.seed
    with open(args.log, "a", buffering=1) as log:
        def say(text: str) -> None:
            log.write(f"[{time.strftime('%H:%M:%S', time.gmtime())} UTC] {text}\n")

        say(f"campaign start: {args.minutes} min, chunks of {args.chunk}, first seed {seed}")
        while time.monotonic() < deadline:
            env = dict(os.environ, FXPROP_FUZZ_EXAMPLES=str(args.chunk))
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                       "tests/test_fuzz.py", "-k", "random_graphs", f"--hypothesis-seed={seed}",
                       "--hypothesis-show-statistics"]
            chunk_start = time.monotonic()
            try:
                done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=args.chunk_timeout)
                output, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as expired:
                output, code = f"HANG: chunk exceeded {args.chunk_timeout}s\n{expired.stdout or ''}", -1
            chunks += 1
            generated = re.search(r"generate phase.*?(\d+) passing", output, re.S)
            ran = int(generated.group(1)) if generated else (args.chunk if code == 0 else 0)
            examples += ran
            elapsed = time.monotonic() - chunk_start
            if code == 0:
                say(f"seed {seed}: {ran} examples passed in {elapsed:.0f}s "
                    f"(total {examples} examples, {findings} findings, {(time.monotonic() - started) / 60:.1f} min)")
            else:
                findings += 1
                say(f"seed {seed}: FINDING (exit {code}) after {elapsed:.0f}s")
                lines = [line for line in output.splitlines() if not line.startswith("DEBUG")]
                log.write("\n".join(lines[-120:]) + "\n")
            seed += 1
        say(f"campaign end: {chunks} chunks, {examples} examples, {findings} findings, "
            f"{(time.monotonic() - started) / 60:.1f} min")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
