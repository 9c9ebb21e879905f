"""ModelService beyond the built-in server: an own Serve application (args.modelUri, runtime_env,
per-deployment settings), replicas.initial and the visible per-replica concurrency; every render
checked strictly against the KubeRay CRD, KubeRay's rules and Ray's ServeDeploySchema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import cli
from rayship.api.validation import parse
from rayship.config import OperatorConfig
from rayship.controller import modelservice
from tools.kuberay_rules import rayservice_violations

EXAMPLE = Path(__file__).parents[2] / "examples" / "pipeline" / "modelservice.yaml"
CONFIG = OperatorConfig(ray_token_key="unit-test-key")
URI = "s3://models/mlp/"


def example(**spec: Any) -> dict[str, Any]:
    """The shipped pipeline as a cluster takes it: its code as a zip URI, not a local folder."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["application"]["runtimeEnv"] = {
        "workingDir": "s3://bucket/pipeline.zip",
        "envVars": {"MODE": "x"},
    }
    doc["spec"].update(spec)
    return doc


def render(doc: dict[str, Any], rayservice_validator: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RayService, its serveConfigV2), both validated strictly."""
    pytest.importorskip("ray.serve", reason="the workload stack is not installed: run `make setup`")
    from ray.serve.schema import ServeDeploySchema

    rayservice = modelservice.desired_rayservice(parse(doc), CONFIG, URI)
    assert rayservice_validator.errors(rayservice) == []
    assert rayservice_violations(rayservice) == []
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(config)
    return rayservice, config


def test_own_application_gets_the_model_and_its_deployment_settings(rayservice_validator: Any) -> None:
    _, config = render(example(), rayservice_validator)
    (app,) = config["applications"]
    assert app["import_path"] == "pipeline:app_builder" and app["route_prefix"] == "/pipeline"
    assert app["args"] == {"mean": [0] * 8, "scale": [1] * 8, "modelUri": URI}
    assert app["runtime_env"] == {"working_dir": "s3://bucket/pipeline.zip", "env_vars": {"MODE": "x"}}
    assert app["deployments"] == [
        {
            "name": "Model",
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": 4,
                "initial_replicas": 1,
                "target_ongoing_requests": 4.0,
            },
            "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0.0},
        },
        {
            "name": "Preprocess",
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 0.25},
            "max_ongoing_requests": 32,
        },
    ]


def test_builtin_server_shows_concurrency_and_initial_replicas(rayservice_validator: Any) -> None:
    doc = yaml.safe_load((Path(__file__).parent / "specs" / "modelservice-uri-cpu.yaml").read_text())
    doc["spec"]["replicas"] = {"min": 0, "max": 3, "initial": 2}
    doc["spec"]["batching"] = {"maxBatchSize": 8}
    doc["spec"]["deployments"] = {
        "RayshipModel": {"maxOngoingRequests": 40, "rayActorOptions": {"numCpus": 1}}
    }
    rayservice, config = render(doc, rayservice_validator)
    (deployment,) = config["applications"][0]["deployments"]
    assert deployment["autoscaling_config"]["min_replicas"] == 0  # scale to zero
    assert deployment["autoscaling_config"]["initial_replicas"] == 2
    assert deployment["max_ongoing_requests"] == 40 and deployment["ray_actor_options"]["num_cpus"] == 1
    (group,) = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 0, 3)  # the head stays
    del doc["spec"]["deployments"]
    (deployment,) = render(doc, rayservice_validator)[1]["applications"][0]["deployments"]
    assert deployment["max_ongoing_requests"] == 16  # derived (2 x maxBatchSize), and visible


def test_builtin_server_gets_the_request_limits_and_the_services_name(rayservice_validator: Any) -> None:
    """spec.requestLimits reach the built-in server's args (its 413s), and the model's name in OpenAI
    requests and /v1/models is the ModelService's; both pass the server's own ServeArgs."""
    pytest.importorskip("ray.serve", reason="the workload stack is not installed: run `make setup`")
    from rayship.api import ServeArgs

    doc = yaml.safe_load((Path(__file__).parent / "specs" / "modelservice-uri-cpu.yaml").read_text())
    doc["spec"]["requestLimits"] = {"maxRequestBytes": 65536, "maxRowsPerRequest": 64}
    _, config = render(doc, rayservice_validator)
    args = ServeArgs.model_validate(config["applications"][0]["args"])
    assert (args.max_request_bytes, args.max_rows_per_request) == (65536, 64)
    assert args.model_name == doc["metadata"]["name"]
    del doc["spec"]["requestLimits"]
    args = ServeArgs.model_validate(render(doc, rayservice_validator)[1]["applications"][0]["args"])
    assert (args.max_request_bytes, args.max_rows_per_request) == (8 * 1024 * 1024, 4096)  # the defaults


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"replicas": {"min": 1, "max": 3, "initial": 4}},
            "spec.replicas.initial (4) is not within spec.replicas.min..spec.replicas.max (1..3)",
        ),
        (
            {"deployments": {"Other": {"replicas": 1}}},
            "the built-in model server has one deployment, RayshipModel",
        ),
        ({"deployments": {"RayshipModel": {"replicas": 2}}}, "its replicas come from spec.replicas"),
        (
            {"application": {"importPath": "pipeline"}},
            "importPath: 'pipeline' is not valid: expected module:attribute, e.g. myapp.serve:app_builder",
        ),
        (  # a field under a mapping's key: the allowed fields of its model are named
            {"application": {"importPath": "p:app"}, "deployments": {"A": {"autoscaling": {"min": 1}}}},
            "spec.deployments.A.autoscaling.min: unknown field; allowed here: "
            "minReplicas, maxReplicas, initialReplicas, targetOngoingRequests",
        ),
        (
            {"application": {"importPath": "p:app", "args": {"modelUri": "/x"}}},
            "modelUri: set by rayship from spec.model",
        ),
        (
            {
                "application": {"importPath": "p:app"},
                "deployments": {"A": {"replicas": 1, "autoscaling": {}}},
            },
            "set replicas (a fixed count) or autoscaling, not both",
        ),
        (
            {
                "application": {"importPath": "p:app"},
                "deployments": {"A": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}},
            },
            "spec.deployments.A.autoscaling.minReplicas (3) is more than spec.deployments.A.autoscaling.maxReplicas (2)",
        ),
        (
            {"application": {"importPath": "p:app", "runtimeEnv": {"workingDir": "."}}},
            "spec.application.runtimeEnv.workingDir: a local folder is uploaded to the claim the Ray pods "
            "mount, and this service mounts none: set spec.storage.pvc",
        ),
        (
            {"requestLimits": {"maxRequestBytes": 0}},
            "spec.requestLimits.maxRequestBytes: input should be greater",
        ),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], message: str
) -> None:
    doc = yaml.safe_load((Path(__file__).parent / "specs" / "modelservice-uri-cpu.yaml").read_text())
    doc["spec"].update(spec)
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) != 0
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


# --- engine: vllm (Ray Serve LLM's OpenAI app; it cannot run here: no vLLM, no GPU) ---------------


def vllm_doc(**spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((Path(__file__).parent / "specs" / "modelservice-uri-cpu.yaml").read_text())
    doc["spec"].update(
        image="rayproject/ray-llm:2.60.0-py311-cu128",
        engine="vllm",
        resources={"gpus": 2, "cpus": 8, "memory": "48Gi"},
        replicas={"min": 1, "max": 3, "initial": 2},
        vllm={
            "modelId": "team-a/chat",
            "maxModelLen": 4096,
            "tensorParallelSize": 2,
            "engineArgs": {"enable_prefix_caching": True},
        },
    )
    doc["spec"].update(spec)
    return doc


def ray_llm_config(args: dict[str, Any]) -> Any:
    """Each `llm_configs[]` entry through Ray's own LLMConfig (its pydantic model imports without vLLM;
    `ray.serve.llm` itself does not: `ImportError: Neither vLLM nor SGLang is installed`)."""
    llm = pytest.importorskip(
        "ray.llm._internal.serve.core.configs.llm_config", reason="the workload stack is not installed"
    )
    assert set(args) == {"llm_configs"}  # LLMServingArgs' required field; the rest keep Ray's defaults
    (entry,) = args["llm_configs"]
    return llm.LLMConfig.model_validate(entry)


def test_vllm_renders_ray_serve_llms_openai_app(rayservice_validator: Any) -> None:
    rayservice, config = render(vllm_doc(), rayservice_validator)
    (app,) = config["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app" and app["route_prefix"] == "/chat/v1"
    assert "deployments" not in app  # Ray Serve LLM names and sizes its own deployments
    llm = ray_llm_config(app["args"])
    assert llm.model_loading_config.model_id == "team-a/chat"
    assert llm.model_loading_config.model_source.bucket_uri == URI  # Ray mirrors the s3:// model itself
    assert llm.engine_kwargs == {
        "enable_prefix_caching": True,
        "tensor_parallel_size": 2,
        "max_model_len": 4096,
    }
    assert llm.deployment_config["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 3,
        "initial_replicas": 2,
        "target_ongoing_requests": 5.0,
    }
    (group,) = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["image"] == "rayproject/ray-llm:2.60.0-py311-cu128"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_vllm_reads_a_mounted_model_by_path_and_defaults_to_the_services_name(
    rayservice_validator: Any,
) -> None:
    doc = vllm_doc(vllm=None, resources={"gpus": 1})
    del doc["spec"]["vllm"]
    doc["spec"]["storage"] = {"pvc": {"claimName": "models", "mountPath": "/mnt/models"}}
    rayservice = modelservice.desired_rayservice(parse(doc), CONFIG, "/mnt/models/chat/model")
    assert rayservice_validator.errors(rayservice) == []
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    llm = ray_llm_config(app["args"])
    assert llm.model_loading_config.model_id == "llm-chat"
    assert llm.model_loading_config.model_source == "/mnt/models/chat/model"
    assert llm.engine_kwargs == {"tensor_parallel_size": 1}


@pytest.mark.parametrize("uri", [URI, "/mnt/models/chat/model"])
def test_the_rollout_reads_the_model_serve_deploys_for_vllm_too(uri: str) -> None:
    args = modelservice.vllm_args(parse(vllm_doc()), uri)
    body = json.dumps(
        {"applications": {"llm-chat": {"status": "RUNNING", "deployed_app_config": {"args": args}}}}
    )
    assert modelservice.serve_state("llm-chat", 200, body) == modelservice.ServeState("RUNNING", uri)


def test_vllm_waits_for_a_language_model() -> None:
    doc = vllm_doc(model={"fromTrainingJob": {"name": "tabular"}})
    job = {
        "spec": {"trainer": {"recipe": "mlp"}},
        "status": {"phase": "Succeeded", "checkpoint": {"model": URI}},
    }
    resolution = modelservice.resolve_model(parse(doc), job, {})
    assert resolution.uri is None and resolution.reason == "NotALanguageModel", resolution
    assert "trains recipe mlp" in resolution.message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"image": None}, "engine vllm needs an image with vLLM in spec.image"),
        ({"application": {"importPath": "p:app"}}, "remove application (or the engine)"),
        ({"engine": "rayship"}, "vllm: settings of engine vllm; set engine: vllm or remove them"),
        ({"resources": {"gpus": 0}}, "engine vllm runs on GPUs: set resources.gpus to at least 1"),
        ({"resources": {"gpus": 1}}, "vllm.tensorParallelSize (2) is more than resources.gpus (1)"),
        (
            {"deployments": {"RayshipModel": {"maxOngoingRequests": 4}}},
            "engine vllm names its own deployments",
        ),
        (
            {"vllm": {"engineArgs": {"max_model_len": 8}}},
            "max_model_len: set by vllm.maxModelLen; remove it from engineArgs",
        ),
        ({"vllm": {"gpuMemoryUtilization": 1.5}}, "spec.vllm.gpuMemoryUtilization"),
        (
            {"model": None, "models": {"a": {"uri": URI}, "b": {"uri": URI}}},
            "models: engine vllm serves one model per ModelService",
        ),
    ],
)
def test_vllm_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], message: str
) -> None:
    doc = vllm_doc(**spec)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", "-f", str(path)]) != 0
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_rayship_serve_says_vllm_is_for_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(vllm_doc()))
    assert cli.main(["serve", "-f", str(path), "--runs-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "spec.engine: vllm needs vLLM and GPUs" in err and err.count("\n") == 1, err
