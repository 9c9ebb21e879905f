"""TrainingSchedule: when runs are due (`cron`), whether a run is promoted (`gate`), and the plan of a
reconcile (`planner`). Pure: no I/O, no clock (the time comes in)."""

from __future__ import annotations

from rayship.controller.trainingschedule.cron import TOO_MANY_MISSED, Due, due, next_after
from rayship.controller.trainingschedule.gate import Verdict, judge
from rayship.controller.trainingschedule.planner import (
    CONDITION,
    FINISHED,
    Run,
    SchedulePlan,
    build_run,
    plan,
    runs_of,
)

__all__ = [
    "TOO_MANY_MISSED",
    "Due",
    "due",
    "next_after",
    "Verdict",
    "judge",
    "CONDITION",
    "FINISHED",
    "Run",
    "SchedulePlan",
    "build_run",
    "plan",
    "runs_of",
]
