"""The TrainingSchedule API: what the CRD refuses at `kubectl apply` (the field named, as the models
and `rayship render` name it), and what `rayship render` prints for a schedule."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from rayship import api, cli
from rayship.api import names
from rayship.api.validation import SpecError, parse
from tests.conftest import SAMPLES
from tests.unit.bad_corpus import _set

SAMPLE = SAMPLES / "trainingschedule-nightly.yaml"


def sample() -> dict[str, Any]:
    return yaml.safe_load(SAMPLE.read_text())


BAD = [
    ("schedule-six-fields", _set("spec.schedule", "* * * * * *"), "spec.schedule", "cron schedule"),
    ("schedule-tz-inside", _set("spec.schedule", "TZ=UTC 0 3 * * *"), "spec.schedule", "spec.timeZone"),
    ("schedule-every", _set("spec.schedule", "@every 5m"), "spec.schedule", "cron schedule"),
    ("time-zone-unknown", _set("spec.timeZone", "Mars/Olympus_Mons"), "timeZone", "IANA tz database"),
    ("time-zone-abbreviation", _set("spec.timeZone", "PST"), "timeZone", "IANA tz database"),
    ("policy-unknown", _set("spec.concurrencyPolicy", "Queue"), "spec.concurrencyPolicy", "Allow"),
    ("history-negative", _set("spec.successfulJobsHistoryLimit", -1), "spec.successfulJobsHistoryLimit", "0"),
    ("name-too-long", _set("metadata.name", "n" * 53), "metadata.name", "52"),
    ("gate-without-metric", _set("spec.promote", {"threshold": 0.2}), "spec.promote.metric", "missing"),
    ("template-bad-spec", _set("spec.jobTemplate.spec.workers.replicas", 0), "spec.jobTemplate.spec.workers.replicas", ""),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mutate", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_the_crd_and_the_models_refuse_it_naming_the_field(
    case: str, mutate, field: str, words: str, trainingschedule_validator
) -> None:
    doc = sample()
    mutate(doc)
    errors = trainingschedule_validator.errors(doc)
    assert errors, f"{case}: the CRD accepts it"
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert field in str(err.value) and words in str(err.value), f"{case}: {err.value}"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("spec.jobTemplate.spec.data.uri", "s3://b/{{ .RunTime }}/x.parquet"),
        ("spec.jobTemplate.spec.trainer.config.day", "{{ .ScheduledDate }}"),  # filled only under data
    ],
    ids=["unknown-placeholder", "placeholder-outside-data"],
)
def test_a_placeholder_rayship_does_not_fill_is_refused(where: str, value: str) -> None:
    doc = sample()
    _set(where, value)(doc)
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert where.removeprefix("spec.") in str(err.value) and "not a placeholder rayship knows" in str(
        err.value
    )


def test_every_time_zone_of_the_pinned_database_is_accepted(trainingschedule_validator) -> None:
    zones = api.time_zones()
    assert "Europe/Berlin" in zones and "America/New_York" in zones and len(zones) > 400
    for zone in ("Etc/UTC", "Asia/Kolkata", "America/Argentina/Buenos_Aires"):
        doc = sample()
        doc["spec"]["timeZone"] = zone
        assert trainingschedule_validator.errors(doc) == [], zone
        parse(doc)


def test_the_printer_columns_show_the_schedule_its_last_run_and_the_promoted_one() -> None:
    columns = {c.name: c.json_path for c in api.TRAINING_SCHEDULE.columns}
    assert columns["Schedule"] == ".spec.schedule" and columns["Promoted"] == ".status.promoted.job"
    assert columns["Last Schedule"] == ".status.lastScheduleTime"


def test_render_makes_nothing_of_a_schedule_but_says_when_its_next_run_is(capsys) -> None:
    """Applied, a schedule makes no object until a time is due: `rayship render | kubectl apply` must
    not start a run outside it (it printed the next run's TrainingJob and RayJob before)."""
    code = cli.main(["render", "-f", str(SAMPLE)])
    out, err = capsys.readouterr()
    assert (code, out) == (0, ""), err
    assert "TrainingSchedule mlp-nightly makes one TrainingJob per time due, the next at 20" in err
    assert "--next-run prints that run" in err


def test_render_next_run_prints_the_next_run_and_what_it_becomes(capsys) -> None:
    code = cli.main(["render", "-f", str(SAMPLE), "--next-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    run = objects[0]
    assert (
        run["kind"] == "TrainingJob"
        and run["metadata"]["labels"][names.LABEL_TRAININGSCHEDULE] == "mlp-nightly"
    )
    assert "{{" not in run["spec"]["data"]["uri"] and "date=20" in run["spec"]["data"]["uri"]
    assert "RayJob" in [o["kind"] for o in objects] and "below is that run: a preview" in err


# What Kubernetes' CronJob parser (robfig/cron v3) refuses and croniter took, in the parser's words.
# The CRD's pattern cannot say these (numbers, not text): rayship does, at render and in the operator.
CRONJOB_REFUSES = [
    ("0 3 * * 7", "end of range (7) above maximum (6): 7"),
    ("0 3 * * 5-1", "beginning of range (5) beyond end of range (1): 5-1"),
    ("0 3 L * *", 'failed to parse int from L: strconv.Atoi: parsing "L": invalid syntax'),
    ("0 3 * * 5L", 'failed to parse int from 5L: strconv.Atoi: parsing "5L": invalid syntax'),
    ("0 0 0 * *", "beginning of range (0) below minimum (1): 0"),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
]


@pytest.mark.parametrize(("schedule", "words"), CRONJOB_REFUSES, ids=[c[0] for c in CRONJOB_REFUSES])
def test_a_schedule_a_cronjob_refuses_is_refused_in_its_words(schedule: str, words: str) -> None:
    doc = sample()
    doc["spec"]["schedule"] = schedule
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert str(err.value) == f"spec.schedule: {schedule!r} is not a schedule a CronJob takes: {words}"


@pytest.mark.parametrize(
    "schedule", ["0 3 * * MON-FRI", "5/10 * * * ?", "0 0 1 jan,jul *", "*/15 0-6 * * sun", "@weekly"]
)
def test_a_schedule_a_cronjob_takes_is_taken(schedule: str) -> None:
    doc = sample()
    doc["spec"]["schedule"] = schedule
    assert parse(doc).spec.schedule == schedule


def test_render_refuses_a_bad_schedule_in_one_line(tmp_path, capsys) -> None:
    doc = copy.deepcopy(sample())
    doc["spec"]["schedule"] = "0 25 * * *"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = cli.main(["render", "-f", str(path)])
    _, err = capsys.readouterr()
    assert (
        code == 1 and "spec.schedule" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    )
