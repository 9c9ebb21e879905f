"""The promotion gate of a TrainingSchedule, pure: whether a succeeded run is better than its
threshold and than the promoted run by more than its margin, said with the values compared."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rayship import api


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str
    value: float | None  # the run's value of the gate's metric


def judge(
    gate: api.PromotionGate | None, run: str, metrics: Mapping[str, Any], promoted: Mapping[str, Any] | None
) -> Verdict:
    """The verdict on `run` (its status.progress.metrics) against `promoted` (status.promoted, if any)."""
    if gate is None:
        return Verdict(True, f"{run} succeeded (no spec.promote gate: every succeeded run is promoted)", None)
    value = metrics.get(gate.metric)
    if not isinstance(value, int | float) or isinstance(value, bool):
        reported = ", ".join(sorted(metrics)) or "none"
        return Verdict(False, f"{run} reported no {gate.metric} (its metrics: {reported})", None)
    value = float(value)
    minimize = gate.goal == "minimize"

    def better(a: float, b: float) -> bool:
        return a < b if minimize else a > b

    if gate.threshold is not None and not better(value, gate.threshold):
        side = "below" if minimize else "above"
        return Verdict(
            False, f"{run}: {gate.metric} {value:g} is not {side} the threshold {gate.threshold:g}", value
        )
    if gate.margin is not None and promoted and isinstance(promoted.get("value"), int | float):
        current = float(promoted["value"])
        target = current - gate.margin if minimize else current + gate.margin
        if not better(value, target):
            return Verdict(
                False,
                f"{run}: {gate.metric} {value:g} does not beat the promoted run {promoted.get('job')}'s "
                f"{current:g} by more than {gate.margin:g}",
                value,
            )
    return Verdict(True, f"{run}: {gate.metric} {value:g} passed the gate", value)
