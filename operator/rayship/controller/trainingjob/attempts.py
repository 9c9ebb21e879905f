"""status.attempts: every attempt of a TrainingJob on record (pure).

KubeRay runs a RayJob's attempts one after the other (backoffLimit), each on a new Ray cluster, and
keeps only the current one's `startTime` (set again at each attempt) and a count of failures. The
operator turns what it sees into a record: an attempt is opened when a new `startTime` appears and
closed when the next one appears, when KubeRay says it failed, or when the job ends. What an attempt
reached comes from the workload's own progress (`status.progress`), frozen when it closes. The record
lives in the TrainingJob's status, so an operator restart loses nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rayship import api
from rayship.controller.conditions import parse_time, rfc3339

MAX_ATTEMPTS_KEPT = 20  # the oldest are dropped; the totals (gpuSeconds, cpuSeconds) cover every one
ATTEMPT_ENDED_REASONS = frozenset({"AttemptEnded", "Retrying"})  # KubeRay: this attempt failed


def attempts(
    current: Mapping[str, Any],
    rayjob_status: Mapping[str, Any],
    phase: str,
    reason: str,
    attempt: int | None,
    rates: tuple[float, float],
    now: datetime,
) -> list[dict[str, Any]] | None:
    """The attempts record after this observation (None: no attempt has started). `rates`: the GPUs
    and CPUs the job's Ray pods request, the seconds of each counted per second of an attempt."""
    kept = [dict(a) for a in current.get("attempts") or [] if isinstance(a, Mapping)]
    start = parse_time(rayjob_status.get("startTime"))
    if start is None or attempt is None:
        return kept or None
    progress = current.get("progress") or {}
    last = kept[-1] if kept else None
    if last is None or parse_time(last.get("startTime")) != start:
        if last is not None and "endTime" not in last:  # its successor began: it ran until then
            said = last.get("reason") or rayjob_status.get("reason") or "Retried"
            _close(last, start, "Failed", str(said), progress, rates)
        # KubeRay counts a failure before it starts the next attempt: `attempt` is this one's number.
        last = {"attempt": attempt, "startTime": rfc3339(start)}
        kept.append(last)
    if "endTime" not in last:
        if phase in api.TERMINAL_PHASES:
            end = parse_time(rayjob_status.get("endTime")) or now
            _close(last, end, phase, reason, progress, rates)
        else:
            _measure(last, start, now, progress, rates)
            if reason in ATTEMPT_ENDED_REASONS:
                # Failed; its cluster goes and the next attempt's comes: counted until the next
                # one starts (as gpuSeconds counts it), and closed then.
                last.update(outcome="Failed", reason=str(rayjob_status.get("reason") or reason))
    return kept[-MAX_ATTEMPTS_KEPT:]


def _measure(
    entry: dict[str, Any],
    start: datetime,
    end: datetime,
    progress: Mapping[str, Any],
    rates: tuple[float, float],
) -> None:
    """An attempt's figures so far: the resources it held and what the workload reported."""
    seconds = max(0, round((end - start).total_seconds()))
    entry["gpuSeconds"], entry["cpuSeconds"] = float(seconds * rates[0]), float(round(seconds * rates[1], 3))
    if progress.get("epoch") is not None:
        entry["reachedEpoch"] = progress["epoch"]
    if progress.get("resumedFromEpoch") is not None:
        entry["resumedFromEpoch"] = progress["resumedFromEpoch"]


def _close(
    entry: dict[str, Any],
    end: datetime,
    outcome: str,
    reason: str,
    progress: Mapping[str, Any],
    rates: tuple[float, float],
) -> None:
    start = parse_time(entry.get("startTime")) or end
    _measure(entry, start, end, progress, rates)
    entry.update(endTime=rfc3339(end), outcome=outcome, reason=reason)


def changed_attempts(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(attempts that started, attempts that ended) between two statuses: one Event each."""
    was = {a.get("attempt"): a for a in before.get("attempts") or []}
    now = after.get("attempts") or []
    started = [a for a in now if a.get("attempt") not in was]
    ended = [a for a in now if "endTime" in a and "endTime" not in was.get(a.get("attempt"), {})]
    return started, ended
