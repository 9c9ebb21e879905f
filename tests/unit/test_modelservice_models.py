"""ModelService with several models (`spec.models`, Serve model multiplexing): the API's rules (CRD,
pydantic, CLI in one line), the render (golden; strict KubeRay CRD, KubeRay's rules, Ray's
ServeDeploySchema, the server's ServeArgs), every fromTrainingJob resolved before anything is deployed,
per-model rollout confirmation from Serve's own deployed args, and the kopf wiring's TrainingJob index."""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import api, cli
from rayship.api import names
from rayship.api.validation import SpecError, parse
from rayship.config import OperatorConfig
from rayship.controller import modelservice
from rayship.controller import modelservice_handlers as handlers
from tools.kuberay_rules import rayservice_violations

SPEC = Path(__file__).parent / "specs" / "modelservice-models.yaml"
GOLDEN = Path(__file__).parent / "golden" / "modelservice-models.rayservice.yaml"
CONFIG = OperatorConfig(ray_token_key="unit-test-key")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
PVC = {"claimName": "ckpt", "mountPath": "/mnt/checkpoints"}
BASELINE = "s3://bucket/models/baseline"
OWNER = {
    "apiVersion": api.API_VERSION,
    "kind": "ModelService",
    "name": "fleet",
    "uid": "ms-1",
    "controller": True,
}


def load() -> dict[str, Any]:
    doc = yaml.safe_load(SPEC.read_text())
    doc["metadata"].update(generation=1, uid="ms-1")
    return doc


def tj(name: str, phase: str, pvc: dict[str, str] | None = PVC, **checkpoint: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if checkpoint:
        status["checkpoint"] = checkpoint
    spec = {"checkpoint": {"storage": {"pvc": pvc}}} if pvc else {}
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def done(
    small: str = "/mnt/checkpoints/small/v1", large: str = "/mnt/checkpoints/large/best1"
) -> list[dict[str, Any]]:
    return [tj("mlp-small", "Succeeded", model=small), tj("mlp-large", "Succeeded", bestModel=large)]


MODELS = {"baseline": BASELINE, "large": "/mnt/checkpoints/large/best1", "small": "/mnt/checkpoints/small/v1"}


def args_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    return dict(app["args"])


# --- render ------------------------------------------------------------------------------------


def test_render_matches_golden_and_is_valid_for_kuberay_ray_and_the_server(rayservice_validator: Any) -> None:
    rayservice = modelservice.desired_rayservice(
        parse(load()), CONFIG, MODELS, api.PvcStorage.model_validate(PVC)
    )
    text = yaml.safe_dump(rayservice, sort_keys=False, width=120)
    if os.environ.get("RAYSHIP_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (
        f"render changed; review and run RAYSHIP_UPDATE_GOLDEN=1 ({GOLDEN.name})"
    )
    assert rayservice_validator.errors(rayservice) == []
    assert rayservice_violations(rayservice) == []
    args = args_of(rayservice)
    assert args["models"] == MODELS and args["modelCacheSize"] == 2 and "modelUri" not in args
    assert json.loads(rayservice["metadata"]["annotations"][names.ANNOTATION_MODELS]) == MODELS
    pytest.importorskip("ray.serve", reason="the workload stack is not installed: run `make setup`")
    from ray.serve.schema import ServeDeploySchema

    from rayship.api import ServeArgs

    ServeDeploySchema.model_validate(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    served = ServeArgs.model_validate(args)
    assert served.model_uris == MODELS and served.model_cache_size == 2


def test_default_cache_size_is_rendered() -> None:
    doc = load()
    del doc["spec"]["modelCacheSize"]
    rayservice = modelservice.desired_rayservice(parse(doc), CONFIG, MODELS)
    assert args_of(rayservice)["modelCacheSize"] == api.DEFAULT_MODEL_CACHE_SIZE


def test_an_own_application_gets_args_models(rayservice_validator: Any) -> None:
    doc = load()
    del doc["spec"]["modelCacheSize"]
    doc["spec"]["application"] = {"importPath": "router:app_builder", "args": {"greeting": "hi"}}
    rayservice = modelservice.desired_rayservice(parse(doc), CONFIG, MODELS)
    assert args_of(rayservice) == {"greeting": "hi", "models": MODELS}
    assert rayservice_validator.errors(rayservice) == []


def test_pvcs_of_several_jobs_are_each_mounted_once() -> None:
    other = api.PvcStorage.model_validate({"claimName": "ckpt-b", "mountPath": "/mnt/b"})
    same = api.PvcStorage.model_validate(PVC)
    resolved = modelservice.Resolved(
        {
            "a": modelservice.Resolution("/mnt/checkpoints/a", "FromTrainingJob", "", same),
            "b": modelservice.Resolution("/mnt/b/b", "FromTrainingJob", "", other),
            "c": modelservice.Resolution("/mnt/checkpoints/c", "FromTrainingJob", "", same),
        }
    )
    rayservice = modelservice.desired_rayservice(parse(load()), CONFIG, MODELS, resolved.volumes)
    pod = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    claims = [
        (v["name"], v["persistentVolumeClaim"]["claimName"])
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == [("model", "ckpt"), ("model-1", "ckpt-b")]


def test_cli_render_shows_stand_ins_for_each_training_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "-f", str(SPEC)]) == 0
    out, err = capsys.readouterr()
    policy, rayservice = list(yaml.safe_load_all(out))
    assert policy["kind"] == "NetworkPolicy"
    assert args_of(rayservice)["models"] == {
        "baseline": BASELINE,
        "large": "trainingjob://default/mlp-large/best",
        "small": "trainingjob://default/mlp-small/latest",
    }
    assert "models.large.fromTrainingJob" in err and "models.small.fromTrainingJob" in err


# --- bad input ---------------------------------------------------------------------------------

BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "model-and-models",
        {"model": {"uri": "s3://m"}},
        "set exactly one of spec.model (one model) or spec.models",
    ),
    ("neither", {"models": None}, "set exactly one of spec.model (one model) or spec.models"),
    ("bad-name", {"models": {"Small Model": {"uri": "s3://m"}}}, "models: names are letters, digits"),
    ("too-many", {"models": {f"m{i}": {"uri": "s3://m"} for i in range(api.MAX_MODELS + 1)}}, "spec.models"),
    ("empty", {"models": {}}, "spec.models"),
    (
        "both-sources",
        {"models": {"a": {"uri": "s3://m", "fromTrainingJob": {"name": "x"}}}},
        "set exactly one of fromTrainingJob, fromTrainingSchedule or uri",
    ),
    (
        "cache-without-models",
        {"models": None, "model": {"uri": "s3://m"}},
        "modelCacheSize: for the built-in model server with spec.models",
    ),
    ("cache-zero", {"modelCacheSize": 0}, "spec.modelCacheSize"),
    (
        "cache-with-application",
        {"application": {"importPath": "p:app"}},
        "modelCacheSize: for the built-in model server with spec.models",
    ),
    (
        "models-arg-is-ours",
        {"modelCacheSize": None, "application": {"importPath": "p:app", "args": {"models": {}}}},
        "models: set by rayship from spec.models",
    ),
]


@pytest.mark.parametrize(("case", "change", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_models_are_rejected_by_the_crd_the_models_and_the_cli_in_one_line(
    case: str,
    change: dict[str, Any],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    modelservice_validator: Any,
) -> None:
    doc = load()
    for key, value in change.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    if case != "models-arg-is-ours":  # a free-form args map: checked by rayship, not the CRD
        assert modelservice_validator.errors(doc), f"{case}: the CRD accepts it"
    with pytest.raises(SpecError):
        parse(doc)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_sample_is_accepted_by_the_crd(modelservice_validator: Any) -> None:
    assert modelservice_validator.errors(load()) == []


# --- plan and status ---------------------------------------------------------------------------


def rayservice_from(todo: Any, *, ready: bool, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    """The created RayService as stored (adopted), with KubeRay's status."""
    rs = copy.deepcopy(todo.create)
    rs["metadata"].update(ownerReferences=[OWNER], generation=generation)
    rs["status"] = {
        "observedGeneration": observed,
        "numServeEndpoints": 1,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Running"}],
        "activeServiceStatus": {
            "rayClusterName": "fleet-x7k2p",
            "applicationStatuses": {"fleet": {"status": "RUNNING" if ready else "DEPLOYING"}},
        },
    }
    return rs


def derive(
    ms: dict[str, Any],
    rayservice: dict[str, Any] | None,
    jobs: list[dict[str, Any]],
    current: dict[str, Any] | None = None,
    serve: tuple[int, str] | None = None,
) -> tuple[Any, dict[str, Any]]:
    ms = copy.deepcopy(ms)
    if current:
        ms["status"] = current
    todo = modelservice.plan(ms, rayservice, jobs, CONFIG)
    probe = modelservice.serve_probe(todo, rayservice, CONFIG)
    if serve is not None:
        assert probe is not None, "the plan did not ask Serve"
        todo = modelservice.heard(todo, *serve)
    return todo, modelservice.status(ms, rayservice, todo, [], NOW)


def serve_answer(status: str, models: dict[str, str]) -> tuple[int, str]:
    app = {"status": status, "deployed_app_config": {"name": "fleet", "args": {"models": models}}}
    return 200, json.dumps({"applications": {"fleet": app}})


def by_type(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


def entries(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in st["models"]}


def test_nothing_is_deployed_while_any_training_job_is_not_ready() -> None:
    todo, st = derive(
        load(),
        None,
        [tj("mlp-small", "Succeeded", model="/mnt/checkpoints/small/v1"), tj("mlp-large", "Running")],
    )
    assert todo.create is None and todo.patch is None
    assert st["phase"] == "WaitingForModel"
    available = by_type(st)["ModelAvailable"]
    assert available["status"] == "False" and available["reason"] == "TrainingJobNotSucceeded"
    assert available["message"].startswith("waiting for large (nothing changes until every model resolves)")
    assert "model large: waiting for TrainingJob mlp-large to succeed (it is Running)" in available["message"]
    assert [e["name"] for e in st["models"]] == ["baseline", "large", "small"]
    assert all("uri" not in e for e in st["models"]) and st["modelCount"] == 0
    # a job that does not exist yet is said so too
    _, missing = derive(load(), None, done()[:1])
    assert "TrainingJob mlp-large does not exist (yet)" in by_type(missing)["ModelAvailable"]["message"]


def test_all_resolved_deploys_every_model_then_status_lists_each_uri() -> None:
    todo, deploying = derive(load(), None, done())
    assert todo.create is not None and args_of(todo.create)["models"] == MODELS
    assert deploying["phase"] == "Deploying" and by_type(deploying)["ModelAvailable"]["status"] == "True"
    _, ready = derive(load(), rayservice_from(todo, ready=True), done(), deploying)
    assert ready["phase"] == "Ready" and ready["modelCount"] == 3 and ready["modelURI"] is None
    assert entries(ready) == {
        "baseline": {"uri": BASELINE},
        "large": {"uri": "/mnt/checkpoints/large/best1", "volume": PVC},
        "small": {"uri": "/mnt/checkpoints/small/v1", "volume": PVC},
    }
    assert by_type(ready)["Upgrading"]["status"] == "False"
    assert not modelservice.rolling_out(ready)


def test_a_retrained_job_rolls_out_in_place_and_moves_only_on_serves_word() -> None:
    todo, deploying = derive(load(), None, done())
    stored = rayservice_from(todo, ready=True)
    _, ready = derive(load(), stored, done(), deploying)
    retrained = done(small="/mnt/checkpoints/small/v2")
    rollout, _ = derive(load(), stored, retrained, ready)
    assert set(rollout.patch["spec"]) == {"serveConfigV2"}  # in place: no new cluster
    new_models = {**MODELS, "small": "/mnt/checkpoints/small/v2"}
    assert json.loads(rollout.patch["metadata"]["annotations"][names.ANNOTATION_MODELS]) == new_models
    patched = copy.deepcopy(stored)
    patched["spec"].update(rollout.patch["spec"])
    patched["metadata"]["annotations"].update(rollout.patch["metadata"]["annotations"])
    patched["metadata"]["generation"] = patched["status"]["observedGeneration"] = 2  # KubeRay says done

    _, not_yet = derive(load(), patched, retrained, ready, serve=serve_answer("RUNNING", MODELS))
    assert entries(not_yet)["small"] == {
        "uri": "/mnt/checkpoints/small/v1",
        "targetURI": "/mnt/checkpoints/small/v2",
        "volume": PVC,
    }
    assert "targetURI" not in entries(not_yet)["large"] and modelservice.rolling_out(not_yet)
    upgrading = by_type(not_yet)["Upgrading"]
    assert upgrading["status"] == "True" and upgrading["reason"] == "ModelRollout"
    assert (
        "small=/mnt/checkpoints/small/v2" in upgrading["message"]
        and "Serve has not received it yet" in upgrading["message"]
    )

    _, deploying_new = derive(
        load(), patched, retrained, not_yet, serve=serve_answer("DEPLOYING", new_models)
    )
    assert entries(deploying_new)["small"]["uri"] == "/mnt/checkpoints/small/v1"

    _, moved = derive(load(), patched, retrained, deploying_new, serve=serve_answer("RUNNING", new_models))
    assert entries(moved)["small"] == {"uri": "/mnt/checkpoints/small/v2", "volume": PVC}
    assert not modelservice.rolling_out(moved) and by_type(moved)["Upgrading"]["status"] == "False"
    # steady state: Serve is not asked again
    steady = modelservice.plan({**load(), "status": moved}, patched, retrained, CONFIG)
    assert modelservice.serve_probe(steady, patched, CONFIG) is None


def test_a_removed_model_is_listed_until_serve_drops_it() -> None:
    todo, deploying = derive(load(), None, done())
    stored = rayservice_from(todo, ready=True)
    _, ready = derive(load(), stored, done(), deploying)
    fewer = load()
    del fewer["spec"]["models"]["baseline"]
    rollout, rolling = derive(fewer, stored, done(), ready)
    assert rollout.patch is not None and "baseline" not in args_of({"spec": rollout.patch["spec"]})["models"]
    assert (
        entries(rolling)["baseline"] == {"uri": BASELINE}
        and by_type(rolling)["Upgrading"]["status"] == "True"
    )
    patched = copy.deepcopy(stored)
    patched["spec"].update(rollout.patch["spec"])
    remaining = {k: v for k, v in MODELS.items() if k != "baseline"}
    _, dropped = derive(fewer, patched, done(), rolling, serve=serve_answer("RUNNING", remaining))
    assert set(entries(dropped)) == {"large", "small"} and dropped["modelCount"] == 2


def test_a_deleted_job_keeps_its_model_and_volume() -> None:
    todo, deploying = derive(load(), None, done())
    stored = rayservice_from(todo, ready=True)
    _, ready = derive(load(), stored, done(), deploying)
    kept, st = derive(load(), stored, done()[:1], ready)  # mlp-large deleted
    assert kept.patch is None  # same config, same cluster
    assert entries(st)["large"] == {"uri": "/mnt/checkpoints/large/best1", "volume": PVC}
    available = by_type(st)["ModelAvailable"]
    assert available["status"] == "True" and available["reason"] == "TrainingJobDeleted"
    assert (
        "TrainingJob mlp-large was deleted; still serving /mnt/checkpoints/large/best1"
        in available["message"]
    )


def test_two_pvcs_at_one_mount_path_are_refused_with_the_fix() -> None:
    jobs = [
        tj("mlp-small", "Succeeded", model="/mnt/checkpoints/small/v1"),
        tj(
            "mlp-large",
            "Succeeded",
            pvc={"claimName": "other", "mountPath": "/mnt/checkpoints"},
            bestModel="/mnt/checkpoints/l",
        ),
    ]
    todo, st = derive(load(), None, jobs)
    assert todo.create is None and st["phase"] == "WaitingForModel"
    available = by_type(st)["ModelAvailable"]
    assert available["reason"] == "ModelVolumesClash"
    assert "both mounted at /mnt/checkpoints" in available["message"] and "mountPath" in available["message"]


# --- kopf wiring -------------------------------------------------------------------------------


def test_every_referenced_training_job_is_related_and_indexed() -> None:
    doc = load()
    assert modelservice.referenced_trainingjobs(doc) == ["mlp-large", "mlp-small"]
    assert handlers.SERVING.related(doc) == [(api.TRAININGJOBS, "mlp-large"), (api.TRAININGJOBS, "mlp-small")]
    index = (
        handlers.services_by_trainingjob.__wrapped__
        if hasattr(handlers.services_by_trainingjob, "__wrapped__")
        else handlers.services_by_trainingjob
    )
    assert index(namespace="default", name="fleet", body=doc) == {
        ("default", "mlp-large"): "fleet",
        ("default", "mlp-small"): "fleet",
    }
    uri_only = {"spec": {"models": {"a": {"uri": "s3://m"}}}}
    assert index(namespace="default", name="x", body=uri_only) is None


def test_the_rollout_timer_runs_while_any_model_rolls_out() -> None:
    assert modelservice.rolling_out({"targetModelURI": "s3://m/v2"})
    assert modelservice.rolling_out({"models": [{"name": "a", "uri": "x"}, {"name": "b", "targetURI": "y"}]})
    assert not modelservice.rolling_out({"models": [{"name": "a", "uri": "x"}], "modelURI": "x"})
