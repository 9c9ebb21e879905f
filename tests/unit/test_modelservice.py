"""ModelService: RayService rendering (golden, strict KubeRay schema, Ray's ServeDeploySchema), model
resolution, in-place model rollouts vs cluster changes, status, and the bad-input corpus."""

from __future__ import annotations

import copy
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import api, cli
from rayship.api.validation import SpecError, parse
from rayship.config import OperatorConfig
from rayship.controller import modelservice
from tests.conftest import ROOT, SAMPLES
from tools.kuberay_rules import rayservice_violations

GOLDEN = Path(__file__).parent / "golden"
SAMPLE = SAMPLES / "modelservice-from-trainingjob.yaml"
SPECS = [SAMPLE, *(Path(__file__).parent / "specs" / f"modelservice-{n}.yaml" for n in ("uri-cpu", "vllm"))]
CONFIG = OperatorConfig(ray_token_key="unit-test-key")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
URI = "/mnt/checkpoints/default.mlp-ddp/model"


def load(path: Path = SAMPLE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"].setdefault("generation", 1)
    doc["metadata"].setdefault("uid", "ms-1")
    return doc


OWNER = {
    "apiVersion": "rayship.dev/v1alpha1",
    "kind": "ModelService",
    "name": "mlp",
    "uid": "ms-1",
    "controller": True,
}


def adopted(rayservice: dict[str, Any], owner: dict[str, Any] = OWNER) -> dict[str, Any]:
    """As stored: kopf.adopt() made the ModelService its controller."""
    stored = copy.deepcopy(rayservice)
    stored["metadata"]["ownerReferences"] = [owner]
    return stored


def rendered(path: Path, uri: str = URI) -> dict[str, Any]:
    return modelservice.desired_rayservice(parse(load(path)), CONFIG, uri)


def plan(
    ms: dict[str, Any],
    rayservice: dict[str, Any] | None,
    trainingjob: dict[str, Any] | None,
    config: OperatorConfig,
):
    """`modelservice.plan` for a service of one model, given its TrainingJob (None: it does not exist)."""
    return modelservice.plan(ms, rayservice, [trainingjob] if trainingjob else [], config)


def serve_config(rayservice: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_matches_golden(spec: Path) -> None:
    golden = GOLDEN / f"{spec.stem}.rayservice.yaml"
    text = yaml.safe_dump(rendered(spec), sort_keys=False, width=120)
    if os.environ.get("RAYSHIP_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"render changed; review and run RAYSHIP_UPDATE_GOLDEN=1 ({golden.name})"
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_strictly_valid_and_obeys_kuberay_rules(spec: Path, rayservice_validator) -> None:
    rayservice = rendered(spec)
    assert rayservice_validator.errors(rayservice) == []
    assert rayservice_violations(rayservice) == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_serve_config_is_valid_for_ray_and_the_app(spec: Path) -> None:
    pytest.importorskip("ray.serve", reason="the workload stack is not installed: run `make setup`")
    from ray.serve.schema import ServeDeploySchema

    from rayship.api import ServeArgs
    from rayship_workloads.serve import APP_NAME  # noqa: F401

    config = serve_config(rendered(spec))
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    if app["import_path"] == modelservice.VLLM_IMPORT_PATH:  # Ray's own LLMConfig (no vLLM needed)
        llm = pytest.importorskip("ray.llm._internal.serve.core.configs.llm_config")
        (entry,) = app["args"]["llm_configs"]
        assert llm.LLMConfig.model_validate(entry).model_loading_config.model_source == URI
        return
    args = ServeArgs.model_validate(app["args"])
    assert args.model_uri == URI and args.route_prefix == app["route_prefix"]
    assert app["import_path"] == modelservice.IMPORT_PATH
    module, _, attr = app["import_path"].partition(":")
    assert callable(getattr(__import__(module, fromlist=[attr]), attr))


def test_gpu_workers_cover_the_replicas() -> None:
    rayservice = rendered(SAMPLE)
    cluster = rayservice["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 4) and cluster[
        "enableInTreeAutoscaling"
    ] is True
    container = group["template"]["spec"]["containers"][0]
    assert (
        container["resources"]["limits"]
        == container["resources"]["requests"]
        == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    )
    assert group["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in group["template"][
        "spec"
    ]["tolerations"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in head["template"]["spec"]["containers"][0][
        "env"
    ]
    (deployment,) = serve_config(rayservice)["applications"][0]["deployments"]
    assert deployment["ray_actor_options"] == {"num_cpus": 4.0, "num_gpus": 1}
    assert deployment["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 5.0,
    }


def test_a_new_model_changes_only_serve_config() -> None:
    before, after = rendered(SAMPLE, "s3://m/v1"), rendered(SAMPLE, "s3://m/v2")
    assert before["spec"]["rayClusterConfig"] == after["spec"]["rayClusterConfig"]
    assert before["spec"]["serveConfigV2"] != after["spec"]["serveConfigV2"]
    assert (
        before["metadata"]["annotations"]["rayship.dev/cluster-config-hash"]
        == after["metadata"]["annotations"]["rayship.dev/cluster-config-hash"]
    )


def head_resources(rayservice: dict[str, Any]) -> dict[str, Any]:
    (container,) = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    return dict(container["resources"])


def test_the_head_is_sized_by_spec_head_and_by_default_as_before() -> None:
    default = rendered(SAMPLE)
    assert head_resources(default) == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    doc = load()
    doc["spec"]["head"] = {"cpus": 0.25, "memory": "1Gi"}
    small = modelservice.desired_rayservice(parse(doc), CONFIG, URI)
    assert head_resources(small) == {
        "requests": {"cpu": "250m", "memory": "1Gi"},
        "limits": {"cpu": "250m", "memory": "1Gi"},
    }
    # a new head is a cluster change (a new Ray cluster, per upgradeStrategy), not a Serve rollout
    hash_key = "rayship.dev/cluster-config-hash"
    assert small["metadata"]["annotations"][hash_key] != default["metadata"]["annotations"][hash_key]
    assert small["spec"]["serveConfigV2"] == default["spec"]["serveConfigV2"]


def test_the_autoscaler_beside_the_head_is_sized_by_spec_autoscaler() -> None:
    """KubeRay adds a Ray autoscaler container to the head pod of an autoscaling cluster, 500m CPU
    unless told: on a 2-CPU kind node the service's head did not fit beside the control plane
    ("0/1 nodes are available: 1 Insufficient cpu"). Its size is the service's to set."""
    options = rendered(SAMPLE)["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert options == {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                     "limits": {"cpu": "500m", "memory": "512Mi"}}}  # fmt: skip
    doc = load()
    doc["spec"]["autoscaler"] = {"cpus": 0.1, "memory": "256Mi"}
    small = modelservice.desired_rayservice(parse(doc), CONFIG, URI)["spec"]["rayClusterConfig"]
    assert small["autoscalerOptions"]["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    no_cpu_limits = modelservice.desired_rayservice(
        parse(doc), CONFIG.model_copy(update={"cpu_limits": False}), URI
    )
    assert no_cpu_limits["spec"]["rayClusterConfig"]["autoscalerOptions"]["resources"]["limits"] == {
        "memory": "256Mi"
    }


def ray_containers_env(rayservice: dict[str, Any]) -> list[list[dict[str, Any]]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c.get("env", []) for t in templates for c in t["spec"]["containers"]]


def test_serve_takes_requests_through_haproxy_unless_spec_env_says_otherwise() -> None:
    for env in ray_containers_env(rendered(SAMPLE)):
        assert {"name": "RAY_SERVE_ENABLE_HA_PROXY", "value": "1"} in env
        assert {"name": "RAY_SERVE_THROUGHPUT_OPTIMIZED", "value": "1"} in env, "KubeRay's pair with HAProxy"
        # request log lines written as they come (`rayship logs ms/NAME`), not 1000 at a time
        assert {"name": "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "value": "1"} in env
    doc = load()
    doc["spec"]["env"] = [{"name": "RAY_SERVE_ENABLE_HA_PROXY", "value": "0"}]
    ms = parse(doc)
    secret = modelservice.env_secret(ms, CONFIG)
    assert secret is not None and secret["stringData"] == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    for env in ray_containers_env(modelservice.desired_rayservice(ms, CONFIG, URI)):
        # the user's value alone (by reference, as every plain value): a second entry of the same name
        # would leave the winner to the kubelet
        ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "RAY_SERVE_ENABLE_HA_PROXY"}}
        assert [e for e in env if e["name"] == "RAY_SERVE_ENABLE_HA_PROXY"] == [
            {"name": "RAY_SERVE_ENABLE_HA_PROXY", "valueFrom": ref}
        ]


def test_plain_env_values_travel_in_a_secret_not_in_the_rayservice() -> None:
    """A ModelService's plain env values were written into the RayService's pod templates, readable by
    whoever may get rayservices and on Ray's dashboard (issue 57 §2): they are in a Secret of their own,
    named by its content and made before the RayService, which the pods' env references."""
    doc = load()
    doc["spec"]["env"] = [
        {"name": "HF_TOKEN", "value": "hf_not_for_your_eyes"},
        {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}},
    ]
    ms = parse(doc)
    rayservice = modelservice.desired_rayservice(ms, CONFIG, URI)
    assert "hf_not_for_your_eyes" not in json.dumps(rayservice)
    secret = modelservice.env_secret(ms, CONFIG)
    assert secret is not None and secret["stringData"] == {"HF_TOKEN": "hf_not_for_your_eyes"}
    assert secret["metadata"]["namespace"] == rayservice["metadata"]["namespace"]
    for env in ray_containers_env(rayservice):
        assert {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "HF_TOKEN"}},
        } in env
        assert {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}} in env
    edited = copy.deepcopy(doc)
    edited["spec"]["env"][0]["value"] = "hf_another"
    other = modelservice.env_secret(parse(edited), CONFIG)
    assert (
        other is not None and other["metadata"]["name"] != secret["metadata"]["name"]
    )  # new values, new pods
    # made before the RayService that names it, with the token Secret and the NetworkPolicy
    made = plan(doc, None, tj("Succeeded", model="s3://m/v1"), CONFIG)
    assert [p["metadata"]["name"] for p in made.prerequisites if p["kind"] == "Secret"][1] == secret[
        "metadata"
    ]["name"]
    del doc["spec"]["env"]
    assert modelservice.env_secret(parse(doc), CONFIG) is None


def test_crd_has_spec_head_as_the_trainingjob_has_it() -> None:
    def spec_schema(plural: str) -> dict[str, Any]:
        crd = yaml.safe_load((ROOT / "manifests" / "crds" / f"{plural}.rayship.dev.yaml").read_text())
        return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    head = spec_schema("modelservices")["properties"]["head"]
    assert head["description"] == "Ray head pod (runs the Serve controller, no replicas)."
    assert head["default"] == {"cpus": 2, "memory": "8Gi"}
    assert head["properties"]["cpus"]["description"] == "CPU cores for the head pod (at least 1m)."
    assert head["properties"]["memory"]["description"] == "Memory for the head pod."
    trainingjob_head = spec_schema("trainingjobs")["properties"]["head"]
    assert {k: v for k, v in head.items() if k != "description"} == {
        k: v for k, v in trainingjob_head.items() if k != "description"
    }


def test_url() -> None:
    assert modelservice.service_url(parse(load())) == "http://mlp-serve-svc.default.svc:8000/mlp"


# --- bad input ---------------------------------------------------------------------------------

BAD: list[tuple[str, dict[str, Any], str]] = [
    ("both-sources", {"model": {"uri": "s3://m", "fromTrainingJob": {"name": "x"}}}, "spec.model"),
    ("no-source", {"model": {}}, "spec.model"),
    ("min-over-max", {"replicas": {"min": 5, "max": 2}}, "spec.replicas"),
    ("negative-gpus", {"resources": {"gpus": -1}}, "spec.resources.gpus"),
    ("bad-route", {"routePrefix": "mlp"}, "spec.routePrefix"),
    ("route-trailing-slash", {"routePrefix": "/mlp/"}, "spec.routePrefix"),
    (
        "bad-checkpoint-choice",
        {"model": {"fromTrainingJob": {"name": "x", "checkpoint": "first"}}},
        "spec.model.fromTrainingJob.checkpoint",
    ),
    ("bad-upgrade-strategy", {"upgradeStrategy": "Rolling"}, "spec.upgradeStrategy"),
    ("incremental-without-options", {"upgradeStrategy": "NewClusterWithIncrementalUpgrade"}, "spec"),
    ("zero-batch", {"batching": {"maxBatchSize": 0}}, "spec.batching.maxBatchSize"),
    ("bad-memory", {"resources": {"memory": "16GB"}}, "spec.resources.memory"),
    ("unknown-field", {"replica": 2}, "spec.replica"),
    ("head-zero-cpus", {"head": {"cpus": 0}}, "spec.head.cpus"),
    ("head-bad-memory", {"head": {"memory": "lots"}}, "spec.head.memory"),
    ("head-cpus-below-1m", {"head": {"cpus": 0.0001}}, "spec.head.cpus"),
    ("head-memory-below-64mi", {"head": {"memory": "100Ki"}}, "memory must be at least 64Mi"),
    (
        "credential-in-model-uri",
        {"model": {"uri": "https://hf_token123@models.example.com/llama"}},
        "model.uri: a credential in the URI",
    ),
    ("model-uri-leading-blank", {"model": {"uri": " s3://AKIA:secret@bucket/m"}}, "model.uri: a credential"),
    (
        "model-uri-azure-sas",
        {"model": {"uri": "https://a.blob.core.windows.net/c/m?sv=1&sig=x"}},
        "model.uri: a signature",
    ),
    (
        "model-uri-gcs-signed",
        {"model": {"uri": "https://storage.googleapis.com/b/m?X-Goog-Signature=1"}},
        "model.uri: a signature",
    ),
    (
        "application-pip-index",
        {
            "model": {"uri": "s3://b/m"},
            "application": {
                "importPath": "app:app_builder",
                "runtimeEnv": {"pip": ["-i https://u:p@idx.example"]},
            },
        },
        "spec.application.runtimeEnv: runtimeEnv.pip: pip options",
    ),
    # every env list of every kind: a CPU pod with NVIDIA_VISIBLE_DEVICES=all sees its node's GPUs
    ("env-gpu-runtime", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "spec.env"),
    ("env-gpu-mig-monitor", {"env": [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]}, "spec.env"),
    ("env-rayship-owner", {"env": [{"name": "RAYSHIP_MODELSERVICE", "value": "other/svc"}]}, "spec.env"),
    (
        "application-env-gpu-runtime",
        {
            "model": {"uri": "s3://bucket/model"},
            "application": {
                "importPath": "app:app_builder",
                "runtimeEnv": {"envVars": {"NVIDIA_VISIBLE_DEVICES": "all"}},
            },
        },
        "spec.application.runtimeEnv",
    ),
]


# What the CRD's pattern takes but the NetworkPolicy the operator writes would be refused for: rayship
# refuses it (the CLI, and the operator marks the service Invalid), naming the field.
BAD_CIDRS = [
    ("cidr-prefix-33", {"ipBlock": {"cidr": "10.0.0.0/33"}}, "spec.serveFrom[0].ipBlock: cidr: '10.0.0.0/33'"),
    ("cidr-octet-999", {"ipBlock": {"cidr": "10.999.0.0/16"}}, "spec.serveFrom[0].ipBlock: cidr: '10.999.0.0/16'"),
    (
        "except-prefix-99",
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/99"]}},
        "spec.serveFrom[0].ipBlock: except: '10.1.0.0/99'",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "peer", "said"), BAD_CIDRS, ids=[b[0] for b in BAD_CIDRS])
def test_a_cidr_the_api_server_would_refuse_is_refused_first(case, peer, said, tmp_path, capsys) -> None:
    doc = load()
    doc["spec"]["serveFrom"] = [peer]
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and said in err and "is not a CIDR" in err and len(err.strip().splitlines()) == 1, err


def test_a_cidr_with_host_bits_is_taken_as_the_api_server_takes_it() -> None:
    doc = load()
    doc["spec"]["serveFrom"] = [{"ipBlock": {"cidr": "10.0.0.1/8"}}, {"ipBlock": {"cidr": "fd00::/8"}}]
    assert len(parse(doc).spec.serve_from) == 2


@pytest.mark.parametrize(("case", "change", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_modelservice_is_rejected_by_cli_models_and_crd(
    case, change, field, tmp_path, capsys, modelservice_validator
) -> None:
    doc = load()
    doc["spec"].update(copy.deepcopy(change))
    assert modelservice_validator.errors(doc), f"{case}: the CRD accepts it"
    with pytest.raises(SpecError):
        parse(doc)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and field in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("head", "line"),
    [
        ({"cpus": 0}, "spec.head.cpus: input should be greater than or equal to 0.001 (got 0)"),
        ({"memory": "lots"}, "spec.head.memory: 'lots' is not a Kubernetes quantity: a number and a unit"),
    ],
    ids=["cpus-0", "memory-lots"],
)
def test_a_bad_head_is_refused_in_one_line_naming_the_field(head, line, tmp_path, capsys) -> None:
    doc = load()
    doc["spec"]["head"] = head
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {path}: {line}") and len(err.splitlines()) == 1, err


# --- resolution and planning -------------------------------------------------------------------


def tj(phase: str | None, **checkpoint: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if checkpoint:
        status["checkpoint"] = checkpoint
    return {"metadata": {"name": "mlp-ddp"}, "status": status}


@pytest.mark.parametrize(
    ("trainingjob", "served", "uri", "reason"),
    [
        (None, None, None, "TrainingJobNotFound"),
        (tj("Running"), None, None, "TrainingJobNotSucceeded"),
        (tj("Failed"), None, None, "TrainingJobFailed"),
        (tj("Succeeded"), None, None, "NoExportedModel"),
        (
            tj("Succeeded", model="s3://m/latest", bestModel="s3://m/best"),
            None,
            "s3://m/latest",
            "FromTrainingJob",
        ),
        (None, "s3://m/old", "s3://m/old", "TrainingJobDeleted"),
        (tj("Running"), "s3://m/old", "s3://m/old", "TrainingJobNotSucceeded"),
    ],
)
def test_resolve_model(trainingjob, served, uri, reason) -> None:
    current = {"modelURI": served} if served else {}
    found = modelservice.resolve_model(parse(load()), trainingjob, current)
    assert (found.uri, found.reason) == (uri, reason)
    assert "mlp-ddp" in found.message


def _waiting(ms: dict[str, Any], existing: list[str]) -> dict[str, Any]:
    """The ModelAvailable condition of a service planned with no TrainingJob it names, told `existing`."""
    todo = modelservice.plan(ms, None, [], CONFIG)
    assert modelservice.missing_related(todo) == api.TRAININGJOBS
    told = modelservice.with_existing(todo, existing)
    (cond,) = [
        c
        for c in modelservice.status(ms, None, told, None, NOW)["conditions"]
        if c["type"] == "ModelAvailable"
    ]
    assert cond["reason"] == "TrainingJobNotFound" and cond["status"] == "False"
    return cond


def test_a_missing_trainingjob_is_said_with_those_that_do_exist_and_a_guess() -> None:
    """A typo in fromTrainingJob.name waited forever saying only "does not exist (yet)": the status
    names the TrainingJobs of the namespace (from the operator's index: the plan is told them) and the
    closest one."""
    ms = load()
    ms["spec"]["model"]["fromTrainingJob"]["name"] = "mlp-dpp"
    assert _waiting(ms, ["llm-zero3", "mlp-ddp"])["message"] == (
        "TrainingJob mlp-dpp does not exist (yet) in namespace default; did you mean mlp-ddp? "
        "TrainingJobs there: llm-zero3, mlp-ddp"
    )
    assert _waiting(ms, [])["message"] == (
        "TrainingJob mlp-dpp does not exist (yet) in namespace default; there is no TrainingJob there"
    )
    many = [f"job-{i:02d}" for i in range(13)]
    assert _waiting(ms, many)["message"] == (
        "TrainingJob mlp-dpp does not exist (yet) in namespace default; TrainingJobs there: "
        + ", ".join(many[:10])
        + " and 3 more"
    )


def test_each_missing_trainingjob_of_a_multi_model_service_is_said_with_those_that_exist() -> None:
    ms = load()
    del ms["spec"]["model"]
    ms["spec"]["models"] = {"a": {"fromTrainingJob": {"name": "mlp-dd"}}, "b": {"uri": "s3://m/b"}}
    assert _waiting(ms, ["mlp-ddp"])["message"] == (
        "waiting for a (nothing changes until every model resolves): model a: TrainingJob mlp-dd does not "
        "exist (yet) in namespace default; did you mean mlp-ddp? TrainingJobs there: mlp-ddp; "
        "model b: serving s3://m/b"
    )


def test_no_names_are_wanted_when_every_trainingjob_named_exists() -> None:
    todo = plan(load(), None, tj("Running"), CONFIG)
    assert modelservice.missing_related(todo) is None
    assert modelservice.with_existing(todo, ["x"]) == todo


def test_best_checkpoint_choice() -> None:
    doc = load()
    doc["spec"]["model"]["fromTrainingJob"]["checkpoint"] = "best"
    found = modelservice.resolve_model(
        parse(doc), tj("Succeeded", model="s3://m/latest", bestModel="s3://m/best"), {}
    )
    assert found.uri == "s3://m/best"


def test_plan_create_then_rollout_then_cluster_change() -> None:
    ms = load()
    done = tj("Succeeded", model="s3://m/v1")
    first = plan(ms, None, done, CONFIG)
    assert first.create is not None and first.patch is None and first.context.desired_uri == "s3://m/v1"
    stored = adopted(first.create)
    assert plan(ms, stored, done, CONFIG).patch is None  # idempotent

    rollout = plan(ms, stored, tj("Succeeded", model="s3://m/v2"), CONFIG)
    assert set(rollout.patch["spec"]) == {"serveConfigV2"}  # in place: rayClusterConfig untouched
    assert rollout.patch["metadata"]["annotations"] == {"rayship.dev/model-uri": "s3://m/v2"}

    bigger = copy.deepcopy(ms)
    bigger["spec"]["resources"]["memory"] = "32Gi"
    change = plan(bigger, stored, done, CONFIG)
    assert "rayClusterConfig" in change.patch["spec"] and "serveConfigV2" not in change.patch["spec"]


def test_waiting_plan_creates_nothing() -> None:
    waiting = plan(load(), None, tj("Running"), CONFIG)
    assert waiting.create is None and waiting.context.desired_uri is None


# --- status ------------------------------------------------------------------------------------


def rayservice_with(
    ready: bool,
    app_status: str,
    *,
    generation: int = 1,
    observed: int = 1,
    endpoints: int = 1,
    uri: str = "s3://m/v1",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "mlp",
            "generation": generation,
            "annotations": {"rayship.dev/model-uri": uri},
            "ownerReferences": [OWNER],
        },
        "status": {
            "observedGeneration": observed,
            "numServeEndpoints": endpoints,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "Initializing" if not ready else "Running",
                }
            ],
            "activeServiceStatus": {
                "rayClusterName": "mlp-x7k2p",
                "applicationStatuses": {"mlp": {"status": app_status}},
            },
        },
    }


def derive(ms, rayservice, trainingjob, current=None, serve: tuple[int, str] | None = None):
    """As the reconcile loop does it; `serve` is the dashboard's answer (HTTP code, body) when the
    plan asks Serve (`serve_probe`)."""
    ms = copy.deepcopy(ms)
    if current:
        ms["status"] = current
    todo = plan(ms, rayservice, trainingjob, CONFIG)
    probe = modelservice.serve_probe(todo, rayservice, CONFIG)
    if serve is not None:
        assert probe is not None, "the plan did not ask Serve"
        todo = modelservice.heard(todo, *serve)
    return modelservice.status(ms, rayservice, todo, [], NOW)


def serve_answer(status: str, uri: str, app: str = "mlp") -> tuple[int, str]:
    """The dashboard's /api/serve/applications/ answer (the parts rayship reads)."""
    body = {
        "applications": {
            app: {"status": status, "deployed_app_config": {"name": app, "args": {"modelUri": uri}}}
        }
    }
    return 200, json.dumps(body)


def by_type(st):
    return {c["type"]: c for c in st["conditions"]}


def test_status_waiting_deploying_ready() -> None:
    ms = load()
    waiting = derive(ms, None, tj("Running"))
    assert waiting["phase"] == "WaitingForModel"
    assert (
        by_type(waiting)["ModelAvailable"]["message"]
        == "waiting for TrainingJob mlp-ddp to succeed (it is Running)"
    )

    deploying = derive(ms, rayservice_with(False, "DEPLOYING"), tj("Succeeded", model="s3://m/v1"))
    assert deploying["phase"] == "Deploying" and deploying.get("url") is None

    ready = derive(ms, rayservice_with(True, "RUNNING", endpoints=2), tj("Succeeded", model="s3://m/v1"))
    assert ready["phase"] == "Ready" and ready["serveEndpoints"] == 2
    assert ready["url"] == "http://mlp-serve-svc.default.svc:8000/mlp" and ready["modelURI"] == "s3://m/v1"
    assert ready["targetModelURI"] is None and by_type(ready)["Upgrading"]["status"] == "False"


def test_status_shows_old_and_new_model_until_the_new_one_is_ready() -> None:
    ms = load()
    ready = derive(ms, rayservice_with(True, "RUNNING"), tj("Succeeded", model="s3://m/v1"))
    # the new serveConfigV2 was written (generation 2) but KubeRay has not reconciled it yet
    rolling = derive(
        ms,
        rayservice_with(True, "RUNNING", generation=2, observed=1, uri="s3://m/v2"),
        tj("Succeeded", model="s3://m/v2"),
        ready,
    )
    assert rolling["modelURI"] == "s3://m/v1" and rolling["targetModelURI"] == "s3://m/v2"
    assert by_type(rolling)["Upgrading"]["reason"] == "ModelRollout"
    done = derive(
        ms,
        rayservice_with(True, "RUNNING", generation=2, observed=2, uri="s3://m/v2"),
        tj("Succeeded", model="s3://m/v2"),
        rolling,
        serve=serve_answer("RUNNING", "s3://m/v2"),
    )
    assert done["modelURI"] == "s3://m/v2" and done["targetModelURI"] is None


def test_modeluri_moves_only_on_serves_own_word() -> None:
    """KubeRay reads the application status before it submits a new serveConfigV2, so its RUNNING
    (observedGeneration up to date) may be the old model's: only Serve's deployed config counts."""
    ms = load()
    ready = derive(ms, rayservice_with(True, "RUNNING"), tj("Succeeded", model="s3://m/v1"))
    kuberay_says_done = rayservice_with(True, "RUNNING", generation=2, observed=2, uri="s3://m/v2")
    new = tj("Succeeded", model="s3://m/v2")

    not_yet = derive(ms, kuberay_says_done, new, ready, serve=serve_answer("RUNNING", "s3://m/v1"))
    assert not_yet["modelURI"] == "s3://m/v1" and not_yet["targetModelURI"] == "s3://m/v2"
    assert not_yet["phase"] == "Ready"  # the old model keeps serving
    assert "Serve has not received it yet" in by_type(not_yet)["Upgrading"]["message"]

    deploying = derive(ms, kuberay_says_done, new, not_yet, serve=serve_answer("DEPLOYING", "s3://m/v2"))
    assert deploying["modelURI"] == "s3://m/v1" and deploying["targetModelURI"] == "s3://m/v2"
    assert by_type(deploying)["Upgrading"]["message"].endswith("Serve's application with it is DEPLOYING")

    refused = derive(ms, kuberay_says_done, new, deploying, serve=(401, "Unauthorized"))
    assert refused["modelURI"] == "s3://m/v1"
    assert "refused the operator's token (HTTP 401)" in by_type(refused)["Upgrading"]["message"]

    done = derive(ms, kuberay_says_done, new, refused, serve=serve_answer("RUNNING", "s3://m/v2"))
    assert done["modelURI"] == "s3://m/v2" and done["targetModelURI"] is None
    assert by_type(done)["Upgrading"]["status"] == "False"
    # steady state: nothing to confirm, Serve is not asked
    todo = plan({**ms, "status": done}, kuberay_says_done, new, CONFIG)
    assert modelservice.serve_probe(todo, kuberay_says_done, CONFIG) is None


def test_serve_is_asked_through_the_head_service_with_the_derived_token() -> None:
    ms = load()
    rs = rayservice_with(True, "RUNNING", uri="s3://m/v2")
    rs["metadata"]["namespace"] = "team-a"
    ready = derive(ms, rayservice_with(True, "RUNNING"), tj("Succeeded", model="s3://m/v1"))
    todo = plan({**ms, "status": ready}, rs, tj("Succeeded", model="s3://m/v2"), CONFIG)
    probe = modelservice.serve_probe(todo, rs, CONFIG)
    assert probe is not None
    assert (probe.service, probe.path) == ("mlp-head-svc:dashboard", "api/serve/applications/")
    assert probe.token == modelservice.ray_token(CONFIG, "team-a", "mlp")
    assert probe.token not in repr(probe)
    # no active cluster yet (a first deployment): nothing to ask
    first = copy.deepcopy(rs)
    del first["status"]["activeServiceStatus"]["rayClusterName"]
    assert modelservice.serve_probe(todo, first, CONFIG) is None


def test_the_ray_token_secret_is_made_before_the_rayservice() -> None:
    todo = plan(load(), None, tj("Succeeded", model="s3://m/v1"), CONFIG)
    assert todo.create is not None
    secret, policy = todo.prerequisites
    assert policy["kind"] == "NetworkPolicy"
    name = todo.create["spec"]["rayClusterConfig"]["authOptions"]["secretName"]
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == name
    # unguessable: derived from the operator's key and the ModelService's UID, never `<name>-ray-token`
    assert re.fullmatch(r"mlp-ray-token-[0-9a-f]{12}", name), name
    other_key = modelservice.token_secret_name(parse(load()), OperatorConfig(ray_token_key="another-key"))
    recreated = load()
    recreated["metadata"]["uid"] = "ms-2"  # a namesake made after the first was deleted
    assert len({name, other_key, modelservice.token_secret_name(parse(recreated), CONFIG)}) == 3
    token = secret["stringData"]["auth_token"]
    assert token == modelservice.ray_token(CONFIG, "default", "mlp") and len(token) == 64
    assert token not in json.dumps(todo.create)  # only by reference in the RayService
    other = OperatorConfig(ray_token_key="another-key")
    assert modelservice.ray_token(other, "default", "mlp") != token
    assert modelservice.ray_token(CONFIG, "team-b", "mlp") != token


@pytest.mark.parametrize(
    ("code", "body", "expected"),
    [
        (
            503,
            'no endpoints available for service "mlp-head-svc"\n',
            "could not be asked (HTTP 503): no endpoints",
        ),
        (200, "<html>", "answered something else than Serve's state"),
        (200, json.dumps({"applications": {}}), "Serve has no application mlp"),
        (0, "Connection refused", "could not be asked (HTTP 0): Connection refused"),
    ],
)
def test_serve_state_says_why_it_could_not_be_read(code: int, body: str, expected: str) -> None:
    state = modelservice.serve_state("mlp", code, body)
    assert state.problem is not None and expected in state.problem and state.model_uri is None


@pytest.mark.parametrize(
    ("app_status", "phase"),
    [("DEPLOY_FAILED", "Failed"), ("UNHEALTHY", "Degraded"), ("NOT_STARTED", "Deploying")],
)
def test_status_failures(app_status: str, phase: str) -> None:
    st = derive(load(), rayservice_with(False, app_status), tj("Succeeded", model="s3://m/v1"))
    assert st["phase"] == phase


def test_deleted_trainingjob_keeps_the_service_and_says_so() -> None:
    ms = load()
    ready = derive(ms, rayservice_with(True, "RUNNING"), tj("Succeeded", model="s3://m/v1"))
    after = derive(ms, rayservice_with(True, "RUNNING"), None, ready)
    assert after["phase"] == "Ready" and after["modelURI"] == "s3://m/v1"
    assert by_type(after)["ModelAvailable"]["reason"] == "TrainingJobDeleted"


def test_invalid() -> None:
    """A spec rayship cannot read is Invalid (e.g. a field from a newer CRD than this operator; the
    API server has evaluated the CRD's own CEL rules, so plan() does not evaluate them again)."""
    ms = load()
    ms["spec"]["model"]["path"] = "s3://x"
    st = derive(ms, None, None)
    assert st["phase"] == "Invalid" and "spec.model" in by_type(st)["Valid"]["message"]


def test_local_serve_resolves_from_a_local_run(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the workload stack is not installed: run `make setup`")
    import json

    from rayship_workloads.local import resolve_model

    ms = parse(load()).wire()
    with pytest.raises(FileNotFoundError, match="TrainingJob mlp-ddp has no local run .*rayship run -f"):
        resolve_model(ms, runs_dir=tmp_path)
    (tmp_path / "mlp-ddp").mkdir()
    (tmp_path / "mlp-ddp" / "result.json").write_text(
        json.dumps({"model": "/m/latest", "bestModel": "/m/best"})
    )
    assert resolve_model(ms, runs_dir=tmp_path) == "/m/latest"
    ms["spec"]["model"]["fromTrainingJob"]["checkpoint"] = "best"
    assert resolve_model(ms, runs_dir=tmp_path) == "/m/best"
    assert resolve_model({"spec": {"model": {"uri": "s3://x"}}}, runs_dir=tmp_path) == "s3://x"


def test_a_rayservice_that_is_not_ours_is_never_patched_or_mirrored() -> None:
    foreign = adopted(rayservice_with(True, "RUNNING"), {**OWNER, "uid": "someone-else", "name": "other"})
    todo = plan(load(), foreign, tj("Succeeded", model="s3://m/v2"), CONFIG)
    assert todo.create is None and todo.patch is None and "not owned" in todo.context.blocked
    st = modelservice.status(load(), foreign, todo, [], NOW)
    assert st["phase"] == "Deploying" and by_type(st)["Ready"]["reason"] == "RayServiceNameTaken"
    assert "modelURI" not in st


def test_first_deployment_failure_is_read_from_the_pending_cluster() -> None:
    """KubeRay v1.7 keeps a first deployment in pendingServiceStatus until it runs."""
    rs = rayservice_with(False, "RUNNING")
    rs["status"]["activeServiceStatus"] = {}
    rs["status"]["pendingServiceStatus"] = {
        "rayClusterName": "mlp-abcde",
        "applicationStatuses": {"mlp": {"status": "DEPLOY_FAILED", "message": "ModuleNotFoundError: x"}},
    }
    st = derive(load(), rs, tj("Succeeded", model="s3://m/v1"))
    assert st["phase"] == "Failed" and by_type(st)["Ready"]["message"] == "ModuleNotFoundError: x"


@pytest.mark.parametrize("reason", ["ValidationFailed", "InitializingTimeout"])
def test_kuberay_final_ready_reasons_fail_the_service(reason: str) -> None:
    rs = rayservice_with(False, "")
    rs["status"]["conditions"][0].update(reason=reason, message=f"KubeRay says {reason}")
    st = derive(load(), rs, tj("Succeeded", model="s3://m/v1"))
    assert st["phase"] == "Failed" and by_type(st)["Ready"]["message"] == f"KubeRay says {reason}"


def test_in_place_rollout_keeps_ready_and_the_served_model_until_serve_runs_the_new_one() -> None:
    ms = load()
    ready = derive(ms, rayservice_with(True, "RUNNING"), tj("Succeeded", model="s3://m/v1"))
    rolling = derive(
        ms,
        rayservice_with(True, "DEPLOYING", generation=2, observed=2, uri="s3://m/v2"),
        tj("Succeeded", model="s3://m/v2"),
        ready,
    )
    assert rolling["phase"] == "Ready" and rolling["modelURI"] == "s3://m/v1"
    assert rolling["targetModelURI"] == "s3://m/v2" and by_type(rolling)["Upgrading"]["status"] == "True"


def test_url_under_incremental_upgrade_points_at_the_active_cluster() -> None:
    ms = load()
    ms["spec"]["upgradeStrategy"] = "NewClusterWithIncrementalUpgrade"
    ms["spec"]["upgradeOptions"] = {
        "maxSurgePercent": 50,
        "stepSizePercent": 25,
        "intervalSeconds": 30,
        "gatewayClassName": "istio",
    }
    rs = rayservice_with(True, "RUNNING")
    rs["status"]["activeServiceStatus"]["rayClusterName"] = "mlp-x7k2p"
    st = derive(ms, rs, tj("Succeeded", model="s3://m/v1"))
    assert st["url"] == "http://mlp-x7k2p-serve-svc.default.svc:8000/mlp"


def _mounts(rayservice: dict[str, Any]) -> list[tuple[dict, list]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [(t["spec"]["volumes"], t["spec"]["containers"][0]["volumeMounts"]) for t in templates]


def test_a_fromtrainingjob_service_mounts_the_jobs_checkpoint_pvc_read_only() -> None:
    job = tj("Succeeded", model="/mnt/checkpoints/default.mlp-ddp/model")
    job["spec"] = {"checkpoint": {"storage": {"pvc": {"claimName": "ckpt", "mountPath": "/mnt/checkpoints"}}}}
    todo = plan(load(), None, job, CONFIG)
    for volumes, mounts in _mounts(todo.create):  # head (Serve controller) and every replica pod
        assert {"name": "model", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": True}} in volumes
        assert {"name": "model", "mountPath": "/mnt/checkpoints", "readOnly": True} in mounts
    st = modelservice.status(load(), None, todo, [], NOW)
    assert st["modelVolume"] == {"claimName": "ckpt", "mountPath": "/mnt/checkpoints"}
    # The job deleted: the service keeps the model and the volume it reads it from (no new cluster).
    kept = plan({**load(), "status": st | {"modelURI": job["status"]["checkpoint"]["model"]}},
                             adopted(todo.create), None, CONFIG)  # fmt: skip
    assert kept.patch is None and kept.context.resolution.volumes[0].claim_name == "ckpt"


def test_a_uri_service_can_name_the_pvc_that_holds_the_model() -> None:
    ms = load(Path(__file__).parent / "specs" / "modelservice-uri-cpu.yaml")
    ms["spec"]["model"] = {"uri": "/models/mlp"}
    ms["spec"]["storage"] = {"pvc": {"claimName": "models", "mountPath": "/models"}}
    todo = plan(ms, None, None, CONFIG)
    for volumes, mounts in _mounts(todo.create):
        assert {
            "name": "model",
            "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
        } in volumes
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in mounts


def test_a_failed_deployment_says_the_replicas_own_error() -> None:
    rs = rayservice_with(False, "DEPLOY_FAILED")
    rs["status"]["activeServiceStatus"]["applicationStatuses"]["mlp"].update(
        message="Failed to update the deployments ['RayshipModel'].",
        serveDeploymentStatuses={
            "RayshipModel": {
                "status": "DEPLOY_FAILED",
                "message": "Traceback (most recent call last):\n  ...\nFileNotFoundError: /m/x: no such directory\n",
            }
        },
    )
    st = derive(load(), rs, tj("Succeeded", model="s3://m/v1"))
    assert st["phase"] == "Failed"
    assert by_type(st)["Ready"]["message"] == (
        "Failed to update the deployments ['RayshipModel'].: "
        "deployment RayshipModel: FileNotFoundError: /m/x: no such directory"
    )


def test_without_cpu_limits_cpu_is_requested_and_memory_and_gpus_stay_capped() -> None:
    """`cpuLimits: false` (chart) leaves every Ray pod Burstable: CPU requested, not capped."""
    doc = load()
    uncapped = modelservice.desired_rayservice(
        parse(doc), CONFIG.model_copy(update={"cpu_limits": False}), URI
    )
    spec = uncapped["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in pods:
        (container,) = group["template"]["spec"]["containers"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert "cpu" in requests and "cpu" not in limits
        assert limits == {key: value for key, value in requests.items() if key != "cpu"}
    assert any(
        CONFIG.gpu_resource in g["template"]["spec"]["containers"][0]["resources"]["limits"] for g in pods
    )
