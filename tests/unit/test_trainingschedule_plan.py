"""A TrainingSchedule's plan: CronJob's rules (one run per due time, concurrencyPolicy, suspend,
startingDeadlineSeconds, history limits) and the promotion gate, from the objects as stored."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from rayship.api import names
from rayship.controller.trainingschedule import build_run, plan
from rayship.controller.trainingschedule.planner import CONDITION
from tests.conftest import SAMPLES

CREATED = "2026-11-27T00:00:00Z"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def schedule(status: dict | None = None, **spec: Any) -> dict:
    doc = yaml.safe_load((SAMPLES / "trainingschedule-nightly.yaml").read_text())
    doc["metadata"].update(generation=1, uid="ts-1", creationTimestamp=CREATED)
    doc["spec"].update(schedule="0 * * * *", timeZone="Etc/UTC", concurrencyPolicy="Allow")
    doc["spec"].pop("startingDeadlineSeconds")
    doc["spec"].update(spec)
    if status is not None:
        doc["status"] = status
    return doc


def run(due: datetime, phase: str | None = "Running", **status: Any) -> dict:
    """The stored run of `schedule()` due at `due`."""
    body = copy.deepcopy(build_run_of(schedule(), due))
    body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
    body["status"] = {"phase": phase, **status} if phase else status
    return body


def build_run_of(ts: dict, due: datetime) -> dict:
    from rayship.api.validation import parse

    return build_run(parse(ts), ts, due)  # type: ignore[arg-type]


def done(due: datetime, phase: str, loss: float | None = None, finished: datetime | None = None) -> dict:
    metrics = {"evalLoss": loss} if loss is not None else {}
    return run(
        due,
        phase,
        progress={"metrics": metrics},
        checkpoint={
            "model": f"/mnt/checkpoints/{due:%H%M}/model",
            "bestModel": f"/mnt/checkpoints/{due:%H%M}/best",
        },
        completionTime=(finished or due.replace(minute=30)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def after(ts: dict, todo) -> dict:
    """The schedule with the plan's status written."""
    return {**ts, "status": {k: v for k, v in todo.status.items() if v is not None}}


def reasons(todo) -> list[str]:
    return [e.reason for e in todo.events]


def test_nothing_is_made_before_the_first_time_due_and_the_next_time_is_said() -> None:
    todo = plan(schedule(), [], utc(2026, 11, 27, 0, 20))
    assert todo.create is None and todo.delete == ()
    assert todo.status["nextScheduleTime"] == "2026-11-27T01:00:00Z" and todo.wake_at == utc(2026, 11, 27, 1)
    (cond,) = todo.status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "True", "Scheduled")


def test_a_due_time_makes_one_run_from_the_template_owned_and_named_by_its_time() -> None:
    todo = plan(schedule(), [], utc(2026, 11, 27, 1, 0, 4))
    run_name = f"mlp-nightly-{int(utc(2026, 11, 27, 1).timestamp()) // 60}"
    meta, spec = todo.create["metadata"], todo.create["spec"]
    assert meta["name"] == run_name and todo.create["kind"] == "TrainingJob"
    assert meta["labels"] == {"team": "ranking", names.LABEL_TRAININGSCHEDULE: "mlp-nightly"}
    assert meta["annotations"][names.ANNOTATION_SCHEDULED_TIME] == "2026-11-27T01:00:00Z"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingSchedule", "ts-1", True)
    assert spec["data"]["uri"] == "s3://ml-data/clicks/date=2026-11-27/train.parquet"  # the placeholder
    assert spec["trainer"]["epochs"] == 5 and spec["workers"]["replicas"] == 2
    assert todo.status["lastScheduleTime"] == "2026-11-27T01:00:00Z" and todo.status["active"] == [run_name]
    assert reasons(todo) == ["RunCreated"]
    # written, the same moment plans nothing more; the run made once is recorded, not made again
    assert (
        plan(after(schedule(), todo), [run(utc(2026, 11, 27, 1))], utc(2026, 11, 27, 1, 0, 9)).create is None
    )
    lost = plan(schedule(), [run(utc(2026, 11, 27, 1))], utc(2026, 11, 27, 1, 0, 9))
    assert lost.create is None and lost.status["lastScheduleTime"] == "2026-11-27T01:00:00Z"


def test_the_scheduled_date_is_the_schedules_own_day() -> None:
    ts = schedule(timeZone="Asia/Tokyo")  # 2026-11-27T16:00Z is 01:00 on the 28th in Tokyo
    assert build_run_of(ts, utc(2026, 11, 27, 16))["spec"]["data"]["uri"].endswith(
        "date=2026-11-28/train.parquet"
    )


def test_the_operator_down_for_hours_makes_one_catch_up_run_and_says_how_many_were_missed() -> None:
    ts = schedule({"lastScheduleTime": "2026-11-27T01:00:00Z"})
    todo = plan(ts, [], utc(2026, 11, 27, 6, 12))
    assert todo.create["metadata"]["annotations"][names.ANNOTATION_SCHEDULED_TIME] == "2026-11-27T06:00:00Z"
    assert "4 earlier time(s) missed" in todo.events[0].message


def test_forbid_waits_for_the_active_run_then_runs_the_time_it_missed() -> None:
    ts = schedule({"lastScheduleTime": "2026-11-27T01:00:00Z"}, concurrencyPolicy="Forbid")
    busy = plan(ts, [run(utc(2026, 11, 27, 1))], utc(2026, 11, 27, 2, 0, 5))
    assert busy.create is None and busy.status["lastScheduleTime"] == "2026-11-27T01:00:00Z"
    assert busy.status["conditions"][0]["reason"] == "Forbidden" and reasons(busy) == ["Forbidden"]
    # said once, not at every reconcile
    assert reasons(plan(after(ts, busy), [run(utc(2026, 11, 27, 1))], utc(2026, 11, 27, 2, 0, 30))) == []
    freed = plan(after(ts, busy), [done(utc(2026, 11, 27, 1), "Succeeded", 0.1)], utc(2026, 11, 27, 2, 40))
    assert freed.create["metadata"]["annotations"][names.ANNOTATION_SCHEDULED_TIME] == "2026-11-27T02:00:00Z"


def test_allow_starts_no_more_than_max_active_runs_and_the_next_waits_its_turn() -> None:
    """`* * * * *` with Allow started a whole Ray cluster every minute while the earlier runs waited for
    GPUs: beyond maxActive (default 3) a due run waits, as under Forbid, and runs when one ends."""
    ts = schedule({"lastScheduleTime": "2026-11-27T03:00:00Z"})
    assert ts["spec"].get("maxActive") is None  # the default holds
    three = [run(utc(2026, 11, 27, h)) for h in (1, 2, 3)]
    full = plan(ts, three, utc(2026, 11, 27, 4, 0, 5))
    assert full.create is None and full.status["lastScheduleTime"] == "2026-11-27T03:00:00Z"
    cond = full.status["conditions"][0]
    assert (
        cond["reason"] == "TooManyActive" and cond["status"] == "True" and reasons(full) == ["TooManyActive"]
    )
    assert "3 runs active, maxActive is 3" in cond["message"]
    one_done = [*three[1:], done(utc(2026, 11, 27, 1), "Succeeded", 0.1)]
    freed = plan(after(ts, full), one_done, utc(2026, 11, 27, 4, 20))
    assert freed.create["metadata"]["annotations"][names.ANNOTATION_SCHEDULED_TIME] == "2026-11-27T04:00:00Z"
    assert plan(schedule(ts["status"], maxActive=4), three, utc(2026, 11, 27, 4, 0, 5)).create is not None


def test_forbid_with_a_starting_deadline_misses_a_time_that_waited_too_long() -> None:
    ts = schedule(
        {"lastScheduleTime": "2026-11-27T01:00:00Z"}, concurrencyPolicy="Forbid", startingDeadlineSeconds=600
    )
    todo = plan(ts, [done(utc(2026, 11, 27, 1), "Succeeded", 0.1)], utc(2026, 11, 27, 2, 40))
    assert todo.create is None and todo.status["conditions"][0]["reason"] == "MissedSchedule"
    assert "2026-11-27T02:00:00Z" in todo.status["conditions"][0]["message"]
    # the next time runs as usual
    assert plan(after(ts, todo), [], utc(2026, 11, 27, 3, 0, 5)).create is not None


def test_replace_deletes_the_active_run_and_allow_keeps_it() -> None:
    active = [run(utc(2026, 11, 27, 1))]
    status = {"lastScheduleTime": "2026-11-27T01:00:00Z"}
    replaced = plan(schedule(status, concurrencyPolicy="Replace"), active, utc(2026, 11, 27, 2, 0, 5))
    assert [r.name for r in replaced.delete] == [
        active[0]["metadata"]["name"]
    ] and replaced.create is not None
    assert reasons(replaced) == ["RunsReplaced", "RunCreated"] and len(replaced.status["active"]) == 1
    allowed = plan(schedule(status), active, utc(2026, 11, 27, 2, 0, 5))
    assert allowed.delete == () and allowed.create is not None and len(allowed.status["active"]) == 2


def test_suspended_makes_nothing_and_resumed_runs_the_latest_missed_time_at_once() -> None:
    status = {"lastScheduleTime": "2026-11-27T01:00:00Z"}
    suspended = plan(schedule(status, suspend=True), [], utc(2026, 11, 27, 5, 30))
    assert suspended.create is None and suspended.status["nextScheduleTime"] is None
    assert suspended.status["conditions"][0]["reason"] == "Suspended" and reasons(suspended) == ["Suspended"]
    resumed = plan(schedule(status), [], utc(2026, 11, 27, 5, 30))  # CronJob: missed jobs run at once
    assert (
        resumed.create["metadata"]["annotations"][names.ANNOTATION_SCHEDULED_TIME] == "2026-11-27T05:00:00Z"
    )
    late = plan(schedule(status, startingDeadlineSeconds=60), [], utc(2026, 11, 27, 5, 30))
    assert late.create is None  # with a deadline, only times within it


def test_history_limits_delete_the_oldest_finished_runs_but_never_the_promoted_one() -> None:
    runs = [done(utc(2026, 11, 27, h), "Succeeded", 0.1) for h in (1, 2, 3, 4, 5)]
    runs += [done(utc(2026, 11, 27, h), "Failed") for h in (6, 7)] + [run(utc(2026, 11, 27, 8))]
    first = runs[0]["metadata"]["name"]
    status = {
        "lastScheduleTime": "2026-11-27T08:00:00Z",
        "latestSucceeded": runs[4]["metadata"]["name"],
        "lastGate": {
            "job": runs[4]["metadata"]["name"],
            "scheduledTime": "2026-11-27T05:00:00Z",
            "passed": False,
            "message": "m",
        },
        "promoted": {"job": first, "value": 0.1},
    }
    todo = plan(schedule(status), runs, utc(2026, 11, 27, 8, 10))
    deleted = {r.name for r in todo.delete}
    names_ = [r["metadata"]["name"] for r in runs]
    # 3 succeeded kept besides the promoted one; 1 failed kept; the active run untouched
    assert deleted == {names_[1], names_[5]}
    assert reasons(todo) == ["RunDeleted", "RunDeleted"]


def test_the_gate_promotes_a_run_below_the_threshold_with_its_model_and_volume() -> None:
    first = done(utc(2026, 11, 27, 1), "Succeeded", 0.15)
    todo = plan(schedule({"lastScheduleTime": "2026-11-27T01:00:00Z"}), [first], utc(2026, 11, 27, 1, 40))
    promoted = todo.status["promoted"]
    assert promoted["job"] == first["metadata"]["name"] and promoted["value"] == 0.15
    assert (
        promoted["model"] == "/mnt/checkpoints/0100/model"
        and promoted["bestModel"] == "/mnt/checkpoints/0100/best"
    )
    assert promoted["volume"] == {"claimName": "rayship-checkpoints", "mountPath": "/mnt/checkpoints"}
    assert todo.status["lastGate"]["passed"] is True and reasons(todo) == ["Promoted"]
    # judged once
    again = plan(after(schedule(), todo), [first], utc(2026, 11, 27, 1, 50))
    assert reasons(again) == [] and again.status["promoted"] == promoted


@pytest.mark.parametrize(
    ("loss", "margin", "passed", "words"),
    [
        (0.25, None, False, "is not below the threshold 0.2"),
        (0.12, 0.01, False, "does not beat the promoted run"),
        (0.08, 0.01, True, "passed the gate"),
        (None, None, False, "reported no evalLoss"),
    ],
    ids=["above-threshold", "within-margin", "beats-by-margin", "metric-missing"],
)
def test_the_gate_against_threshold_and_the_promoted_run(loss, margin, passed, words) -> None:
    earlier, later = (
        done(utc(2026, 11, 27, 1), "Succeeded", 0.1),
        done(utc(2026, 11, 27, 2), "Succeeded", loss),
    )
    promoted = {"job": earlier["metadata"]["name"], "value": 0.1}
    gate = {
        "job": earlier["metadata"]["name"],
        "scheduledTime": "2026-11-27T01:00:00Z",
        "passed": True,
        "message": "m",
    }
    status = {"lastScheduleTime": "2026-11-27T02:00:00Z", "lastGate": gate, "promoted": promoted}
    spec_promote = {
        "metric": "evalLoss",
        "threshold": 0.2,
        **({"margin": margin} if margin is not None else {}),
    }
    todo = plan(schedule(status, promote=spec_promote), [earlier, later], utc(2026, 11, 27, 2, 40))
    gate = todo.status["lastGate"]
    assert gate["job"] == later["metadata"]["name"] and gate["passed"] is passed and words in gate["message"]
    assert (todo.status["promoted"]["job"] == later["metadata"]["name"]) is passed
    assert reasons(todo) == ["Promoted" if passed else "NotPromoted"]


def test_a_judged_run_the_history_limit_deleted_does_not_get_an_older_run_judged_again() -> None:
    # seen in the operator tier: the second run failed the gate and, beyond successfulJobsHistoryLimit 0,
    # was deleted; the next reconcile found the promoted first run the newest and judged it again
    ts = schedule({"lastScheduleTime": "2026-11-27T02:00:00Z"}, successfulJobsHistoryLimit=0)
    first, second = done(utc(2026, 11, 27, 1), "Succeeded", 0.1), done(utc(2026, 11, 27, 2), "Succeeded", 0.5)
    judged_first = plan(ts, [first], utc(2026, 11, 27, 1, 40))
    judged_second = plan(after(ts, judged_first), [first, second], utc(2026, 11, 27, 2, 40))
    assert [r.name for r in judged_second.delete] == [second["metadata"]["name"]]
    assert judged_second.status["lastGate"]["job"] == second["metadata"]["name"]
    later = plan(after(ts, judged_second), [first], utc(2026, 11, 27, 2, 41))
    assert later.status["lastGate"] == judged_second.status["lastGate"] and reasons(later) == []
    assert later.status["latestSucceeded"] == second["metadata"]["name"]
    assert later.status["promoted"]["job"] == first["metadata"]["name"]


def test_without_a_gate_every_succeeded_run_is_promoted() -> None:
    ts = schedule({"lastScheduleTime": "2026-11-27T01:00:00Z"})
    ts["spec"].pop("promote")
    todo = plan(ts, [done(utc(2026, 11, 27, 1), "Succeeded")], utc(2026, 11, 27, 1, 40))
    assert (
        todo.status["promoted"]["job"].startswith("mlp-nightly-") and todo.status["promoted"]["value"] is None
    )


def test_a_spec_the_operator_cannot_read_makes_no_run_and_says_which_field() -> None:
    todo = plan(schedule(schedule="61 * * * *"), [], utc(2026, 11, 27, 5))
    assert todo.create is None
    cond = todo.status["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec") and "spec.schedule" in cond["message"]
    assert [(e.type, e.reason) for e in todo.events] == [("Warning", "InvalidSpec")]


def test_a_schedule_never_due_says_so() -> None:
    todo = plan(schedule(schedule="0 0 30 2 *"), [], utc(2026, 11, 27, 5))
    assert todo.create is None and todo.status["conditions"][0]["reason"] == "NeverDue"
