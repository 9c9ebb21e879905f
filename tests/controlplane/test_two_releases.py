"""Two releases of the chart side by side on the local control plane, as platform teams install them:
each in its own namespace, watching its own namespace (`watchNamespaces`), the second and third
beside the cluster's own release `rayship` (which installed the CRDs: these set crds.install=false).

Each release's operator runs as the chart's Deployment would run it (its args, env and
ServiceAccount: the release's own RBAC decides every request), as a host process, as the tier runs
the cluster's own operator where the real node does not run. Each reconciles the TrainingJob in its
namespace (suspended: nothing runs) and says nothing of the other's; each job's Ray pods are bound to
their own release's ClusterRole and pass every release's admission policy for their own job's status.
Uninstalled, a release leaves nothing behind and takes nothing of the other's.

The cluster's own operator watches every namespace: while these run it is stopped (or its Deployment
scaled to 0 where it runs on real-0), and started again after.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from controlplane import cluster as controlplane
from controlplane.config import CHART, VENV_BIN
from controlplane.processes import (
    Paths,
    Proc,
    clean_env,
    free_port,
    http_ok,
    load_state,
    node_running,
    spawn_process,
    stop_process,
    wait_until,
)
from rayship import api
from rayship.api import names
from tests.operator.conftest import refused_lines
from tests.operator.kube import Kube, sample, wait_for

pytestmark = pytest.mark.controlplane

TJ = api.TRAININGJOBS
RJ = api.RAYJOBS
ACCOUNT = names.workload_account("job")  # the Ray pods' ServiceAccount of each release's job "job"


@dataclass
class Release:
    name: str  # the helm release
    namespace: str  # where it is installed (its operator, ServiceAccount, token key)
    watched: str  # the one namespace its operator watches
    full: str = ""  # its full name (the Deployment's), read once installed
    operator: Proc | None = None
    kubeconfig: Path | None = None  # its operator's: a token of the release's ServiceAccount
    log: Path | None = None
    log_from: int = 0

    def written(self) -> str:
        assert self.log is not None
        return self.log.read_bytes()[self.log_from :].decode(errors="replace")


def helm(cluster, home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = clean_env(
        Paths(),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    argv = [str(VENV_BIN / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert result.returncode == 0, f"{' '.join(args[:2])}: {result.stdout}{result.stderr}"
    return result


@contextlib.contextmanager
def own_operator_quiet(api) -> Iterator[None]:
    """The cluster's own operator (it watches every namespace) stopped meanwhile, and as it was after:
    the host process started again, or the Deployment on real-0 scaled back to 1."""
    state = load_state(Paths())
    running = state.procs.get("rayship-operator")
    host = running is not None and running.alive()
    pod = node_running(state) and bool(controlplane.operator_deployment(api).spec.replicas)
    if host:
        controlplane.stop_operator()
    if pod:
        controlplane.scale_operator(0)
    try:
        yield
    finally:
        if host:
            controlplane.start_operator()
        if pod:
            controlplane.scale_operator(1)


def start_release_operator(release: Release, client: Any) -> None:
    """The release's operator on this host, with its Deployment's args and env, as its ServiceAccount."""
    apps = kubernetes.client.AppsV1Api(client)
    (deployment,) = apps.list_namespaced_deployment(
        release.namespace, label_selector=f"app.kubernetes.io/instance={release.name}"
    ).items
    release.full = deployment.metadata.name
    pod = deployment.spec.template.spec
    (container,) = pod.containers
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    args = list(container.args)
    args[args.index("--liveness") + 1] = liveness
    env = {e.name: e.value for e in container.env if e.value is not None}
    env["RAYSHIP_METRICS_PORT"] = "0"  # the chart's 9090 would clash with the other's
    kubeconfig = controlplane.service_account_kubeconfig(release.namespace, pod.service_account_name)
    release.kubeconfig = kubeconfig
    paths = Paths()
    full_env = clean_env(paths, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1", **env)
    full_env["PATH"] = f"{VENV_BIN}:{full_env['PATH']}"
    if os.environ.get("PYTHONPATH"):  # the caller's sources (a git worktree's), as start_operator does
        full_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    name = f"rayship-operator-{release.name}"
    release.log = paths.logs / f"{name}.log"
    release.log_from = release.log.stat().st_size if release.log.exists() else 0
    release.operator = spawn_process(name, [str(VENV_BIN / "rayship"), "operator", *args], paths, full_env)
    wait_until(f"{name} liveness", lambda: http_ok(liveness), 60, release.operator)


@dataclass
class Installed:
    releases: list[Release]
    home: Path


@pytest.fixture(scope="module")
def releases(cluster, api, tmp_path_factory) -> Iterator[Installed]:
    assert cluster.chart_error is None, cluster.chart_error  # the cluster's release made the CRDs
    core = kubernetes.client.CoreV1Api(api)
    tag = uuid.uuid4().hex[:5]
    made = [
        Release(f"team-{team}-{tag}", f"team-{team}-system-{tag}", f"team-{team}-jobs-{tag}") for team in "ab"
    ]
    home = tmp_path_factory.mktemp("helm")
    for release in made:
        core.create_namespace({"metadata": {"name": release.watched}})
    try:
        with own_operator_quiet(api):
            try:
                for release in made:
                    helm(
                        cluster, home, "install", release.name, str(CHART), "-n", release.namespace,
                        "--create-namespace", "--set", "crds.install=false",
                        "--set", f"watchNamespaces={{{release.watched}}}", "--wait", "--timeout", "120s",
                    )  # fmt: skip
                for release in made:
                    start_release_operator(release, api)
                yield Installed(made, home)
            finally:  # before the cluster's own operator is back
                for release in made:
                    if release.operator is not None:
                        stop_process(release.operator)
    finally:
        for release in made:
            helm(cluster, home, "uninstall", release.name, "-n", release.namespace, "--wait", check=False)
            for namespace in (release.watched, release.namespace):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(namespace)


def test_each_release_reconciles_its_own_namespace_only(releases: Installed, api) -> None:
    for release in releases.releases:
        kube = Kube(api, release.watched)
        kube.pvc()
        kube.create(TJ, sample("job", suspend=True))
    for release in releases.releases:
        kube = Kube(api, release.watched)
        wait_for(
            lambda k=kube: k.status(TJ, "job").get("workloadAccount") == ACCOUNT,
            60,
            what=f"{release.name}'s operator to take {release.watched}/job",
        )
        rayjob = wait_for(lambda k=kube: k.get(RJ, names.rayjob_name("job")), 60, what="its RayJob")
        assert rayjob["spec"]["suspend"] is True
        (owner,) = rayjob["metadata"]["ownerReferences"]
        assert owner["kind"] == "TrainingJob" and owner["name"] == "job"
        # Bound to this release's ClusterRole: this release's operator made it, told its name by the chart.
        binding = kube.rbac.read_namespaced_role_binding(ACCOUNT, release.watched)
        assert binding.role_ref.name == names.workload_role(release.full) == f"{release.full}-workload"
        kube.rbac.read_cluster_role(binding.role_ref.name)
    time.sleep(3)  # a moment more, for anything the other operator might still say
    for release in releases.releases:
        others = [r.watched for r in releases.releases if r is not release]
        written = release.written()
        assert release.operator is not None and release.operator.argv[-2:] == ["--namespace", release.watched]
        for other in others:
            assert other not in written, f"{release.name}'s operator logged about {other}:\n{written[-3000:]}"
        refused = refused_lines(written)
        assert not refused, f"{release.name}'s operator was refused:\n" + "\n".join(refused[:20])
        assert release.operator is not None and release.operator.alive()


def test_a_confined_release_may_read_its_own_namespace_and_nothing_beyond(releases: Installed) -> None:
    """watchNamespaces: Roles in those namespaces, nothing cluster-wide. Its operator reads its own
    Namespace object (whether it is being deleted) but lists no namespace and reads none other."""
    for release in releases.releases:
        (other,) = [r for r in releases.releases if r is not release]
        client = kubernetes.config.new_client_from_config(config_file=str(release.kubeconfig))
        core = kubernetes.client.CoreV1Api(client)
        assert core.read_namespace(release.watched).metadata.name == release.watched
        assert core.list_namespaced_persistent_volume_claim(release.watched).items is not None
        for refused, args in (
            (core.list_namespace, ()),
            (core.read_namespace, (other.watched,)),
            (core.list_namespaced_persistent_volume_claim, (other.watched,)),
        ):
            with pytest.raises(ApiException) as denied:
                refused(*args)
            assert denied.value.status == 403, denied.value.body


def test_each_jobs_pods_pass_every_releases_admission_policy(releases: Installed, api) -> None:
    """Three policies are installed (the cluster's release's and these two): a job's workload account
    may patch its own job's status under all of them, and none lets it take the job's account field."""
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    installed = {p.metadata.name for p in admission.list_validating_admission_policy().items}
    assert {names.workload_policy(r.full) for r in releases.releases} <= installed
    for release in releases.releases:
        kube = Kube(api, release.watched)
        wait_for(lambda k=kube: k.status(TJ, "job").get("workloadAccount") == ACCOUNT, 60, what="the account")
        token = kube.core.create_namespaced_service_account_token(
            ACCOUNT, release.watched, {"spec": {"expirationSeconds": 600}}
        ).status.token
        config = kubernetes.client.Configuration()
        config.host = api.configuration.host
        config.ssl_ca_cert = api.configuration.ssl_ca_cert
        config.api_key = {"authorization": f"Bearer {token}"}
        workload = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(config))
        group, version, plural = TJ
        workload.patch_namespaced_custom_object_status(
            group, version, release.watched, plural, "job", {"status": {"progress": {"epoch": 1}}}
        )
        assert kube.status(TJ, "job")["progress"]["epoch"] == 1
        with pytest.raises(ApiException) as denied:
            workload.patch_namespaced_custom_object_status(
                group, version, release.watched, plural, "job", {"status": {"workloadAccount": "x-workload"}}
            )
        assert denied.value.status == 403 and "operator's to write" in denied.value.body, denied.value.body


def cluster_wide_of(api, full: str) -> list[str]:
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    found = [
        *(f"ClusterRole {o.metadata.name}" for o in rbac.list_cluster_role().items),
        *(f"ClusterRoleBinding {o.metadata.name}" for o in rbac.list_cluster_role_binding().items),
        *(
            f"ValidatingAdmissionPolicy {o.metadata.name}"
            for o in admission.list_validating_admission_policy().items
        ),
        *(
            f"ValidatingAdmissionPolicyBinding {o.metadata.name}"
            for o in admission.list_validating_admission_policy_binding().items
        ),
    ]
    return [f for f in found if f.split(" ", 1)[1] == full or f.split(" ", 1)[1].startswith(f"{full}-")]


def test_uninstalled_a_release_leaves_nothing_and_takes_nothing_of_the_others(
    releases: Installed, api, cluster
) -> None:
    first, second = releases.releases
    assert cluster_wide_of(api, first.full) and cluster_wide_of(api, second.full)
    assert first.operator is not None
    stop_process(first.operator)
    first.operator = None
    helm(cluster, releases.home, "uninstall", first.name, "-n", first.namespace, "--wait")
    assert cluster_wide_of(api, first.full) == []
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    assert not [r.metadata.name for r in rbac.list_namespaced_role(first.watched).items]
    apps = kubernetes.client.AppsV1Api(api)
    assert not apps.list_namespaced_deployment(first.namespace).items
    # The other release, the cluster's own and the CRDs are untouched; so is the job (kept with them).
    expected = {
        f"ClusterRole {names.workload_role(second.full)}",
        f"ValidatingAdmissionPolicy {names.workload_policy(second.full)}",
        f"ValidatingAdmissionPolicyBinding {names.workload_policy(second.full)}",
    }
    assert expected <= set(cluster_wide_of(api, second.full))
    own = kubernetes.client.AdmissionregistrationV1Api(api).read_validating_admission_policy(
        names.WORKLOAD_POLICY
    )
    assert own.metadata.labels["app.kubernetes.io/instance"] == "rayship"
    assert (
        rbac.read_cluster_role(names.WORKLOAD_ROLE).metadata.labels["app.kubernetes.io/instance"] == "rayship"
    )
    assert Kube(api, first.watched).get(TJ, "job") is not None
    status = json.loads(
        helm(cluster, releases.home, "status", second.name, "-n", second.namespace, "-o", "json").stdout
    )
    assert status["info"]["status"] == "deployed"
    assert second.operator is not None and second.operator.alive()
    # ... and its operator still does its work: a second job in its namespace.
    kube = Kube(api, second.watched)
    kube.create(TJ, sample("job-2", suspend=True))
    wait_for(lambda: kube.get(RJ, names.rayjob_name("job-2")), 60, what=f"{second.name}'s next RayJob")
    refused = refused_lines(second.written())
    assert not refused, "\n".join(refused[:20])
