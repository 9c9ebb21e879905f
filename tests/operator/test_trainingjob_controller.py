"""TrainingJob on the real control plane: the operator (as the chart's ServiceAccount) creates the
RayJob with strict field validation, the real KubeRay makes the RayCluster, the real scheduler places
the pods kwok runs, the real garbage collector cleans up, and the status follows KubeRay's own."""

from __future__ import annotations

import re
import time
import urllib.request
from datetime import datetime

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from controlplane import cluster as controlplane
from rayship import api
from rayship.api import names
from rayship.controller.trainingjob import phase_of
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube, sample, wait_for

pytestmark = pytest.mark.operator

TJ, RJ = api.TRAININGJOBS, api.RAYJOBS
RAYCLUSTERS = ("ray.io", "v1", "rayclusters")
GPU_WORKERS = {
    "replicas": 2,
    "gpusPerWorker": 1,
    "cpusPerWorker": 2,
    "memoryPerWorker": "4Gi",
    "gpuProduct": "NVIDIA-L4",
}


def operator_caught_up(kube: Kube) -> None:
    """The operator has taken every event that came before this call: a TrainingJob made now (suspended,
    no Ray cluster) has its status written. Its event comes after the earlier ones on kopf's watch and
    queues behind them, so a reconcile an earlier event would have started has been taken by then: a
    negative check after this is not passed by a slow operator that simply had not got there yet."""
    marker = f"caught-up-{time.monotonic_ns() % 10**9}"
    kube.create(TJ, sample(marker, suspend=True))
    wait_for(lambda: "observedGeneration" in kube.status(TJ, marker), 60, what=f"{marker} reconciled")
    time.sleep(0.5)  # a reconcile taken just before the marker's, on another of the queue's threads
    kube.delete(TJ, marker)


def reconciles(operator: RunningOperator) -> float:
    """rayship_reconciles_total{kind="TrainingJob"} of the running operator (counted as each starts)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.handle.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(r'^rayship_reconciles_total\{kind="TrainingJob"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def rayjob_of(kube: Kube, name: str) -> dict:
    return wait_for(lambda: kube.get(RJ, names.rayjob_name(name)), 60, what=f"RayJob of {name}")


def test_round_trip_on_real_kuberay_scheduler_and_gc(kube: Kube, operator) -> None:
    kube.pvc()
    created = kube.create(TJ, sample("mlp-gpu", workers=GPU_WORKERS))
    rayjob = rayjob_of(kube, "mlp-gpu")

    (owner,) = rayjob["metadata"]["ownerReferences"]
    assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] and owner["blockOwnerDeletion"]
    assert "ray.io/rayjob-finalizer" in wait_for(
        lambda: kube.get(RJ, "mlp-gpu")["metadata"].get("finalizers"), 30, what="KubeRay's finalizer"
    )

    # The real KubeRay creates the cluster; the real scheduler places the pods.
    cluster = wait_for(lambda: kube.status(RJ, "mlp-gpu").get("rayClusterName"), 60, what="RayCluster")
    pods = wait_for(
        lambda: [p for p in kube.pods(f"ray.io/cluster={cluster}") if p.spec.node_name],
        90,
        what="scheduled Ray pods",
    )
    pods = wait_for(
        lambda: (
            (found := kube.pods(f"ray.io/cluster={cluster}"))
            and all(p.spec.node_name for p in found)
            and len(found) == 3
            and found
        ),
        90,
        what="head + 2 GPU workers scheduled",
    )
    nodes = {p.metadata.labels["ray.io/node-type"]: set() for p in pods}
    for p in pods:
        nodes[p.metadata.labels["ray.io/node-type"]].add(p.spec.node_name)
    assert nodes == {"head": {"kwok-cpu-0"}, "worker": {"kwok-gpu-l4-0"}}
    for p in pods:  # KubeRay's own label survives: its head Services select on it
        assert p.metadata.labels["app.kubernetes.io/name"] == "kuberay"

    # Our status mirrors KubeRay's real transitions, through the table.
    def mirrored() -> bool:
        rj_status = kube.status(RJ, "mlp-gpu")
        expected = phase_of(rj_status)
        tj_status = kube.status(TJ, "mlp-gpu")
        return (
            tj_status.get("phase") == expected[0]
            and kube.condition(TJ, "mlp-gpu", "Running").get("reason") == expected[1]
            and tj_status.get("rayClusterName") == rj_status.get("rayClusterName")
        )

    wait_for(mirrored, 60, what="the TrainingJob status to follow the RayJob")
    st = kube.status(TJ, "mlp-gpu")
    assert st["gpus"] == 2 and st["rayJobUID"] == rayjob["metadata"]["uid"]
    # one Event for the create and the phase it starts (one API call, not two of the same reason)
    created = [e for e in kube.events("mlp-gpu") if e[1] == "RayJobCreated"]
    assert created == [("Normal", "RayJobCreated", "created RayJob mlp-gpu")], kube.events("mlp-gpu")

    # Deletion: real garbage collection, through KubeRay's finalizer, down to the pods.
    kube.delete(TJ, "mlp-gpu")
    wait_for(lambda: kube.get(RJ, "mlp-gpu") is None, 90, what="the RayJob garbage-collected")
    wait_for(lambda: kube.get(RAYCLUSTERS, cluster) is None, 90, what="the RayCluster deleted")
    wait_for(lambda: not kube.pods(f"ray.io/cluster={cluster}"), 90, what="the pods deleted")
    wait_for(
        lambda: not [a for a in kube.core.list_namespaced_service_account(kube.namespace).items
                     if a.metadata.name == "mlp-gpu-workload"],
        60,
        what="the workload ServiceAccount garbage-collected",
    )  # fmt: skip


UNBOUND_CHECKPOINTS = {
    "checkpoint": {
        "storage": {"pvc": {"claimName": "never-bound", "mountPath": "/mnt/checkpoints"}},
        "keep": 2,
    }
}


@pytest.mark.parametrize(
    ("change", "reason", "words"),
    [
        ({"workers": {**GPU_WORKERS, "gpuProduct": "NVIDIA-H200"}}, "Unschedulable", "node"),
        (UNBOUND_CHECKPOINTS, "Unschedulable", "PersistentVolumeClaim"),
    ],
    ids=["no-node-has-the-gpu-product", "checkpoint-pvc-never-binds"],
)
def test_pods_that_cannot_start_are_explained(kube: Kube, operator, change, reason, words) -> None:
    kube.pvc()
    # A claim no StorageClass can provision (its class does not exist): it stays Pending.
    kube.core.create_namespaced_persistent_volume_claim(kube.namespace, {
        "metadata": {"name": "never-bound"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none-such",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    kube.create(TJ, sample("stuck", **change))
    cond = wait_for(
        lambda: (c := kube.condition(TJ, "stuck", "Running")).get("reason") == reason and c,
        120,
        what=f"the Running condition to say {reason}",
    )
    assert kube.status(TJ, "stuck")["phase"] == "Pending" and words in cond["message"]
    assert "pod stuck-" in cond["message"]
    wait_for(
        lambda: [e for e in kube.events("stuck") if e[0] == "Warning" and e[1] == reason],
        30,
        what=f"a Warning Event {reason}",
    )


def test_a_resourcequota_refusing_the_ray_pods_is_named(kube: Kube, operator) -> None:
    """No Ray pod exists to say why (the API server refused to create it): the TrainingJob says it,
    from KubeRay's own ReplicaFailure condition, with the quota's words, and warns once."""
    kube.pvc()
    kube.core.create_namespaced_resource_quota(
        kube.namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    )
    kube.create(TJ, sample("quota"))
    cond = wait_for(
        lambda: (c := kube.condition(TJ, "quota", "Running")).get("reason") == "ResourceQuotaExceeded" and c,
        90,
        what="the Running condition to say ResourceQuotaExceeded",
    )
    assert kube.status(TJ, "quota")["phase"] == "Pending"
    assert "exceeded quota: no-pods" in cond["message"], cond["message"]
    wait_for(
        lambda: [e for e in kube.events("quota") if e[:2] == ("Warning", "ResourceQuotaExceeded")],
        30,
        what="a Warning Event ResourceQuotaExceeded",
    )


def test_a_job_whose_checkpoint_claim_does_not_exist_says_so_at_once_and_starts_once_it_does(
    kube: Kube, operator
) -> None:
    """No claim: no RayJob and no Ray pod, the status names the claim from the first reconcile (not
    once a head pod is Pending for it), a Warning says it once; the claim made, the job starts by
    itself (the operator looks again while it waits: no resync, no edit needed)."""
    kube.create(TJ, sample("claimless", suspend=True))
    t0 = time.monotonic()
    cond = wait_for(
        lambda: (c := kube.condition(TJ, "claimless", "Running")).get("reason") == "ClaimNotFound" and c,
        30,
        what="the Running condition to say ClaimNotFound",
    )
    print(f"ClaimNotFound said {time.monotonic() - t0:.1f}s after the create")
    assert kube.status(TJ, "claimless")["phase"] == "Pending"
    assert (
        "spec.checkpoint.storage.pvc.claimName: PersistentVolumeClaim rayship-checkpoints does not exist in "
        f"namespace {kube.namespace}"
    ) in cond["message"], cond
    assert kube.get(RJ, names.rayjob_name("claimless")) is None
    warnings = wait_for(
        lambda: [e for e in kube.events("claimless") if e[1] == "ClaimNotFound"], 30, what="its Warning"
    )
    assert [w[0] for w in warnings] == ["Warning"], kube.events("claimless")
    kube.pvc()
    rayjob_of(kube, "claimless")
    wait_for(
        lambda: kube.condition(TJ, "claimless", "Running").get("reason") != "ClaimNotFound",
        30,
        what="the status to move on from ClaimNotFound",
    )
    assert len([e for e in kube.events("claimless") if e[1] == "ClaimNotFound"]) == 1


def test_recreated_namesake_waits_for_the_old_rayjob_never_adopts_it(kube: Kube, operator) -> None:
    kube.pvc()
    first = kube.create(TJ, sample("again"))
    old = rayjob_of(kube, "again")
    # Hold the old RayJob in deletion (as a slow finalizer would), then delete and re-create.
    kube.patch(
        RJ,
        "again",
        {"metadata": {"finalizers": [*old["metadata"].get("finalizers", []), "test.rayship.dev/hold"]}},
    )
    kube.delete(TJ, "again")
    wait_for(
        lambda: kube.get(RJ, "again")["metadata"].get("deletionTimestamp"), 60, what="old RayJob deleting"
    )
    second = kube.create(TJ, sample("again"))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    cond = wait_for(
        lambda: (
            (c := kube.condition(TJ, "again", "Running")).get("reason") == "PreviousRayJobTerminating" and c
        ),
        60,
        what="the new TrainingJob to wait for the old RayJob",
    )
    assert "still being deleted" in cond["message"]
    assert kube.get(RJ, "again")["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]

    held = kube.get(RJ, "again")["metadata"]["finalizers"]
    kube.patch(RJ, "again", {"metadata": {"finalizers": [f for f in held if f != "test.rayship.dev/hold"]}})
    fresh = wait_for(
        lambda: (rj := kube.get(RJ, "again")) and not rj["metadata"].get("deletionTimestamp") and rj,
        90,
        what="a new RayJob for the new TrainingJob",
    )
    assert fresh["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]


def rayjob_settled_suspended(kube: Kube, name: str) -> None:
    """A job created suspended says Suspended from its first status; KubeRay passes its RayJob through
    Initializing and Suspending after that, each change an event the operator acts on: settled here."""
    wait_for(
        lambda: ((kube.get(RJ, name) or {}).get("status") or {}).get("jobDeploymentStatus") == "Suspended",
        60,
        what=f"{name}'s RayJob Suspended by KubeRay",
    )
    operator_caught_up(kube)  # the operator's pass for that last change (it writes nothing)


def test_a_spec_change_reaches_the_rayjob_and_a_status_write_does_not_trigger_a_reconcile(
    kube: Kube, operator
) -> None:
    """A change of the TrainingJob's spec (a new metadata.generation) is acted on within seconds, not at
    the resync; a status write by someone else changes no generation and is not acted on: the status
    stays what someone else wrote until the next reconcile."""
    kube.pvc()
    kube.create(TJ, sample("toggled", suspend=True))
    assert rayjob_of(kube, "toggled")["spec"]["suspend"] is True
    wait_for(lambda: kube.status(TJ, "toggled").get("phase") == "Suspended", 60, what="phase Suspended")
    rayjob_settled_suspended(kube, "toggled")
    group, version, plural = TJ
    kube.custom.patch_namespaced_custom_object_status(
        group, version, kube.namespace, plural, "toggled", {"status": {"gpus": 7}}
    )
    operator_caught_up(kube)  # a reconcile would have written the job's 0 GPUs back by now
    assert kube.status(TJ, "toggled").get("gpus") == 7
    kube.patch(TJ, "toggled", {"spec": {"suspend": False}})
    wait_for(lambda: kube.get(RJ, "toggled")["spec"]["suspend"] is False, 20, what="the RayJob resumed")


def test_a_launched_rayjob_that_disappears_is_lost_not_restarted(kube: Kube, operator) -> None:
    kube.pvc()
    kube.create(TJ, sample("gone"))
    rayjob_of(kube, "gone")
    wait_for(lambda: kube.status(TJ, "gone").get("rayJobUID"), 30, what="the launch recorded")
    kube.delete(RJ, "gone")  # as KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES would
    cond = wait_for(
        lambda: (c := kube.condition(TJ, "gone", "Failed")).get("reason") == "RayJobLost" and c,
        90,
        what="Failed/RayJobLost",
    )
    assert "does not start it again" in cond["message"]
    operator_caught_up(kube)  # the operator reacted to the deletion; it must not create another
    assert kube.get(RJ, "gone") is None and kube.status(TJ, "gone")["phase"] == "Failed"


def test_a_namespace_being_deleted_gets_no_writes_from_the_operator(kube: Kube, operator) -> None:
    """The namespace controller deletes a namespace's kinds in no set order, and a job may change
    meanwhile. The operator must write nothing there: not that its jobs are suspending or lost
    (Failed) when their RayJobs go first, nor act on a change; nor post Events, which the API server
    refuses in a namespace being deleted. A ValidatingAdmissionPolicy holds the TrainingJobs back
    until the end, and the RayJobs until a job has changed."""
    kube.pvc()
    jobs = [f"in-ns-{i}" for i in range(3)]
    for name in jobs:
        kube.create(TJ, sample(name, suspend=True))
    for name in jobs:  # launched (rayJobUID) and settled: no status write of theirs is still to come
        wait_for(
            lambda n=name: (
                kube.status(TJ, n).get("rayJobUID")
                and kube.condition(TJ, n, "Suspended").get("reason") == "Suspended"
            ),
            60,
            what=f"{name} launched and suspended",
        )
        rayjob_settled_suspended(kube, name)
    admission = kubernetes.client.AdmissionregistrationV1Api(kube.client)
    policy = f"hold-{kube.namespace}"

    def hold(*plurals: str) -> dict:
        rules = [
            {"apiGroups": [g], "apiVersions": ["*"], "operations": ["DELETE"], "resources": [p]}
            for g, p in plurals
        ]
        return {"matchConstraints": {"resourceRules": rules}}

    admission.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": hold(TJ[::2], RJ[::2])
            | {"validations": [{"expression": "false", "message": "held back by the test"}]},
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.namespace}}
                },
            },
        }
    )

    def held(resource: api.Resource, name: str) -> bool:
        try:
            kube.custom.delete_namespaced_custom_object(
                *resource[:2], kube.namespace, resource[2], name, dry_run="All"
            )
        except ApiException as err:
            return err.status in (403, 422) and "held back" in str(err.body)
        return False

    try:
        wait_for(lambda: held(TJ, jobs[0]) and held(RJ, jobs[0]), 30, what="the policy in force")
        offset = controlplane.audit_offset()
        kube.core.delete_namespace(kube.namespace)
        time.sleep(3)  # the namespace's deletion seen by the operator's watch
        looked = reconciles(operator)
        kube.patch(TJ, jobs[0], {"spec": {"suspend": False}})  # a change it would otherwise act on
        wait_for(lambda: reconciles(operator) > looked, 30, what="a reconcile of the changed job")
        time.sleep(0.5)  # from its start to its end (it writes nothing)
        admission.patch_validating_admission_policy(policy, {"spec": hold(TJ[::2])})  # the RayJobs go
        looked = reconciles(operator)
        wait_for(lambda: not kube.list(RJ), 120, interval=1, what="the RayJobs deleted (their jobs held)")
        # the operator's reactions to their deletion: a reconcile of each job, which writes nothing
        wait_for(lambda: reconciles(operator) >= looked + len(jobs), 30, what="a reconcile of each job")
        time.sleep(0.5)  # the last of them, counted at its start, to its end
        assert all(kube.get(TJ, name) is not None for name in jobs)
        writes = [
            f"{e['verb']} {e['objectRef'].get('resource')}/{e['objectRef'].get('subresource') or ''}"
            for e in controlplane.audit_since(offset)
            if (e.get("objectRef") or {}).get("namespace") == kube.namespace
            and e["verb"] in ("create", "update", "patch", "delete")
        ]
        assert not writes, f"the operator wrote in a namespace being deleted: {writes}"
    finally:
        admission.delete_validating_admission_policy_binding(policy)
        admission.delete_validating_admission_policy(policy)


def test_someone_elses_serviceaccount_is_never_borrowed(kube: Kube, operator) -> None:
    kube.core.create_namespaced_service_account(kube.namespace, {"metadata": {"name": "deployer-workload"}})
    kube.pvc()
    kube.create(TJ, sample("deployer"))
    cond = wait_for(
        lambda: (c := kube.condition(TJ, "deployer", "Failed")).get("status") == "True" and c,
        60,
        what="the job to fail",
    )
    assert cond["reason"] == "WorkloadIdentityTaken" and "deployer-workload" in cond["message"]
    assert kube.get(RJ, "deployer") is None


def test_workload_progress_and_operator_status_never_lose_each_other(kube: Kube, operator) -> None:
    """The Ray pods patch status.progress as the per-job ServiceAccount (a real token, real RBAC, the
    chart's real admission policy) while the operator writes phase and conditions; they may write
    their own TrainingJob's status only, and never the field that says whose it is."""
    kube.pvc()
    kube.create(TJ, sample("racer"))
    kube.create(TJ, sample("neighbour"))
    rayjob_of(kube, "racer")
    for name in ("racer", "neighbour"):  # the operator names the account with its first status write
        wait_for(
            lambda n=name: kube.status(TJ, n).get("workloadAccount") == f"{n}-workload",
            60,
            what=f"status.workloadAccount of {name}",
        )
    account = wait_for(
        lambda: [a for a in kube.core.list_namespaced_service_account(kube.namespace).items
                 if a.metadata.name == "racer-workload"],
        30,
        what="the workload ServiceAccount",
    )[0]  # fmt: skip
    token = kube.core.create_namespaced_service_account_token(
        account.metadata.name, kube.namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = kubernetes.client.Configuration()
    config.host = kube.client.configuration.host
    config.ssl_ca_cert = kube.client.configuration.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    workload = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(config))
    group, version, plural = TJ
    for epoch in range(1, 21):
        workload.patch_namespaced_custom_object_status(
            group, version, kube.namespace, plural, "racer",
            {"status": {"progress": {"epoch": epoch, "metrics": {"loss": 1.0 / epoch}}}},
        )  # fmt: skip
        time.sleep(0.1)
    # Its RoleBinding's ClusterRole allows any TrainingJob's status; the admission policy refuses
    # every one but its own, and refuses it a new owner.
    with pytest.raises(ApiException) as denied:
        workload.patch_namespaced_custom_object_status(
            group, version, kube.namespace, plural, "neighbour", {"status": {"progress": {"epoch": 99}}}
        )
    assert denied.value.status == 403, denied.value.body
    assert "racer-workload may write the status of its own TrainingJob only" in denied.value.body
    with pytest.raises(ApiException) as denied:
        workload.patch_namespaced_custom_object_status(
            group, version, kube.namespace, plural, "racer",
            {"status": {"workloadAccount": "neighbour-workload"}},
        )  # fmt: skip
    assert denied.value.status == 403 and "operator's to write" in denied.value.body, denied.value.body
    # nor any field the operator writes: code in the Ray pods cannot say the job Succeeded, clear the
    # GPU-hours a chargeback reads, or rewrite the attempts (issue 57 §3)
    wait_for(lambda: kube.status(TJ, "racer").get("phase"), 60, what="the operator's first phase")
    for forged in ({"phase": "Succeeded"}, {"gpuHours": 12345.0}, {"attempts": []}, {"lastError": None}):
        (field,) = forged
        if field == "lastError" and kube.status(TJ, "racer").get("lastError") is None:
            continue  # removing what is not there changes nothing
        with pytest.raises(ApiException) as denied:
            workload.patch_namespaced_custom_object_status(
                group, version, kube.namespace, plural, "racer", {"status": forged}
            )
        assert denied.value.status == 403, (forged, denied.value.body)
        assert f"status.{field} is the operator's to write" in denied.value.body, denied.value.body
    assert kube.status(TJ, "neighbour").get("progress") is None
    # Another team's account whose name happens to end in -workload, given the right by its own
    # RoleBinding, is RBAC's to judge, not the policy's: it judges rayship's accounts only (its params)
    kube.core.create_namespaced_service_account(kube.namespace, {"metadata": {"name": "etl-workload"}})
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(kube.client)
    rule = {"apiGroups": [group], "resources": [f"{plural}/status"], "verbs": ["patch"]}
    rbac_api.create_namespaced_role(kube.namespace, {"metadata": {"name": "etl"}, "rules": [rule]})
    rbac_api.create_namespaced_role_binding(kube.namespace, {
        "metadata": {"name": "etl"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "etl"},
        "subjects": [{"kind": "ServiceAccount", "name": "etl-workload", "namespace": kube.namespace}],
    })  # fmt: skip
    etl_token = kube.core.create_namespaced_service_account_token(
        "etl-workload", kube.namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config.api_key = {"authorization": f"Bearer {etl_token}"}
    etl = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(config))

    def etl_patch() -> bool:
        try:
            etl.patch_namespaced_custom_object_status(
                group, version, kube.namespace, plural, "neighbour", {"status": {"progress": {"epoch": 7}}}
            )
        except ApiException as err:
            assert err.status == 403 and "may write the status of its own" not in err.body, err.body
            return False  # its RoleBinding not yet seen by the authorizer
        return True

    wait_for(etl_patch, 30, what="etl-workload's patch, judged by RBAC alone")
    assert kube.status(TJ, "neighbour")["progress"]["epoch"] == 7
    wait_for(lambda: kube.status(TJ, "racer").get("rayClusterName"), 60, what="operator status writes")
    st = kube.status(TJ, "racer")
    assert st["progress"]["epoch"] == 20 and st["phase"] in ("Pending", "Running")
    assert {c["type"] for c in st["conditions"]} >= {"Valid", "Running", "SpecApplied"}


def test_operator_sigkilled_while_creating_20_jobs_loses_and_duplicates_nothing(kube: Kube, cluster) -> None:
    from controlplane import cluster as controlplane

    controlplane.stop_operator()
    kube.pvc()
    for i in range(20):
        kube.create(TJ, sample(f"burst-{i:02d}"))
    handle = controlplane.start_operator()
    wait_for(lambda: kube.list(RJ), 60, what="the first RayJob")
    controlplane.kill_operator(handle)  # SIGKILL mid-burst
    controlplane.start_operator()
    rayjobs = wait_for(lambda: len(found := kube.list(RJ)) == 20 and found, 120, what="20 RayJobs")
    tjs = {t["metadata"]["name"]: t["metadata"]["uid"] for t in kube.list(TJ)}
    for rj in rayjobs:
        (owner,) = rj["metadata"]["ownerReferences"]
        assert owner["uid"] == tjs[rj["metadata"]["name"]]
    accounts = [a.metadata.name for a in kube.core.list_namespaced_service_account(kube.namespace).items]
    assert sorted(a for a in accounts if a.startswith("burst-")) == [
        f"burst-{i:02d}-workload" for i in range(20)
    ]


def test_operator_resumes_by_itself_after_an_api_server_restart(kube: Kube, operator, cluster) -> None:
    from controlplane import cluster as controlplane

    kube.pvc()
    kube.create(TJ, sample("before"))
    rayjob_of(kube, "before")
    controlplane.restart("kube-apiserver")
    kube.create(TJ, sample("after"))
    rayjob_of(kube, "after")
    wait_for(lambda: kube.status(TJ, "after").get("phase") == "Pending", 60, what="status of the new job")
    # A restarted API server refuses requests until its RBAC cache has synced: expected, and the
    # operator retried through it. From here on nothing may be refused.
    operator.refusals_expected_until = datetime.now()
    kube.create(TJ, sample("later"))
    rayjob_of(kube, "later")


def test_kubectl_explain_prints_the_field_documentation(cluster) -> None:
    out = cluster.kubectl("explain", "trainingjob.spec.workers").stdout
    assert "GPU worker group" in out  # the field's description, from the API models
    assert "gpusPerWorker" in out and "gpuProduct" in out and "GPUs per worker pod" in out


def test_state_converges_without_any_event_by_the_resync(kube: Kube, cluster) -> None:
    """A status no event will correct (an event or the API call after it lost): the resync timer
    reconciles it back from the RayJob."""
    from controlplane import cluster as controlplane

    controlplane.stop_operator()
    controlplane.start_operator(extra_env={"RAYSHIP_RESYNC_SECONDS": "5"})
    try:
        kube.pvc()
        kube.create(TJ, sample("drift"))
        rayjob_of(kube, "drift")
        truth = wait_for(
            lambda: (s := kube.status(TJ, "drift")).get("rayClusterName") and s, 60, what="status"
        )
        group, version, plural = TJ
        kube.custom.patch_namespaced_custom_object_status(
            group, version, kube.namespace, plural, "drift", {"status": {"phase": "Suspended", "gpus": 99}}
        )  # a status change: no TrainingJob handler runs for it, no RayJob event comes
        wait_for(
            lambda: (
                (s := kube.status(TJ, "drift")).get("phase") != "Suspended" and s.get("gpus") == truth["gpus"]
            ),
            30,
            what="the resync to restore the status",
        )
    finally:
        controlplane.stop_operator()  # the next test starts one with the chart's settings
