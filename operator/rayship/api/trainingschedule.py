"""The TrainingSchedule kind: a TrainingJob template run on a cron schedule, with CronJob's fields and
semantics (so users know them), a promotion gate on a metric the runs report, and its CRD entry
(`TRAINING_SCHEDULE`). The time zone list and the placeholders in the template's data are the API's:
the CRD refuses an unknown zone at apply time, `rayship render` and the operator refuse the rest."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rayship.api import cron
from rayship.api.common import (
    INT32_MAX,
    ApiModel,
    CelRule,
    Condition,
    Kind,
    LabelValues,
    ObjectMeta,
    PrinterColumn,
    label_keys_rule,
    name_rule,
)
from rayship.api.trainingjob import PvcStorage, TrainingJobSpec

# A run is named `<schedule>-<scheduled time in minutes since the epoch>` (CronJob's rule): 52
# characters leave 11 for the suffix within a TrainingJob's 63.
MAX_SCHEDULE_NAME = 52

# Five fields (minute hour day-of-month month day-of-week: numbers, names, *, ?, ranges, steps and
# lists) or a macro, as CronJob takes them; values out of range and reversed ranges are refused as a
# CronJob refuses them (api/cron.py) at `rayship render` and by the operator (a condition).
_CRON_ITEM = r"(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?"
_CRON_FIELD = rf"{_CRON_ITEM}(,{_CRON_ITEM})*"
CRON_MACROS = cron.DESCRIPTORS
SCHEDULE_PATTERN = rf"^({_CRON_FIELD}( +{_CRON_FIELD}){{4}}|{'|'.join(CRON_MACROS)})$"

# What a run's data may name: replaced in every string under jobTemplate.spec.data when the run is made.
PLACEHOLDERS = {
    "{{ .ScheduledTime }}": "the run's scheduled time, RFC 3339 in UTC (2026-11-28T05:00:00Z)",
    "{{ .ScheduledDate }}": "its date in the schedule's time zone (2026-11-28)",
}
_PLACEHOLDER = re.compile(r"\{\{[^}]*\}\}")


@cache
def time_zones() -> tuple[str, ...]:
    """The IANA time zone names of the pinned `tzdata` package: the CRD's list and the zones
    `zoneinfo` resolves (from the system's database first, then this package's)."""
    listed = resources.files("tzdata").joinpath("zones").read_text().split()
    return tuple(sorted(listed))


def _zones_rule() -> CelRule:
    zones = ", ".join(f"'{z}'" for z in time_zones())
    return CelRule(
        f"!has(self.timeZone) || self.timeZone in [{zones}]",
        "timeZone must be a time zone name of the IANA tz database, such as Etc/UTC or Europe/Berlin",
    )


class JobTemplateMeta(ApiModel):
    """Labels and annotations every run's TrainingJob gets."""

    cel_rules: ClassVar = (label_keys_rule("labels"), label_keys_rule("annotations"))
    labels: LabelValues = Field(default_factory=dict, description="Labels of each run.")
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Annotations of each run (at most 64)."
    )


class JobTemplate(ApiModel):
    """The TrainingJob each run is made from (as a CronJob's jobTemplate)."""

    metadata: JobTemplateMeta | None = Field(None, description="Labels and annotations of each run.")
    spec: TrainingJobSpec = Field(
        ...,
        description="A TrainingJob's spec. Strings under data may name the run's time: "
        + "; ".join(f"`{k}`: {v}" for k, v in PLACEHOLDERS.items())
        + ".",
    )

    @model_validator(mode="after")
    def _placeholders(self) -> JobTemplate:
        problems = [
            f"jobTemplate.spec.{path}: {found!r} is not a placeholder rayship knows; "
            f"use {' or '.join(PLACEHOLDERS)} (only under data)"
            for path, found in _placeholders_in(self.spec.wire())
            if found not in PLACEHOLDERS or not path.startswith("data.")
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _map_strings(node: Any, change: Callable[[str, str], str], path: str = "") -> Any:
    """`node` (a spec as JSON) with each string `s` at `path` (`data.uri`, `x[0]`) as `change(path, s)`."""
    if isinstance(node, str):
        return change(path, node)
    if isinstance(node, dict):
        return {k: _map_strings(v, change, f"{path}.{k}" if path else k) for k, v in node.items()}
    if isinstance(node, list):
        return [_map_strings(v, change, f"{path}[{i}]") for i, v in enumerate(node)]
    return node


def _placeholders_in(node: Any) -> list[tuple[str, str]]:
    """(path, placeholder) of every `{{ ... }}` in the strings of `node`."""
    found: list[tuple[str, str]] = []

    def collect(path: str, text: str) -> str:
        found.extend((path, m.group(0)) for m in _PLACEHOLDER.finditer(text))
        return text

    _map_strings(node, collect)
    return found


def fill_placeholders(node: Any, values: Mapping[str, str]) -> Any:
    """`node` with each placeholder of `values` (keys of PLACEHOLDERS) replaced by its value."""
    return _map_strings(
        node, lambda _, text: _PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), text)
    )


class PromotionGate(ApiModel):
    """When a succeeded run is promoted (the run a ModelService's `fromTrainingSchedule` serves)."""

    cel_rules: ClassVar = (
        CelRule(
            "!has(self.margin) || self.margin >= 0.0",
            "promote.margin must be at least 0 (how much better than the promoted run)",
        ),
    )
    metric: str = Field(
        ...,
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$",
        description="A metric each run reports in status.progress.metrics (e.g. evalLoss, loss).",
    )
    goal: Literal["minimize", "maximize"] = Field("minimize", description="Which direction is better.")
    threshold: float | None = Field(
        None, description="Promote only a run whose metric is better than this (below it, to minimize)."
    )
    margin: float | None = Field(
        None,
        description="Promote only a run better than the promoted run by more than this (the first run "
        "is judged by threshold alone).",
    )


class TrainingScheduleSpec(ApiModel):
    """A TrainingJob run on a schedule, with CronJob's fields and rules."""

    cel_rules: ClassVar = (
        CelRule(
            "!self.schedule.startsWith('TZ=') && !self.schedule.startsWith('CRON_TZ=')",
            "schedule: a time zone inside the schedule (TZ=, CRON_TZ=) is not supported: set spec.timeZone",
        ),
        _zones_rule(),
    )
    schedule: str = Field(
        ...,
        max_length=256,
        pattern=SCHEDULE_PATTERN,
        description="Cron schedule (minute hour day-of-month month day-of-week, or @hourly, @daily, "
        "@weekly, @monthly, @yearly), in timeZone.",
    )
    time_zone: str | None = Field(
        None,
        max_length=64,
        description="IANA time zone of the schedule (Etc/UTC when unset). Wall-clock times a daylight-"
        "saving change skips do not run; those it repeats run twice (as CronJob's).",
    )
    starting_deadline_seconds: int | None = Field(
        None,
        ge=0,
        le=INT32_MAX,
        description="A run not started within this many seconds of its time is missed (counted, not run).",
    )
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] = Field(
        "Allow",
        description="A run due while an earlier one is active: Allow (both run), Forbid (the new one is "
        "missed) or Replace (the active ones are deleted first).",
    )
    max_active: int = Field(
        3,
        ge=1,
        le=100,
        description="With concurrencyPolicy Allow, at most this many runs at once (each a whole Ray "
        "cluster): a run due beyond it waits, as under Forbid, until one ends (status reason TooManyActive).",
    )
    suspend: bool = Field(False, description="No new runs while true (active runs go on).")
    successful_jobs_history_limit: int = Field(
        3, ge=0, le=100, description="Succeeded runs kept (the promoted run is always kept)."
    )
    failed_jobs_history_limit: int = Field(1, ge=0, le=100, description="Failed runs kept.")
    job_template: JobTemplate = Field(..., description="The TrainingJob each run is made from.")
    promote: PromotionGate | None = Field(
        None, description="The gate a succeeded run passes to be promoted (unset: every succeeded run)."
    )

    @field_validator("schedule")
    @classmethod
    def _parses(cls, value: str) -> str:
        from croniter import croniter  # the operator and the CLI: not the workloads

        refused = cron.problem(value)
        if refused is not None:
            raise ValueError(f"{value!r} is not a schedule a CronJob takes: {refused}")
        if not croniter.is_valid(value):
            raise ValueError(
                f"{value!r} is not a cron schedule: five fields (minute 0-59, hour 0-23, "
                "day of month 1-31, month 1-12, day of week 0-6) or a macro such as @daily"
            )
        return value


class PromotedRun(ApiModel):
    """The run that passed the gate last (the one `fromTrainingSchedule` serves)."""

    job: str = Field(..., description="Its TrainingJob.")
    scheduled_time: str | None = Field(None, description="Its scheduled time (RFC 3339).")
    value: float | None = Field(None, description="Its value of promote.metric.")
    time: str | None = Field(None, description="When it was promoted (RFC 3339).")
    model: str | None = Field(None, description="URI of its exported final model.")
    best_model: str | None = Field(None, description="URI of the exported model of its best checkpoint.")
    volume: PvcStorage | None = Field(None, description="The PVC its models live on, if any.")


class GateResult(ApiModel):
    """The gate's verdict on the latest succeeded run."""

    job: str = Field(..., description="The run judged.")
    scheduled_time: str | None = Field(None, description="Its scheduled time (RFC 3339).")
    passed: bool = Field(..., description="Whether it was promoted.")
    message: str = Field(..., description="Why, with the values compared.")


class TrainingScheduleStatus(ApiModel):
    """Observed state, kept by the operator."""

    active: list[str] = Field(default_factory=list, description="Runs (TrainingJobs) not finished.")
    last_schedule_time: str | None = Field(None, description="The last time a run was made for (RFC 3339).")
    last_successful_time: str | None = Field(None, description="When the last run succeeded (RFC 3339).")
    next_schedule_time: str | None = Field(None, description="The next time a run is due (RFC 3339).")
    latest_succeeded: str | None = Field(None, description="The latest run that succeeded.")
    promoted: PromotedRun | None = Field(None, description="The run promoted last.")
    last_gate: GateResult | None = Field(None, description="The gate's verdict on latestSucceeded.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations.")
    observed_generation: int | None = Field(None, ge=0, description="Generation the status reflects.")


class TrainingSchedule(ApiModel):
    """Retraining on a schedule: a TrainingJob made from jobTemplate at each time of a cron schedule,
    with CronJob's semantics, and a promotion gate ModelServices follow (fromTrainingSchedule)."""

    cel_rules: ClassVar = (
        name_rule(
            MAX_SCHEDULE_NAME, "each run is named <name>-<minutes since 1970>, within a TrainingJob's 63"
        ),
    )
    api_version: Literal["rayship.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["TrainingSchedule"]
    metadata: ObjectMeta
    spec: TrainingScheduleSpec
    status: dict[str, Any] | None = None  # written by the operator; not validated on input


TRAINING_SCHEDULE = Kind(
    model=TrainingSchedule,
    spec_model=TrainingScheduleSpec,
    status_model=TrainingScheduleStatus,
    kind="TrainingSchedule",
    plural="trainingschedules",
    singular="trainingschedule",
    short_names=("ts",),
    columns=(
        PrinterColumn("Schedule", "string", ".spec.schedule", "Cron schedule."),
        PrinterColumn("Time Zone", "string", ".spec.timeZone", "Its time zone.", priority=1),
        PrinterColumn("Suspend", "boolean", ".spec.suspend", "No new runs while true."),
        PrinterColumn("Last Schedule", "date", ".status.lastScheduleTime", "The last run's time."),
        PrinterColumn("Promoted", "string", ".status.promoted.job", "The run promoted last."),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ),
)
