"""The planner: create once, apply what KubeRay can apply, report the rest, never restart a finished job."""

from __future__ import annotations

import copy
import json

import yaml

from rayship import names
from rayship.config import OperatorConfig
from rayship.trainingjob import build_rayjob, plan, spec_edits
from rayship.validation import parse_trainingjob
from tests.conftest import SAMPLES

CONFIG = OperatorConfig()


def trainingjob(**status) -> dict:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["metadata"].update(generation=1, uid="u-1", resourceVersion="7")
    if status:
        doc["status"] = status
    return doc


def launched(doc: dict) -> dict:
    return build_rayjob(parse_trainingjob(doc), CONFIG)


def test_creates_the_rayjob_when_absent() -> None:
    todo = plan(trainingjob(), None, None, CONFIG)
    assert todo.create == launched(trainingjob()) and todo.patch is None
    assert todo.context.gpus == 2 and todo.context.invalid is None


def test_idempotent_when_rayjob_matches() -> None:
    doc = trainingjob()
    todo = plan(doc, launched(doc), None, CONFIG)
    assert todo.create is None and todo.patch is None and todo.context.unapplied == ()


def test_never_restarts_a_finished_job() -> None:
    assert plan(trainingjob(phase="Succeeded"), None, None, CONFIG).create is None
    assert plan(trainingjob(phase="Failed"), None, None, CONFIG).create is None
    assert plan(trainingjob(phase="Running"), None, None, CONFIG).create is not None


def test_suspend_is_applied_to_the_live_rayjob() -> None:
    doc = trainingjob()
    rayjob = launched(doc)
    edited = copy.deepcopy(doc)
    edited["spec"]["suspend"] = True
    todo = plan(edited, rayjob, None, CONFIG)
    assert todo.patch["spec"] == {"suspend": True}
    recorded = json.loads(todo.patch["metadata"]["annotations"][names.ANNOTATION_SPEC])
    assert recorded["suspend"] is True and todo.context.unapplied == ()


def test_other_edits_are_reported_not_applied() -> None:
    doc = trainingjob()
    rayjob = launched(doc)
    edited = copy.deepcopy(doc)
    edited["spec"]["trainer"]["epochs"] = 50
    edited["spec"]["workers"]["replicas"] = 8
    edited["spec"]["suspend"] = True
    todo = plan(edited, rayjob, None, CONFIG)
    assert todo.patch["spec"] == {"suspend": True}
    assert todo.context.unapplied == ("trainer.epochs", "workers.replicas")


def test_invalid_spec_is_not_rendered() -> None:
    doc = trainingjob()
    doc["spec"]["trainer"]["entrypoint"] = "a.b:c"
    todo = plan(doc, None, None, CONFIG)
    assert todo.create is None and "spec.trainer" in todo.context.invalid


def test_foreign_rayjob_is_reported_never_overwritten() -> None:
    foreign = {"metadata": {"name": "mlp-ddp"}, "spec": {}}
    todo = plan(trainingjob(), foreign, None, CONFIG)
    assert todo.create is None and todo.patch is None and todo.context.unapplied


def test_spec_edits_paths() -> None:
    assert spec_edits({"a": {"b": 1, "c": [1]}}, {"a": {"b": 2, "c": [1]}, "d": 1}) == ["a.b", "d"]
    assert spec_edits({"a": 1}, {"a": 1}) == []
