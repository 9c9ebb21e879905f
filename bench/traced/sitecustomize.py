"""Allocation tracing for a process the benchmark starts with PYTHONPATH=bench/traced (benchmark
instrumentation, not part of rayship; `bench/operator_memory.py` uses it on the operator).

With RAYSHIP_BENCH_TRACE_FRAMES set, tracemalloc traces every allocation from interpreter start
(imports included) with that many frames; each SIGUSR1 then writes, to RAYSHIP_BENCH_TRACE_OUT (JSON,
replaced atomically), the traced size now, its peak since the last report (the reports' own
allocations excluded), and every live allocation site (grouped by traceback, largest first). Cyclic
garbage is collected first: only live memory counts.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import tracemalloc
from typing import Any


def _report(*_: Any) -> None:
    gc.collect()
    now, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    sites = [
        {
            "bytes": stat.size,
            "blocks": stat.count,
            "frames": [f"{f.filename}:{f.lineno}" for f in stat.traceback],
        }
        for stat in snapshot.statistics("traceback")
    ]
    out = os.environ["RAYSHIP_BENCH_TRACE_OUT"]
    with open(out + ".tmp", "w") as f:
        json.dump({"traced": now, "peak": peak, "sites": sites}, f)
    del snapshot, sites
    gc.collect()
    tracemalloc.reset_peak()  # after the report's own allocations: the next peak is the process's
    os.replace(out + ".tmp", out)


if frames := os.environ.get("RAYSHIP_BENCH_TRACE_FRAMES"):
    tracemalloc.start(int(frames))
    signal.signal(signal.SIGUSR1, _report)
