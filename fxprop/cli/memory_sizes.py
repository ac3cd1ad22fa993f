"""Memory sizes as people write them: ``80GB``, ``79.6GiB``, ``81559MiB``.

Decimal units are powers of 1000 (kB/KB, MB, GB, TB), binary units powers of 1024 (KiB, MiB,
GiB, TiB), as IEC 80000-13 has them; ``B`` is bytes. Case does not matter ("gb", "gib"). A bare
number is refused: "80" could be either, and the two differ by 7%. nvidia-smi reports MiB,
and a GPU sold as "80GB" (an H100) has 81,559 MiB, about 79.6 GiB.

>>> parse_memory_size("80GB"), parse_memory_size("80 GiB"), parse_memory_size("1.5kb")
(80000000000, 85899345920, 1500)
"""
from __future__ import annotations

import re

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*\Z")


def parse_memory_size(text: str) -> int:
    """Bytes, from a number and a unit; ValueError naming the accepted units otherwise."""
    found = _SIZE.match(text)
    unit = found.group(2).lower() if found else ""
    if not found or unit not in UNITS:
        raise ValueError(f"bad memory size {text!r}: expected a number and a unit, such as 80GB (10^9 bytes) or "
                         f"80GiB (2^30 bytes); units: {', '.join(sorted(UNITS, key=UNITS.get))} (any case)")
    return int(float(found.group(1)) * UNITS[unit])
