"""The RayJob renderer: golden files, the strict KubeRay schema, KubeRay's own rules, GPU facts."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from rayship import rbac
from rayship.api import names
from rayship.api.validation import parse_trainingjob
from rayship.config import OperatorConfig
from rayship.controller import trainingjob
from tests.conftest import SAMPLES, handed_document, rayship_samples
from tools.kuberay_rules import rayjob_violations

GOLDEN = Path(__file__).parent / "golden"
SPECS = [
    p
    for p in rayship_samples() + sorted((Path(__file__).parent / "specs").glob("*.yaml"))
    if yaml.safe_load(p.read_text())["kind"] == "TrainingJob"
]
CONFIG = OperatorConfig()


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def rendered_all(path: Path, config: OperatorConfig = CONFIG) -> list[dict]:
    return trainingjob.render_trainingjob(parse_trainingjob(load(path)), config)


def rendered(path: Path, config: OperatorConfig = CONFIG) -> dict:
    (rayjob,) = [o for o in rendered_all(path, config) if o["kind"] == "RayJob"]
    return rayjob


def pods(rayjob: dict) -> list[dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cluster["workerGroupSpecs"]
    ]


def worker_group(rayjob: dict) -> dict:
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_matches_golden(spec: Path) -> None:
    golden = GOLDEN / f"{spec.stem}.rayjob.yaml"
    text = yaml.safe_dump_all(rendered_all(spec), sort_keys=False, width=120)
    if os.environ.get("RAYSHIP_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file; run with RAYSHIP_UPDATE_GOLDEN=1 to create {golden.name}"
    assert text == golden.read_text(), (
        f"render changed; review and run RAYSHIP_UPDATE_GOLDEN=1 ({golden.name})"
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_strictly_valid_against_kuberay_crd(spec: Path, rayjob_validator) -> None:
    assert rayjob_validator.errors(rendered(spec)) == []


def test_strict_validator_catches_a_pruned_field(rayjob_validator) -> None:
    """The check can fail: a misspelt field deep in a pod template is reported, not pruned."""
    rayjob = rendered(SAMPLES / "trainingjob-ddp.yaml")
    worker_group(rayjob)["template"]["spec"]["containers"][0]["resource"] = {"limits": {}}
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    errors = rayjob_validator.errors(rayjob)
    assert any("'resource' was unexpected" in e for e in errors), errors
    assert any("num-cpus" in e for e in errors), errors


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_obeys_kuberay_validation_rules(spec: Path) -> None:
    assert rayjob_violations(rendered(spec)) == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_render_is_deterministic_and_pure(spec: Path) -> None:
    doc = load(spec)
    reordered = json.loads(json.dumps(doc, sort_keys=True))  # same content, other key order
    before = copy.deepcopy(doc)
    first = trainingjob.render_trainingjob(parse_trainingjob(doc), CONFIG)
    assert trainingjob.render_trainingjob(parse_trainingjob(reordered), CONFIG) == first
    assert doc == before, "the renderer must not mutate its input"


def test_gpu_workers_really_get_gpus() -> None:
    rayjob = rendered(SAMPLES / "trainingjob-ddp.yaml")
    group = worker_group(rayjob)
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == container["resources"]["requests"]
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in group["template"][
        "spec"
    ]["tolerations"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container["env"]}


def test_an_elastic_worker_group_keeps_replicas_pods_and_allows_down_to_min_replicas() -> None:
    doc = load(SAMPLES / "trainingjob-ddp.yaml")
    doc["spec"]["workers"].update(replicas=4, minReplicas=2)
    (rayjob,) = [
        o for o in trainingjob.render_trainingjob(parse_trainingjob(doc), CONFIG) if o["kind"] == "RayJob"
    ]
    group = worker_group(rayjob)
    # KubeRay re-creates a pod taken away (replicas); Ray Train goes on with >= 2 meanwhile
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (4, 2, 4)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    assert rayjob_violations(rayjob) == []


def test_a_tuning_jobs_worker_group_holds_every_trial_that_runs_at_once() -> None:
    """Each trial trains on workers.replicas workers of its own: a search that runs 2 trials at once
    needs twice the pods (with one group's worth, the second trial waited for workers that never came:
    examples/tune-pbt hung on real-0), and no more than the search has trials."""
    doc = load(SAMPLES / "trainingjob-tuning.yaml")  # 4 workers of 1 GPU, maxConcurrentTrials 2
    doc["spec"]["workers"]["minReplicas"] = 3
    tj = parse_trainingjob(doc)
    (rayjob,) = [o for o in trainingjob.render_trainingjob(tj, CONFIG) if o["kind"] == "RayJob"]
    group = worker_group(rayjob)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (8, 6, 8)
    assert trainingjob.total_gpus(tj) == 8  # what the status and a queue count
    assert rayjob_violations(rayjob) == []
    doc["spec"]["tuning"].update(
        numSamples=1,
        maxConcurrentTrials=4,
        searchSpace={"learningRate": {"distribution": "grid", "values": [0.01, 0.001]}},
    )  # 2 trials: 4 at once is 2 at once
    (rayjob,) = [
        o for o in trainingjob.render_trainingjob(parse_trainingjob(doc), CONFIG) if o["kind"] == "RayJob"
    ]
    assert worker_group(rayjob)["replicas"] == 8
    del doc["spec"]["tuning"]
    assert trainingjob.total_gpus(parse_trainingjob(doc)) == 4


@pytest.mark.parametrize(("grace", "drain"), [(None, "25"), (10, "5"), (120, "115"), (6, "3"), (0, "0")])
def test_rays_drain_on_sigterm_ends_before_the_kubelets_kill(grace: int | None, drain: str) -> None:
    """A worker pod taken away with notice: Ray's drain deadline (Ray Train restarts the group there,
    a preemption) comes before the kill at the pod's grace period, which the spec sets."""
    doc = load(SAMPLES / "trainingjob-ddp.yaml")
    if grace is not None:
        doc["spec"]["workers"]["terminationGracePeriodSeconds"] = grace
    (rayjob,) = [
        o for o in trainingjob.render_trainingjob(parse_trainingjob(doc), CONFIG) if o["kind"] == "RayJob"
    ]
    worker = worker_group(rayjob)["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] == (30 if grace is None else grace)
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == drain
    assert env["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "1"
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "value": "1"} in head["env"]
    # the head drains nothing (its supervisor and Ray Train's controller stay to the end): it goes at once
    assert {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"} in head["env"]


def test_gpu_product_selects_nodes_and_extra_placement_is_kept() -> None:
    rayjob = rendered(Path(__file__).parent / "specs" / "deepspeed-zero3-s3.yaml")
    spec = worker_group(rayjob)["template"]["spec"]
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "topology.kubernetes.io/zone": "us-east-1a",
    }
    assert spec["tolerations"][-1] == {
        "key": "dedicated",
        "operator": "Equal",
        "value": "training",
        "effect": "NoSchedule",
    }
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_head_runs_no_training_and_sees_no_gpu() -> None:
    rayjob = rendered(SAMPLES / "trainingjob-ddp.yaml")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    (container,) = head["template"]["spec"]["containers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert "tolerations" not in head["template"]["spec"]


def test_cpu_only_workers_hide_gpus_and_get_millicores() -> None:
    rayjob = rendered(Path(__file__).parent / "specs" / "cpu-only-long-name.yaml")
    spec = worker_group(rayjob)["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "2Gi"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    assert "tolerations" not in spec and "nodeSelector" not in spec


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_pod_has_shm_checkpoints_and_secure_defaults(spec: Path) -> None:
    doc = parse_trainingjob(load(spec))
    rayjob = rendered(spec)
    assert rayjob["spec"]["submissionMode"] == "HTTPMode" and "submitterPodTemplate" not in rayjob["spec"]
    for pod in pods(rayjob):
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for pod in pods(rayjob):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["/dev/shm"] == "dshm"
        pvc = doc.spec.checkpoint.storage.pvc
        if pvc:
            assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": pvc.claim_name}
            assert mounts[pvc.mount_path] == "checkpoints"
        else:
            assert "checkpoints" not in volumes


def test_no_zombie_clusters_and_failure_policy() -> None:
    rayjob = rendered(Path(__file__).parent / "specs" / "deepspeed-zero3-s3.yaml")
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 120
    assert spec["backoffLimit"] == 1
    assert spec["activeDeadlineSeconds"] == 172800
    assert rayjob["metadata"]["labels"][names.LABEL_KUEUE_QUEUE] == "team-a-gpus"
    assert all(p["priorityClassName"] == "high" for p in pods(rayjob))
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False


def test_suspend_is_passed_through() -> None:
    assert rendered(Path(__file__).parent / "specs" / "cpu-only-long-name.yaml")["spec"]["suspend"] is True
    assert rendered(SAMPLES / "trainingjob-ddp.yaml")["spec"]["suspend"] is False


def test_secrets_only_by_reference() -> None:
    rayjob = rendered(Path(__file__).parent / "specs" / "deepspeed-zero3-s3.yaml")
    env = {e["name"]: e for e in worker_group(rayjob)["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret-key"}},
    }
    assert env["RAYSHIP_TRAININGJOB"]["value"] == "team-a/llm-zero3"


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_the_driver_reads_the_resolved_trainingjob_from_the_spec_secret(spec: Path) -> None:
    doc = parse_trainingjob(load(spec))
    handed = parse_trainingjob(handed_document(rendered_all(spec)))
    assert handed.metadata.name == doc.metadata.name
    assert handed.spec.image == (doc.spec.image or CONFIG.default_image)
    assert handed.spec.ray_version == CONFIG.default_ray_version
    assert handed.spec.trainer == doc.spec.trainer and handed.spec.checkpoint == doc.spec.checkpoint


def test_workload_rbac_is_least_privilege_and_used_by_the_ray_pods() -> None:
    objects = rendered_all(SAMPLES / "trainingjob-ddp.yaml")
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "RoleBinding",
        "NetworkPolicy",
        "Secret",
        "RayJob",
    ]
    account, binding, _, _, rayjob = objects
    assert account["metadata"]["name"] == binding["metadata"]["name"] == "mlp-ddp-workload"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": names.WORKLOAD_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mlp-ddp-workload", "namespace": "default"}
    ]
    assert all(p["serviceAccountName"] == "mlp-ddp-workload" for p in pods(rayjob))
    # The ClusterRole it binds: patch TrainingJob status, nothing else (the chart's admission policy
    # narrows it to the job's own TrainingJob: tests/operator, on the real API server).
    (role,) = [o for o in rbac.workload_objects() if o["kind"] == "ClusterRole"]
    assert role["metadata"]["name"] == names.WORKLOAD_ROLE
    assert role["rules"] == [
        {"apiGroups": ["rayship.dev"], "resources": ["trainingjobs/status"], "verbs": ["patch"]}
    ]
    # The operator may bind that ClusterRole and no other; it makes no Roles.
    binds = [r for r in rbac.OPERATOR_RULES if "bind" in r["verbs"]]
    assert binds == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [names.WORKLOAD_ROLE],
            "verbs": ["bind"],
        }
    ]
    assert not any("roles" in r["resources"] for r in rbac.OPERATOR_RULES)


def test_the_workload_role_is_the_chart_releases_own() -> None:
    """Each chart release has its own ClusterRole (RAYSHIP_WORKLOAD_ROLE): every job's RoleBinding binds
    that one, and the release's operator may bind it and no other (two releases never share one)."""
    config = OperatorConfig(workload_role=names.workload_role("team-b-rayship"))
    (binding,) = [
        o
        for o in trainingjob.render_trainingjob(
            parse_trainingjob(load(SAMPLES / "trainingjob-ddp.yaml")), config
        )
        if o["kind"] == "RoleBinding"
    ]
    assert binding["roleRef"]["name"] == "team-b-rayship-workload"
    assert OperatorConfig().workload_role == names.WORKLOAD_ROLE == names.workload_role("rayship")
    assert (
        names.WORKLOAD_POLICY == names.workload_policy("rayship") == "rayship-workload-writes-its-own-status"
    )
    rules = rbac.operator_rules("team-b-rayship-workload")
    (bind,) = [r for r in rules if "bind" in r["verbs"]]
    assert bind["resourceNames"] == ["team-b-rayship-workload"]
    assert [r for r in rules if r is not bind] == [r for r in rbac.OPERATOR_RULES if "bind" not in r["verbs"]]
    assert rbac.operator_rules(names.WORKLOAD_ROLE) == rbac.OPERATOR_RULES
    role, policy, policy_binding = rbac.workload_objects("a-workload", "a-policy")
    assert role["metadata"]["name"] == "a-workload" and policy["metadata"]["name"] == "a-policy"
    assert policy_binding["metadata"]["name"] == policy_binding["spec"]["policyName"] == "a-policy"
    assert policy["spec"] == rbac.workload_policy()  # the same for every release


def test_workload_accounts_always_end_in_the_suffix_the_admission_policy_matches() -> None:
    for name in ("mlp", "x" * 54, "x" * 55, "x" * 253, "7-starts-with-digit", "a.b"):
        account = names.workload_account(name)
        assert account.endswith(names.WORKLOAD_SUFFIX) and len(account) <= 63, account
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", account), account
    assert names.workload_account("mlp-ddp") == "mlp-ddp-workload"
    assert names.workload_account("x" * 54) == "x" * 54 + "-workload"
    assert names.workload_account("x" * 55) != names.workload_account("x" * 54 + "y")


def test_long_names_are_truncated_stably_and_distinctly() -> None:
    a = "a-very-long-training-job-name-that-exceeds-kuberay-limits-x1"
    b = "a-very-long-training-job-name-that-exceeds-kuberay-limits-x2"
    assert names.rayjob_name(a) == names.rayjob_name(a)
    assert names.rayjob_name(a) != names.rayjob_name(b)
    for name in (a, b, "7-starts-with-digit", "x" * 47, "x" * 48):
        out = names.rayjob_name(name)
        assert len(out) <= 47 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", out), out
    assert names.rayjob_name("mlp-ddp") == "mlp-ddp"
    assert names.rayjob_name("x" * 47) == "x" * 47


def test_owner_labels_on_rayjob_and_pods() -> None:
    rayjob = rendered(SAMPLES / "trainingjob-ddp.yaml")
    for labels in [rayjob["metadata"]["labels"]] + [
        g["template"]["metadata"]["labels"]
        for g in [rayjob["spec"]["rayClusterSpec"]["headGroupSpec"], worker_group(rayjob)]
    ]:
        assert labels[names.LABEL_TRAININGJOB] == "mlp-ddp"
        assert labels["app.kubernetes.io/part-of"] == "rayship"
        assert labels["app.kubernetes.io/managed-by"] == "rayship-operator"


def test_operator_config_changes_defaults() -> None:
    config = OperatorConfig(
        default_image="example/img:1",
        default_ray_version="2.61.0",
        gpu_tolerations=[],
        gpu_node_selector={"pool": "gpu"},
    )
    rayjob = rendered(SAMPLES / "trainingjob-ddp.yaml", config)
    spec = worker_group(rayjob)["template"]["spec"]
    assert spec["containers"][0]["image"] == "example/img:1"
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == "2.61.0"
    assert "tolerations" not in spec and spec["nodeSelector"] == {"pool": "gpu"}


def test_without_cpu_limits_every_ray_pod_requests_cpu_uncapped_and_keeps_its_other_limits() -> None:
    """`cpuLimits: false` (chart): Burstable pods that may use CPU the node leaves idle; KubeRay
    still gives Ray the request as num-cpus (its fallback when there is no limit)."""
    capped = rendered(SAMPLES / "trainingjob-ddp.yaml")
    uncapped = rendered(SAMPLES / "trainingjob-ddp.yaml", CONFIG.model_copy(update={"cpu_limits": False}))
    for rayjob, cpu_limited in ((capped, True), (uncapped, False)):
        cluster = rayjob["spec"]["rayClusterSpec"]
        for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
            (container,) = group["template"]["spec"]["containers"]
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert ("cpu" in limits) is cpu_limited and "cpu" in requests
            assert {k: v for k, v in limits.items() if k != "cpu"} == {
                k: v for k, v in requests.items() if k != "cpu"
            }
    gpus = worker_group(uncapped)["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpus[CONFIG.gpu_resource] == "1" and "memory" in gpus


CANARY = "canary-7f3a9d"


def test_a_value_of_any_free_form_field_is_nowhere_in_the_rayjob_but_in_the_secret_it_references() -> None:
    """A canary in every field a private value may be put in (env values, runtimeEnv.envVars,
    trainer.config, hyperparameter choices, the tracking experiment, data, validation and checkpoint
    URIs): the RayJob (readable by anyone who may `get rayjobs`; its entrypoint and runtime env shown
    on Ray's dashboard) holds none of them; the spec Secret it references holds each, and the pods
    read env values by reference to it."""
    doc = load(SAMPLES / "trainingjob-tuning.yaml")
    spec = doc["spec"]
    spec["env"] = [{"name": "HF_TOKEN", "value": f"{CANARY}-env"}]
    spec["runtimeEnv"] = {"envVars": {"LOG_PREFIX": f"{CANARY}-runtime"}, "pip": ["emoji==2.14.1"]}
    spec["trainer"]["config"] = {"note": f"{CANARY}-config"}
    spec["tuning"]["searchSpace"]["config.note"] = {"distribution": "choice", "values": [f"{CANARY}-choice"]}
    spec["tracking"] = {
        "mlflow": {"trackingUri": "https://mlflow.example.com", "experiment": f"{CANARY}-exp"}
    }
    spec["data"] = {
        "source": "uri",
        "uri": f"s3://bucket/{CANARY}-data.parquet",
        "validation": {"uri": f"s3://bucket/{CANARY}-val.parquet"},
    }
    spec["checkpoint"]["storage"] = {"uri": f"s3://bucket/{CANARY}-ckpt"}
    canaries = [
        f"{CANARY}-{field}" for field in ("env", "runtime", "config", "choice", "exp", "data", "val", "ckpt")
    ]
    *_, secret, rayjob = trainingjob.render_trainingjob(parse_trainingjob(doc), CONFIG)
    shown = json.dumps(rayjob)
    assert [c for c in canaries if c in shown] == []
    kept = json.dumps(secret["stringData"])
    assert [c for c in canaries if c not in kept] == []
    env = {e["name"]: e for e in pods(rayjob)[0]["containers"][0]["env"]}
    for name, key in (("HF_TOKEN", "env.HF_TOKEN"), ("LOG_PREFIX", "runtime-env.LOG_PREFIX")):
        assert env[name] == {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": key}},
        }


def test_no_env_value_travels_in_the_entrypoint_or_the_annotation() -> None:
    """The entrypoint shows in Ray's job list and dashboard, the annotation to anyone who reads the
    RayJob: env values stay in the pod spec (where a Secret reference belongs)."""
    doc = load(SAMPLES / "trainingjob-ddp.yaml")
    doc["spec"]["env"] = [{"name": "WANDB_API_KEY", "value": "hunter2-very-secret"}]
    tj = parse_trainingjob(doc)
    rayjob = trainingjob.build_rayjob(tj, CONFIG)
    assert "hunter2" not in rayjob["spec"]["entrypoint"]
    assert "hunter2" not in json.dumps(rayjob["metadata"]["annotations"])
    assert trainingjob.secret_looking_env(tj) == [
        "spec.env[0] WANDB_API_KEY: a plain value that looks like a secret; use valueFrom.secretKeyRef"
    ]
    # An edit of the value is still seen (the annotation keeps a digest).
    rayjob["metadata"]["ownerReferences"] = [
        {"uid": "u", "kind": "TrainingJob", "name": "mlp-ddp", "controller": True}
    ]
    edited = copy.deepcopy(doc)
    edited["spec"]["env"][0]["value"] = "another"
    edited["metadata"]["uid"] = "u"
    assert trainingjob.plan(edited, rayjob, [], CONFIG).context.unapplied == ("env",)


def test_a_tuning_heads_ray_holds_the_trial_drivers_and_no_cpus() -> None:
    """Tune trial drivers run on the head (a slot of names.TRIAL_RESOURCE each), never on a worker node,
    where their CPU share left a one-CPU worker pod too little for the trial's Train worker."""
    from rayship_workloads.tune import trial_resources

    head = rendered(SAMPLES / "trainingjob-tuning.yaml")["spec"]["rayClusterSpec"]["headGroupSpec"]
    params = head["rayStartParams"]
    assert params["num-cpus"] == "0"
    # KubeRay's documented form: JSON escaped inside double quotes (its shell command unquotes it)
    assert params["resources"] == '"{\\"rayship_trial\\": 1000}"'
    assert json.loads(params["resources"][1:-1].replace("\\", "")) == {
        names.TRIAL_RESOURCE: names.TRIAL_SLOTS
    }
    plain = rendered(SAMPLES / "trainingjob-ddp.yaml")["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert plain["rayStartParams"] == {"num-cpus": "0"}
    assert trial_resources({"CPU": 2.0, names.TRIAL_RESOURCE: 1000.0}) == {names.TRIAL_RESOURCE: 1}
    assert trial_resources({"CPU": 2.0}) == {"CPU": 0.01}  # local Ray: no head of its own


def test_the_workload_account_carries_the_labels_the_admission_policy_selects_its_params_by() -> None:
    """The chart's policy judges rayship's workload accounts only (its params, selected by
    rbac.WORKLOAD_ACCOUNT_LABELS): an account made without them would go unjudged, free to write any
    TrainingJob's status that its RoleBinding allows."""
    (account,) = [o for o in rendered_all(SAMPLES / "trainingjob-ddp.yaml") if o["kind"] == "ServiceAccount"]
    assert rbac.WORKLOAD_ACCOUNT_LABELS.items() <= account["metadata"]["labels"].items()
