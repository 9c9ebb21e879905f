"""What the operator's memory holds at N TrainingJobs, by allocation site (issue 14, P2: the goal is
an RSS <= 150 MB at 1000; `operator_scale.py` measures the RSS itself, untraced).

    .venv/bin/python bench/operator_memory.py [--jobs 1000] [--frames 6] [--sites 12]

The real operator runs on the local control plane as `operator_scale.py` starts it, plus allocation
tracing (`bench/traced/sitecustomize.py`: tracemalloc from interpreter start, a report on SIGUSR1).
Tracing makes it about twice as slow and its RSS larger, so this benchmark reports traced Python
memory, not times; the RSS beside it is the traced process's.

  start       the operator idle on an empty namespace (imports, kopf, clients, threads): a report
  all-done    N TrainingJobs (suspended) created by --threads client threads, until every one has a
              status.phase (seen by a watch): its RSS (no report: one blocks the operator's event
              loop while it groups a million allocations)
  quiet       once neither the operator's log nor its API calls have grown for 10 s: a report of
              what it holds for N jobs with nothing in flight, and of the peak since start (the
              burst, and the events that followed it)

At start and quiet: traced MB (now, and the peak) and RSS; the traced memory by kind of allocation
site (every site; a site's kind is the first rule its frames match); the --sites largest at quiet.
Ends with RESULT lines: operator_traced_mb_start, operator_traced_mb_quiet_<N>,
operator_traced_peak_mb_<N>, operator_live_kb_per_job (quiet - start, per job).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from operator_scale import (
    ROOT,
    Seen,
    client_for,
    controlplane,
    create_all,
    delete_namespace,
    make_namespace,
    rss_kb,
    trainingjobs,
    wait_quiet,
)

from rayship import api

TRACED = ROOT / "bench" / "traced"
# A site's kind: the first rule one of its frames matches (path fragment -> kind).
KINDS = [
    ("importlib", "modules: code, classes, constants (imports)"),
    ("sslproto.py", "TLS buffers of kopf's aiohttp connections"),
    ("kopf/_cogs/clients/api.py", "watch events as kopf decoded them (JSON)"),
    ("rayship/controller/", "rayship's own copies (indexes, own writes, diffbase)"),
    ("kopf/", "kopf's per-object bookkeeping and tasks"),
    ("kubernetes/", "kubernetes client (responses, models)"),
    ("pydantic", "pydantic models and validators"),
]
OTHER = "other"


def kind_of(frames: list[str]) -> str:
    for fragment, kind in KINDS:
        if any(fragment in frame for frame in frames):
            return kind
    return OTHER


def where(frames: list[str]) -> str:
    """A site's innermost frame (its allocation) and, when that is in Python's own library, the
    innermost frame outside it (who asked): the site's frames run from outermost to innermost."""
    inner = [f for f in reversed(frames) if "<frozen" not in f] or frames[-1:]
    caller = next((f for f in inner if "site-packages/" in f or "/operator/" in f), inner[0])
    return short(inner[0]) + ("" if caller == inner[0] else f" ... {short(caller)}")


def short(frame: str) -> str:
    """A frame without the interpreter's and the venv's directories."""
    for marker in ("site-packages/", "lib/python3.11/", "/operator/"):
        if marker in frame:
            return frame.split(marker, 1)[1]
    return frame


class Traced:
    """The traced operator's reports, one per SIGUSR1."""

    def __init__(self, pid: int, out: Path):
        self.pid, self.out = pid, out

    def report(self, timeout: float = 120) -> dict[str, Any]:
        self.out.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while not self.out.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the traced operator (pid {self.pid}) wrote no report in {timeout:.0f} s")
            time.sleep(0.2)
        report: dict[str, Any] = json.loads(self.out.read_text())
        report["rss"] = rss_kb(self.pid)["VmRSS"] * 1024
        return report


def mb(n: float) -> str:
    return f"{n / 1e6:7.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="TrainingJobs created")
    parser.add_argument("--threads", type=int, default=8, help="client threads creating them")
    parser.add_argument("--frames", type=int, default=6, help="frames tracemalloc keeps per allocation")
    parser.add_argument("--sites", type=int, default=12, help="largest allocation sites printed at quiet")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for one phase")
    args = parser.parse_args()
    if args.jobs < 1 or args.frames < 1:
        parser.error("--jobs and --frames must be at least 1")

    running = controlplane.up(operator=None)
    was_running = controlplane.status().get("operator") is not None if not running.started else False
    controlplane.stop_operator()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"rayship-operator-memory-{os.getpid()}.json"
    handle, ns = None, None
    results: dict[str, float] = {}
    try:
        client = client_for(running.kubeconfig, args.threads)
        env = {
            "PYTHONPATH": str(TRACED),
            "RAYSHIP_BENCH_TRACE_FRAMES": str(args.frames),
            "RAYSHIP_BENCH_TRACE_OUT": str(out),
        }
        handle = controlplane.start_operator(env, ready_timeout=args.timeout)  # tracing slows its start
        traced = Traced(handle.pid, out)
        wait_quiet(handle.log_path, 10, args.timeout)
        traced.report()  # a report leaves a few MB behind: the start figure counts one, as quiet's does
        start = traced.report()

        ns = make_namespace(client, "memory")
        statuses = Seen(
            client, ns, api.TRAININGJOBS, done=lambda o: bool((o.get("status") or {}).get("phase"))
        )
        sent, _ = create_all(
            client, ns, api.TRAININGJOBS, trainingjobs(ns, args.jobs, "m", suspend=True), args.threads
        )
        complete = statuses.wait(list(sent), args.timeout)
        statuses.stop()
        burst_rss = rss_kb(handle.pid)["VmRSS"] * 1024
        waited = wait_quiet(handle.log_path, 10, args.timeout)
        quiet = traced.report()

        n = args.jobs
        print(f"operator traced with {args.frames} frames per allocation (tracemalloc); {n} TrainingJobs")
        if not complete:
            print(f"  (TIMED OUT: {len(statuses.at)} of {n} had a status.phase)")
        print(f"  {'':10} {'traced now':>12} {'traced peak':>12} {'RSS':>12}")
        print(f"  {'start':10} {mb(start['traced']):>12} {mb(start['peak']):>12} {mb(start['rss']):>12}")
        print(f"  {'all-done':10} {'':>12} {'':>12} {mb(burst_rss):>12}")
        print(f"  {'quiet':10} {mb(quiet['traced']):>12} {mb(quiet['peak']):>12} {mb(quiet['rss']):>12}")
        print(f"  (quiet came {waited:.0f} s after all-done; its peak is the highest since start)")

        by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for report, column in ((start, 0), (quiet, 1)):
            for site in report["sites"]:
                by_kind[kind_of(site["frames"])][column] += site["bytes"]
        print(f"  traced memory by kind of allocation site: {'start':>10} {'quiet':>10} {'per job':>10}")
        for kind, (before, after) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
            print(f"    {kind:<52} {mb(before)} {mb(after)} {(after - before) / n / 1e3:7.1f} KB")
        print(
            f"  the {args.sites} largest sites at quiet (where allocated ... the first caller outside Python's own library):"
        )
        for site in quiet["sites"][: args.sites]:
            print(f"    {mb(site['bytes'])} {site['blocks']:8d} blocks  {where(site['frames'])}")

        results["operator_traced_mb_start"] = start["traced"] / 1e6
        results[f"operator_traced_mb_quiet_{n}"] = quiet["traced"] / 1e6
        results[f"operator_traced_peak_mb_{n}"] = quiet["peak"] / 1e6
        results["operator_live_kb_per_job"] = (quiet["traced"] - start["traced"]) / n / 1e3
    finally:
        if handle is not None:
            controlplane.stop_operator(handle)
        out.unlink(missing_ok=True)
        if running.started:
            controlplane.down()
        else:
            if ns is not None:
                delete_namespace(client, ns)
            if was_running:
                controlplane.start_operator()
    for name, value in results.items():
        print(f"RESULT {name}={value:.1f}")


if __name__ == "__main__":
    main()
