"""`rayship get`, `rayship status` and the cluster flags against the real control plane: a suspended
CPU TrainingJob (no Ray pod starts) and a ModelService of the same name waiting for it, both reconciled by
the rayship operator; the CLI run as a user runs it (a fresh `rayship` process, the cluster's kubeconfig),
its output read as a user reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from controlplane import cluster as controlplane
from rayship import api
from rayship.cli import kube as cli_kube
from tests.operator.kube import Kube, sample, wait_for

pytestmark = pytest.mark.operator

TJ, MS = api.TRAININGJOBS, api.MODELSERVICES
NAME = "cli-job"


def rayship(kubeconfig: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "rayship.cli", *argv, "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def ok(kubeconfig: Path, *argv: str) -> str:
    done = rayship(kubeconfig, *argv)
    assert done.returncode == 0 and done.stderr == "", (argv, done.returncode, done.stderr)
    return done.stdout


def error(kubeconfig: Path, *argv: str) -> str:
    """The one line a failing command says (exit code 1)."""
    done = rayship(kubeconfig, *argv)
    assert done.returncode == cli_kube.EXIT_ERROR and done.stdout == "", (argv, done.returncode, done.stdout)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    return done.stderr.removeprefix("error: ").rstrip("\n")


@pytest.fixture
def settled(kube: Kube, operator) -> str:
    """A suspended TrainingJob and a ModelService of the same name waiting for it, each with the status
    and the Event the operator gave it."""
    kube.pvc()
    kube.create(TJ, sample(NAME, suspend=True))
    kube.create(MS, sample(NAME, "kind-modelservice-cpu.yaml", model={"fromTrainingJob": {"name": NAME}}))
    wait_for(lambda: kube.status(TJ, NAME).get("phase") == "Suspended", 60, what="the job Suspended")
    wait_for(lambda: kube.status(MS, NAME).get("phase") == "WaitingForModel", 60, what="the service waiting")
    wait_for(lambda: [e for e in kube.events(NAME) if e[1] == "RayJobCreated"], 30, what="the job's Event")
    return kube.namespace


def test_get_lists_as_kubectl_with_the_crds_columns(cluster, kube: Kube, settled: str) -> None:
    config, ns = cluster.kubeconfig, settled
    table = ok(config, "get", "tj", "-n", ns).splitlines()
    assert table[0].split() == ["NAME"] + [c.name.upper() for c in api.TRAINING_JOB.columns if not c.priority]
    (row,) = table[1:]
    assert row.split()[:3] == [NAME, "Suspended", "2"]  # name, phase, spec.workers.replicas
    assert ok(config, "get", "trainingjobs", "-n", ns, "-o", "name") == f"trainingjob.rayship.dev/{NAME}\n"
    listed = json.loads(ok(config, "get", "TrainingJob", "-n", ns, "-o", "json"))
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == [NAME]
    assert (
        listed["items"][0]["status"]["phase"] == "Suspended" and listed["items"][0]["kind"] == "TrainingJob"
    )
    one = yaml.safe_load(ok(config, "get", f"tj/{NAME}", "-n", ns, "-o", "yaml"))
    assert one["metadata"]["uid"] == kube.get(TJ, NAME)["metadata"]["uid"]
    wide = ok(config, "get", "tj", "-n", ns, "-o", "wide").splitlines()
    assert wide[0].endswith("LAST ERROR") and wide[1].startswith(NAME)
    everywhere = [line.split() for line in ok(config, "get", "tj", "-A").splitlines()]
    assert everywhere[0][:2] == ["NAMESPACE", "NAME"] and [ns, NAME, "Suspended"] in [
        r[:3] for r in everywhere
    ]
    services = ok(config, "get", "ms", "-n", ns).splitlines()
    assert services[0].split()[:2] == ["NAME", "PHASE"] and services[1].split()[:2] == [
        NAME,
        "WaitingForModel",
    ]
    schedules = rayship(config, "get", "ts", "-n", ns)
    assert (schedules.returncode, schedules.stdout, schedules.stderr) == (
        0, "", f"No trainingschedules found in {ns} namespace.\n"
    )  # fmt: skip


def test_status_is_one_screen_with_conditions_events_and_the_next_step(cluster, settled: str) -> None:
    config, ns = cluster.kubeconfig, settled
    screen = ok(config, "status", f"tj/{NAME}", "-n", ns)
    lines = screen.splitlines()
    assert lines[0].split() == ["TrainingJob:", f"{ns}/{NAME}"]
    assert "Phase:      Suspended" in screen or "Phase:       Suspended" in screen
    assert any(line.split()[:2] == ["Workers:", "2"] for line in lines)
    assert any(line.split()[:2] == ["RayJob:", NAME] for line in lines), screen
    conditions = {
        line.split()[0]: line.split()[1:4]
        for line in lines
        if line.startswith("  ") and len(line.split()) > 3
    }
    assert conditions["Valid"][:2] == ["True", "SpecValid"]
    assert conditions["Suspended"][:2] == ["True", "Suspended"] and conditions["Running"][0] == "False"
    events = screen.split("\nEvents (newest last):\n")[1].split("\n\n")[0]
    assert "RayJobCreated" in events and f"created RayJob {NAME}" in events
    assert lines[-1] == (
        f"Next step: resume it: kubectl patch trainingjob {NAME} -n {ns} --type merge -p "
        '\'{"spec":{"suspend":false}}\''
    )
    service = ok(config, "describe", f"ms/{NAME}", "-n", ns)
    assert "Phase:" in service and "WaitingForModel" in service and "ModelAvailable" in service
    assert service.splitlines()[-1] == (
        f"Next step: wait for the TrainingJob it serves from to succeed: rayship status tj/{NAME} -n {ns}"
    )
    # A bare name held by two kinds: one line naming both.
    assert error(config, "status", NAME, "-n", ns) == (
        f"{NAME} in namespace {ns} is a TrainingJob (tj/{NAME}) and a ModelService (ms/{NAME}): say which"
    )


def test_the_contexts_namespace_and_context_flag_are_kubectls(cluster, settled: str, tmp_path: Path) -> None:
    """No -n: the context's namespace; --context picks a context of the kubeconfig."""
    config: dict[str, Any] = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = config["contexts"][0]
    team = {"name": "team", "context": {**context["context"], "namespace": settled}}
    config["contexts"].append(team)
    mine = tmp_path / "kubeconfig"
    mine.write_text(yaml.safe_dump(config))
    assert ok(mine, "get", "tj", "--context", "team", "-o", "name") == f"trainingjob.rayship.dev/{NAME}\n"
    assert f"TrainingJob: {settled}/{NAME}" in ok(mine, "status", f"tj/{NAME}", "--context", "team")
    assert ok(mine, "get", "tj", "-o", "name", "-n", settled) == f"trainingjob.rayship.dev/{NAME}\n"
    nothing = rayship(mine, "get", "tj")  # the current context names no namespace: default
    assert nothing.returncode == 0 and nothing.stderr == "No trainingjobs found in default namespace.\n"


def test_a_missing_object_and_a_refused_read_are_one_line(cluster, kube: Kube, settled: str) -> None:
    config, ns = cluster.kubeconfig, settled
    assert error(config, "status", "tj/nope", "-n", ns) == f"trainingjob nope in namespace {ns} not found"
    assert error(config, "get", "ms", "nope", "-n", ns) == f"modelservice nope in namespace {ns} not found"
    assert error(config, "status", "nope", "-n", ns) == (
        f"no TrainingJob, ModelService or TrainingSchedule named nope in namespace {ns}"
    )
    assert error(config, "logs", "tj/nope", "-n", ns) == f"trainingjob nope not found in namespace {ns}"
    # A ServiceAccount no Role grants anything: the API server refuses its reads.
    kubernetes.client.CoreV1Api(kube.client).create_namespaced_service_account(
        ns, {"metadata": {"name": "nobody"}}
    )
    nobody = controlplane.service_account_kubeconfig(ns, "nobody")
    refused = error(nobody, "get", "tj", "-n", ns)
    assert refused.startswith("forbidden: trainingjobs.rayship.dev is forbidden: ")
    assert f'"system:serviceaccount:{ns}:nobody" cannot list resource "trainingjobs"' in refused
    assert refused.endswith("ask a cluster admin for that permission (a Role or ClusterRole bound to you), "
                            "or use a context that has it (--context)")  # fmt: skip
    assert error(nobody, "status", f"tj/{NAME}", "-n", ns).startswith("forbidden: ")
