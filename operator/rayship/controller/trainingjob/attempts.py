"""status.attempts and the resource totals: every attempt of a TrainingJob on record (pure).

KubeRay runs a RayJob's attempts one after the other (backoffLimit), each on a new Ray cluster, and
keeps only the current one's `startTime` (set again at each attempt, and at a resume) and a count of
failures. The operator turns what it sees into a record: an attempt is opened when a new `startTime`
appears and closed when the next one appears, when the job is suspended (its cluster goes), or when
the job ends. What an attempt reached comes from the workload's own progress (`status.progress`),
frozen when it closes. The totals are the closed attempts' figures plus the open one's so far, so
they always add up. The record lives in the TrainingJob's status: an operator restart loses nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rayship import api
from rayship.controller.conditions import parse_time, rfc3339

MAX_ATTEMPTS_KEPT = 20  # the oldest are dropped; the totals cover every attempt
ATTEMPT_FAILED_REASONS = frozenset({"AttemptEnded", "Retrying"})  # KubeRay: this attempt failed
SUSPENDED_STATES = frozenset({"Suspending", "Suspended"})
RESOURCES = (("gpu", 0), ("cpu", 1))  # (status field prefix, index in `rates`)


def accounted(
    current: Mapping[str, Any],
    rayjob_status: Mapping[str, Any],
    phase: str,
    reason: str,
    attempt: int | None,
    rates: tuple[float, float],
    now: datetime,
    ready: int | None = None,
) -> dict[str, Any]:
    """status.attempts after this observation, with gpuSeconds/cpuSeconds (and their hours, and the
    part of closed attempts). `rates`: the GPUs and the CPUs the job's Ray pods request; `ready`: the
    ready worker count while it runs (None: not known)."""
    kept = [dict(a) for a in current.get("attempts") or [] if isinstance(a, Mapping)]
    closed_now: list[dict[str, Any]] = []
    start = parse_time(rayjob_status.get("startTime"))
    if start is not None and attempt is not None:
        progress = current.get("progress") or {}
        last = kept[-1] if kept else None
        if last is None or parse_time(last.get("startTime")) != start:
            if last is not None and "endTime" not in last:  # its successor began: it ran until then
                said = last.get("reason") or rayjob_status.get("reason") or "Retried"
                closed_now.append(
                    _close(last, start, str(last.get("outcome") or "Failed"), str(said), progress, rates)
                )
            # KubeRay counts a failure before it starts the next attempt: `attempt` is this one's.
            last = {"attempt": attempt, "startTime": rfc3339(start)}
            kept.append(last)
        if "endTime" not in last:
            if phase in api.TERMINAL_PHASES:
                end = parse_time(rayjob_status.get("endTime")) or now
                closed_now.append(_close(last, end, phase, reason, progress, rates))
            elif rayjob_status.get("jobDeploymentStatus") in SUSPENDED_STATES:
                closed_now.append(_close(last, now, "Suspended", "Suspended", progress, rates))
            else:
                _measure(last, now, progress, rates)
                _note_workers(last, ready, now)
                if reason in ATTEMPT_FAILED_REASONS:
                    # Failed; its cluster goes and the next attempt's comes: counted until the next
                    # one starts, and closed then.
                    last.update(outcome="Failed", reason=str(rayjob_status.get("reason") or reason))
    out: dict[str, Any] = {"attempts": kept[-MAX_ATTEMPTS_KEPT:]} if kept else {}
    running = kept[-1] if kept and "endTime" not in kept[-1] else {}
    for field, _ in RESOURCES:
        earlier = float(current.get(f"{field}SecondsEarlierAttempts") or 0.0)
        earlier = round(earlier + sum(a.get(f"{field}Seconds") or 0.0 for a in closed_now), 3)
        total = round(earlier + (running.get(f"{field}Seconds") or 0.0), 3)
        if kept or earlier:
            out.update({
                f"{field}Seconds": total,
                f"{field}SecondsEarlierAttempts": earlier,
                f"{field}Hours": round(total / 3600, 3),
            })  # fmt: skip
    return out


def _measure(
    entry: dict[str, Any], end: datetime, progress: Mapping[str, Any], rates: tuple[float, float]
) -> None:
    """An attempt's figures until `end`: the resources it held and what the workload reported."""
    start = parse_time(entry.get("startTime")) or end
    seconds = max(0, round((end - start).total_seconds()))
    for field, i in RESOURCES:
        entry[f"{field}Seconds"] = float(round(seconds * rates[i], 3))
    if progress.get("epoch") is not None:
        entry["reachedEpoch"] = progress["epoch"]
    if progress.get("resumedFromEpoch") is not None:
        entry["resumedFromEpoch"] = progress["resumedFromEpoch"]


def _note_workers(entry: dict[str, Any], ready: int | None, now: datetime) -> None:
    """A change of the ready worker count while the attempt runs, on record (as seen: a dip shorter
    than the time between two observations is not)."""
    changes = list(entry.get("workerChanges") or [])
    if ready is None or (changes and changes[-1].get("readyWorkers") == ready):
        return
    changes.append({"time": rfc3339(now), "readyWorkers": ready})
    entry["workerChanges"] = changes[-api.MAX_WORKER_CHANGES :]


def _close(
    entry: dict[str, Any],
    end: datetime,
    outcome: str,
    reason: str,
    progress: Mapping[str, Any],
    rates: tuple[float, float],
) -> dict[str, Any]:
    _measure(entry, end, progress, rates)
    entry.update(endTime=rfc3339(end), outcome=outcome, reason=reason)
    return entry


def changed_attempts(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(attempts that started, attempts that ended) between two statuses: one Event each. By start
    time: a resumed job runs its attempt again (KubeRay counts no failure)."""
    was = {a.get("startTime"): a for a in before.get("attempts") or []}
    now = after.get("attempts") or []
    started = [a for a in now if a.get("startTime") not in was]
    ended = [a for a in now if "endTime" in a and "endTime" not in was.get(a.get("startTime"), {})]
    return started, ended
