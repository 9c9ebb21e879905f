"""The planner: create once, apply what KubeRay can apply, report the rest, never restart a finished job."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import yaml

from rayship import api
from rayship.api import names
from rayship.api.validation import SpecError, parse_trainingjob
from rayship.config import OperatorConfig
from rayship.controller.trainingjob import build_rayjob, plan, spec_edits
from tests.conftest import SAMPLES

CONFIG = OperatorConfig()


def trainingjob(**status) -> dict:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["metadata"].update(generation=1, uid="u-1", resourceVersion="7")
    if status:
        doc["status"] = status
    return doc


def owner_ref(uid: str = "u-1", name: str = "mlp-ddp", kind: str = "TrainingJob") -> dict:
    return {"apiVersion": "rayship.dev/v1alpha1", "kind": kind, "name": name, "uid": uid, "controller": True}


def launched(doc: dict, owner: dict | None = None) -> dict:
    """The RayJob as stored: rendered, then adopted (kopf.adopt) by its TrainingJob."""
    rayjob = build_rayjob(parse_trainingjob(doc), CONFIG)
    rayjob["metadata"]["ownerReferences"] = [owner or owner_ref()]
    rayjob["metadata"]["uid"] = "rj-1"
    return rayjob


def test_creates_the_rayjob_when_absent() -> None:
    todo = plan(trainingjob(), None, None, CONFIG)
    assert todo.create == build_rayjob(parse_trainingjob(trainingjob()), CONFIG) and todo.patch is None
    assert todo.context.gpus == 2 and todo.context.invalid is None


def test_the_creation_of_a_suspended_rayjob_says_so_in_its_one_event() -> None:
    """The phase a job created suspended starts in gets no Event of its own: the creation's says it."""
    assert plan(trainingjob(), None, None, CONFIG).on_create.message == "created RayJob mlp-ddp"
    suspended = trainingjob()
    suspended["spec"]["suspend"] = True
    said = plan(suspended, None, None, CONFIG).on_create.message
    assert said == "created RayJob mlp-ddp, suspended: no Ray cluster runs until spec.suspend is false"


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


def test_a_rayjob_recorded_before_every_string_was_digested_reads_unedited() -> None:
    """The applied-spec annotation once held the spec as written (only env values digested): a RayJob
    launched then is not reported as edited everywhere after the upgrade, and a real edit still is."""
    doc = trainingjob()
    doc["spec"]["env"] = [{"name": "MODE", "value": "fast"}]
    doc["spec"]["trainer"]["config"] = {"note": "private-value"}
    rayjob = launched(doc)
    old_record = parse_trainingjob(doc).spec.wire()
    old_record["env"] = [{"name": "MODE", "value": "sha256:" + hashlib.sha256(b"fast").hexdigest()[:16]}]
    rayjob["metadata"]["annotations"][names.ANNOTATION_SPEC] = json.dumps(old_record)
    assert "private-value" not in json.dumps(launched(doc)["metadata"])  # today's record: digests only
    assert plan(doc, rayjob, None, CONFIG).context.unapplied == ()
    doc["spec"]["trainer"]["config"] = {"note": "another"}
    assert plan(doc, rayjob, None, CONFIG).context.unapplied == ("trainer.config.note",)


def test_a_field_added_to_the_api_since_the_launch_is_no_edit_at_its_default() -> None:
    """A RayJob launched by an operator before `workers.terminationGracePeriodSeconds` existed (its
    record lacks it) reads unedited after the upgrade; the field set to another value is an edit."""
    doc = trainingjob()
    rayjob = launched(doc)
    record = json.loads(rayjob["metadata"]["annotations"][names.ANNOTATION_SPEC])
    del record["workers"]["terminationGracePeriodSeconds"]
    rayjob["metadata"]["annotations"][names.ANNOTATION_SPEC] = json.dumps(record)
    assert plan(doc, rayjob, None, CONFIG).context.unapplied == ()
    doc["spec"]["workers"]["terminationGracePeriodSeconds"] = 120
    assert plan(doc, rayjob, None, CONFIG).context.unapplied == ("workers.terminationGracePeriodSeconds",)
    del record["workers"]  # a whole section missing is still an edit: not a field added since
    rayjob["metadata"]["annotations"][names.ANNOTATION_SPEC] = json.dumps(record)
    assert plan(doc, rayjob, None, CONFIG).context.unapplied == ("workers",)


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
    """A spec the API server admits but rayship cannot run (too big for the RayJob) is not rendered."""
    doc = trainingjob()
    doc["spec"]["trainer"]["config"] = {"notes": "x" * api.MAX_SPEC_BYTES}
    todo = plan(doc, None, None, CONFIG)
    assert todo.create is None and "bytes serialized" in todo.context.invalid


def test_plan_evaluates_only_the_cel_rules_the_api_server_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan() gets objects the API server admitted, having evaluated the CRD's CEL rules: it evaluates
    only the rules that are not in the CRD. The CLI evaluates them all."""
    models = [m for m in vars(api).values() if isinstance(m, type) and issubclass(m, api.ApiModel)]
    not_in_crd = {r.rule for m in models for r in m.cel_rules if not r.in_crd}
    tuning = yaml.safe_load((SAMPLES / "trainingjob-tuning.yaml").read_text())
    tuning["metadata"].update(generation=1, uid="u-1", resourceVersion="7")
    for doc in (trainingjob(), tuning):
        parse_trainingjob(doc)  # defaults of nested objects are validated (every rule) once, here
    evaluated: list[str] = []
    real = api.cel_holds
    # every model's validator calls the one in the module that defines ApiModel
    monkeypatch.setattr(
        api.common, "cel_holds", lambda rule, value: evaluated.append(rule) or real(rule, value)
    )
    for doc in (trainingjob(), tuning):
        assert plan(doc, None, None, CONFIG).create is not None
    assert evaluated and set(evaluated) <= not_in_crd
    evaluated.clear()
    parse_trainingjob(tuning)
    assert len(set(evaluated) - not_in_crd) > 10
    doc = trainingjob()
    doc["spec"]["trainer"]["entrypoint"] = "a.b:c"  # a CRD rule: recipe or entrypoint, not both
    with pytest.raises(SpecError, match="spec.trainer"):
        parse_trainingjob(doc)


def test_foreign_rayjob_is_reported_never_overwritten() -> None:
    for foreign in (
        {"metadata": {"name": "mlp-ddp"}, "spec": {}},  # no owner
        launched(trainingjob(), owner_ref(uid="x", name="deployer", kind="Deployment")),
    ):
        todo = plan(trainingjob(), foreign, None, CONFIG)
        assert todo.create is None and todo.patch is None
        assert todo.context.blocked[0] == "RayJobNameTaken" and "not owned" in todo.context.blocked[1]


def test_rayjob_of_a_deleted_namesake_is_waited_for_never_adopted() -> None:
    """A TrainingJob deleted and re-created with the same name: the old RayJob (owner UID differs,
    still finalizing) is neither adopted nor mirrored."""
    old = launched(trainingjob(), owner_ref(uid="u-0"))
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    old["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    todo = plan(trainingjob(), old, None, CONFIG)
    assert todo.create is None and todo.context.blocked[0] == "PreviousRayJobTerminating"


def test_a_launched_rayjob_that_is_gone_is_lost_never_recreated() -> None:
    todo = plan(trainingjob(phase="Running", rayJobUID="rj-1"), None, None, CONFIG)
    assert todo.create is None and todo.context.lost == "rj-1"


def test_a_spec_the_api_server_refused_is_not_retried_until_edited() -> None:
    refused = trainingjob(phase="Invalid", observedGeneration=1)
    assert plan(refused, None, None, CONFIG).create is None and plan(refused, None, None, CONFIG).context.keep
    refused["metadata"]["generation"] = 2
    assert plan(refused, None, None, CONFIG).create is not None


def test_spec_edits_paths() -> None:
    assert spec_edits({"a": {"b": 1, "c": [1]}}, {"a": {"b": 2, "c": [1]}, "d": 1}) == ["a.b", "d"]
    assert spec_edits({"a": 1}, {"a": 1}) == []


def test_kueue_owns_suspend_of_a_queued_job() -> None:
    doc = trainingjob()
    doc["spec"]["scheduling"] = {"queue": "team-a"}
    rayjob = launched(doc)
    edited = copy.deepcopy(doc)
    edited["spec"]["suspend"] = True
    todo = plan(edited, rayjob, None, CONFIG)
    assert todo.patch is None and todo.context.unapplied == ("suspend",)


def test_a_job_past_its_startup_deadline_frees_its_cluster_at_once_and_says_what_it_was_stuck_on() -> None:
    """spec.startupDeadlineSeconds is KubeRay's preRunningDeadlineSeconds; once KubeRay fails the
    RayJob for it (no retry left), its cluster is deleted now, not after ttlSecondsAfterFinished, and
    the status names the deadline and what the last status said the job was stuck on."""
    from datetime import UTC, datetime

    from rayship.controller.trainingjob import status as derive_status

    doc = trainingjob()
    doc["spec"]["startupDeadlineSeconds"] = 300
    rayjob = launched(doc)
    assert rayjob["spec"]["preRunningDeadlineSeconds"] == 300
    assert "preRunningDeadlineSeconds" not in launched(trainingjob())["spec"]  # not set: no deadline
    stuck = "the Ray cluster is starting: pod mlp-ddp-w-0, container ray-worker: ImagePullBackOff"
    running = {"type": "Running", "status": "False", "reason": "ImagePullBackOff", "message": stuck}
    doc["status"] = {"phase": "Pending", "conditions": [running]}
    rayjob["status"] = {
        "jobDeploymentStatus": "Retrying",
        "reason": "PreRunningDeadlineExceeded",
        "failed": 1,
    }
    assert plan(doc, rayjob, None, CONFIG).patch is None  # KubeRay retries on a new cluster itself

    rayjob["status"].update(
        jobDeploymentStatus="Failed", failed=3, message="passed the preRunningDeadlineSeconds"
    )
    todo = plan(doc, rayjob, None, CONFIG)
    assert todo.patch == {"spec": {"ttlSecondsAfterFinished": 0}}
    assert todo.on_patch is not None and todo.on_patch.reason == "StartupDeadlineExceeded"
    st = derive_status(doc, rayjob, todo, [], datetime(2026, 11, 27, tzinfo=UTC))
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert (st["phase"], failed["status"], failed["reason"]) == ("Failed", "True", "StartupDeadlineExceeded")
    assert (
        f"it was stuck: {stuck}" in failed["message"] and "spec.startupDeadlineSeconds" in failed["message"]
    )
    assert st["lastError"]["source"] == "pod" and stuck in st["lastError"]["message"]
    doc["status"] = st  # the next reconcile keeps what was said
    again = derive_status(
        doc, rayjob, plan(doc, rayjob, None, CONFIG), [], datetime(2026, 11, 27, 0, 1, tzinfo=UTC)
    )
    assert next(c for c in again["conditions"] if c["type"] == "Failed")["message"] == failed["message"]

    rayjob["spec"]["ttlSecondsAfterFinished"] = 0  # patched: nothing more to do
    assert plan(doc, rayjob, None, CONFIG).patch is None


CLAIM = {"kind": "PersistentVolumeClaim", "metadata": {"name": "rayship-checkpoints", "namespace": "default"}}


def test_a_job_whose_checkpoint_claim_does_not_exist_is_not_launched_and_says_which_claim() -> None:
    todo = plan(trainingjob(), None, [], CONFIG)
    assert todo.create is None and todo.prerequisites == ()
    reason, message = todo.context.blocked
    assert reason == "ClaimNotFound", todo.context
    assert message.startswith(
        "spec.checkpoint.storage.pvc.claimName: PersistentVolumeClaim rayship-checkpoints does not exist "
        "in namespace default; create it"
    ), message
    # once it exists, the same job is launched
    assert plan(trainingjob(), None, [CLAIM], CONFIG).create is not None


def test_the_claim_is_looked_up_only_until_the_job_is_launched() -> None:
    from rayship.controller.trainingjob import claim_to_check

    assert claim_to_check(trainingjob()) == [(api.PVCS, "rayship-checkpoints")]
    assert claim_to_check(trainingjob(phase="Pending")) == [(api.PVCS, "rayship-checkpoints")]
    assert claim_to_check(trainingjob(phase="Running", rayJobUID="rj-1")) == []
    assert claim_to_check(trainingjob(phase="Succeeded")) == []
    on_s3 = trainingjob()
    on_s3["spec"]["checkpoint"]["storage"] = {"uri": "s3://bucket/runs"}
    assert claim_to_check(on_s3) == []
    # a launched job whose claim went away is not stopped for it (its pods say so, if they need it)
    doc = trainingjob(phase="Running", rayJobUID="rj-1")
    assert plan(doc, launched(doc), [], CONFIG).context.blocked is None


def test_a_job_waiting_for_its_claim_is_pending_with_a_warning_and_looked_at_again() -> None:
    from datetime import UTC, datetime

    from rayship.controller import trainingjob as tjc

    now = datetime(2026, 12, 6, tzinfo=UTC)
    todo = plan(trainingjob(), None, [], CONFIG)
    status = tjc.status(trainingjob(), None, todo, None, now)
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert status["phase"] == "Pending" and (running["status"], running["reason"]) == (
        "False",
        "ClaimNotFound",
    )
    (event,) = [e for e in tjc.announce({}, status) if e.reason == "ClaimNotFound"]
    assert event.type == "Warning" and "rayship-checkpoints" in event.message
    assert tjc.look_again_in(trainingjob(**status), None, now) == 0.0  # not only at the resync
    launched_status = tjc.status(trainingjob(), None, plan(trainingjob(), None, [CLAIM], CONFIG), None, now)
    assert tjc.look_again_in(trainingjob(**launched_status), None, now) is None


def test_a_claim_the_watch_holds_costs_no_call_and_one_it_lacks_is_asked_for(monkeypatch) -> None:
    from rayship.controller import k8s, reconcile
    from rayship.controller.trainingjob_handlers import TRAINING

    asked: list[tuple] = []

    def get(resource, namespace, name):
        asked.append((resource, namespace, name))
        return CLAIM

    monkeypatch.setattr(k8s, "get", get)
    doc = trainingjob()
    assert reconcile._related(TRAINING, doc, reconcile.Seen(doc, None, [CLAIM])) == [CLAIM] and asked == []
    # absent from the watch: perhaps just made, so the API server is asked before the job waits for it
    assert reconcile._related(TRAINING, doc, reconcile.Seen(doc, None, [])) == [CLAIM]
    assert asked == [(api.PVCS, "default", "rayship-checkpoints")]
    launched_doc = trainingjob(phase="Running", rayJobUID="rj-1")
    assert reconcile._related(TRAINING, launched_doc, reconcile.Seen(launched_doc, None, [])) == []
    assert len(asked) == 1
