"""A ModelService following a TrainingSchedule (`model.fromTrainingSchedule`): it serves the run the
schedule promoted last, waits while none is, never serves a run that failed the gate, and a newer
promoted run is a new model (the confirmed rollout of any model change)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from rayship import cli
from rayship.api import names
from rayship.api.validation import SpecError, parse
from rayship.config import OperatorConfig
from rayship.controller import modelservice
from tests.conftest import SAMPLES

CONFIG = OperatorConfig(ray_token_key="unit-test-key")
VOLUME = {"claimName": "rayship-checkpoints", "mountPath": "/mnt/checkpoints"}


def service(**source: Any) -> dict[str, Any]:
    doc = yaml.safe_load((SAMPLES / "modelservice-from-trainingjob.yaml").read_text())
    doc["metadata"].update(generation=1, uid="ms-1")
    doc["spec"]["model"] = {"fromTrainingSchedule": {"name": "mlp-nightly", **source}}
    return doc


def schedule(promoted: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((SAMPLES / "trainingschedule-nightly.yaml").read_text())
    if promoted is not None:
        doc["status"] = {"promoted": promoted}
    return doc


def promoted(job: str = "mlp-nightly-29931960", model: str = "/mnt/checkpoints/default.run1/model") -> dict:
    return {
        "job": job,
        "value": 0.1,
        "model": model,
        "bestModel": model.replace("model", "best"),
        "volume": VOLUME,
    }


@pytest.mark.parametrize(
    ("ts", "served", "uri", "reason"),
    [
        (None, None, None, "TrainingScheduleNotFound"),
        (schedule(), None, None, "NothingPromoted"),
        (schedule(), "/m/old", "/m/old", "NothingPromoted"),  # switched to the schedule: keeps serving
        (schedule(promoted()), None, "/mnt/checkpoints/default.run1/model", "FromTrainingSchedule"),
        (None, "/m/old", "/m/old", "TrainingScheduleDeleted"),
        (schedule({"job": "run1", "value": 0.1}), None, None, "NoExportedModel"),
    ],
    ids=[
        "schedule-missing",
        "nothing-promoted",
        "nothing-promoted-keeps-serving",
        "promoted",
        "deleted-keeps-serving",
        "no-model",
    ],
)
def test_the_promoted_run_is_resolved(ts, served, uri, reason) -> None:
    found = modelservice.resolve_model(parse(service()), ts, {"modelURI": served} if served else {})
    assert (found.uri, found.reason) == (uri, reason)
    assert "TrainingSchedule mlp-nightly" in found.message
    if uri and reason == "FromTrainingSchedule":
        assert found.volume is not None and found.volume.claim_name == "rayship-checkpoints"


def test_best_takes_the_promoted_runs_best_model() -> None:
    found = modelservice.resolve_model(parse(service(checkpoint="best")), schedule(promoted()), {})
    assert found.uri == "/mnt/checkpoints/default.run1/best"


def test_the_plan_serves_the_promoted_run_and_a_newer_one_is_a_new_model() -> None:
    ms = service()
    first = modelservice.plan(ms, None, [schedule(promoted())], CONFIG)
    assert first.create is not None
    assert (
        first.create["metadata"]["annotations"][names.ANNOTATION_MODEL]
        == "/mnt/checkpoints/default.run1/model"
    )
    mounts = first.create["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert any(
        (v.get("persistentVolumeClaim") or {}).get("claimName") == "rayship-checkpoints" for v in mounts
    )
    stored = copy.deepcopy(first.create)
    stored["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "rayship.dev/v1alpha1",
            "kind": "ModelService",
            "name": "mlp",
            "uid": "ms-1",
            "controller": True,
        }
    ]
    newer = schedule(promoted("mlp-nightly-29933400", "/mnt/checkpoints/default.run2/model"))
    second = modelservice.plan(ms, stored, [newer], CONFIG)
    assert second.create is None and second.patch is not None  # serveConfigV2 only: a model rollout
    assert "/mnt/checkpoints/default.run2/model" in str(second.patch)


def test_a_service_names_the_schedules_it_follows() -> None:
    assert modelservice.referenced_schedules(service()) == ["mlp-nightly"]
    assert modelservice.referenced_trainingjobs(service()) == []


def test_exactly_one_source() -> None:
    doc = service()
    doc["spec"]["model"]["uri"] = "s3://m/x"
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert "exactly one of fromTrainingJob, fromTrainingSchedule or uri" in str(err.value)


def test_render_shows_a_stand_in_and_says_so(tmp_path, capsys) -> None:
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(service()))
    assert cli.main(["render", "-f", str(path)]) == 0
    out, err = capsys.readouterr()
    assert (
        "trainingschedule://default/mlp-nightly/latest" in out and "fromTrainingSchedule is resolved" in err
    )
