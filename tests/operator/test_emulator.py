"""
Tests of the Kubernetes API emulator (tests/emulator.py) through the official client,
and of kopf running end to end against it (tests/operator/toy_operator.py).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from conftest import RESOURCES
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException

from tests.emulator import CONFIGMAPS, EVENTS, ApiRequest, EmulatorHandle, Resource

pytestmark = pytest.mark.operator

TRAININGJOBS = RESOURCES["trainingjobs"]
RAYJOBS = RESOURCES["rayjobs"]


def _coords(res: Resource, namespace: str = "default") -> tuple[str, str, str, str]:
    return res.group, res.version, namespace, res.plural


def _create(
    api: CustomObjectsApi, res: Resource, name: str, namespace: str = "default", **fields: Any
) -> dict[str, Any]:
    meta = {"name": name, **fields.pop("metadata", {})}
    body = {
        "apiVersion": res.api_version,
        "kind": res.kind,
        "metadata": meta,
        "spec": {"replicas": 1},
        **fields,
    }
    return api.create_namespaced_custom_object(*_coords(res, namespace), body)


def _owner(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }


def _status_of(error: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    return json.loads(error.value.body)


def _watch(list_fn: Callable[..., Any], *args: Any, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """(type, name) of the first ``count`` watch events, or of all that came within 5 seconds."""
    events: list[tuple[str, str]] = []
    watch = kubernetes.watch.Watch()
    for event in watch.stream(list_fn, *args, timeout_seconds=5, **kwargs):
        events.append((event["type"], event["raw_object"]["metadata"]["name"]))
        if len(events) >= count:
            watch.stop()
    return events


@pytest.fixture
def custom(kube_api: ApiClient) -> CustomObjectsApi:
    return CustomObjectsApi(kube_api)


@pytest.fixture
def core(kube_api: ApiClient) -> CoreV1Api:
    return CoreV1Api(kube_api)


def test_create_answers_201_and_sets_server_metadata(custom: CustomObjectsApi) -> None:
    body = {
        "metadata": {"name": "job1", "uid": "mine"},
        "spec": {"replicas": 1},
        "status": {"phase": "Forged"},
    }
    created, code, _ = custom.create_namespaced_custom_object_with_http_info(*_coords(TRAININGJOBS), body)
    second = _create(custom, TRAININGJOBS, "job2")

    assert code == 201
    meta = created["metadata"]
    assert uuid.UUID(meta["uid"]).version == 4
    assert meta["resourceVersion"].isdigit()
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert second["metadata"]["uid"] != meta["uid"]
    assert meta["generation"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert (created["apiVersion"], created["kind"], meta["namespace"]) == (
        "rayship.dev/v1alpha1",
        "TrainingJob",
        "default",
    )
    assert "status" not in created  # only the status subresource writes the status
    assert custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job1") == created


def test_duplicate_create_is_a_409_already_exists(custom: CustomObjectsApi) -> None:
    _create(custom, TRAININGJOBS, "job")
    with pytest.raises(ApiException) as error:
        _create(custom, TRAININGJOBS, "job")
    assert error.value.status == 409
    assert _status_of(error) | {"details": None} == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": 409,
        "reason": "AlreadyExists",
        "message": 'trainingjobs.rayship.dev "job" already exists',
        "details": None,
    }


def test_status_subresource_is_isolated_and_generation_follows_the_spec(custom: CustomObjectsApi) -> None:
    created = _create(custom, TRAININGJOBS, "job")
    rv = int(created["metadata"]["resourceVersion"])

    main = custom.patch_namespaced_custom_object(
        *_coords(TRAININGJOBS), "job", {"spec": {"replicas": 2}, "status": {"phase": "Ignored"}}
    )
    assert (main["spec"], main.get("status"), main["metadata"]["generation"]) == ({"replicas": 2}, None, 2)

    status = custom.patch_namespaced_custom_object_status(
        *_coords(TRAININGJOBS), "job", {"spec": {"replicas": 99}, "status": {"phase": "Running"}}
    )
    assert (status["spec"], status["status"], status["metadata"]["generation"]) == (
        {"replicas": 2},
        {"phase": "Running"},
        2,
    )

    labelled = custom.patch_namespaced_custom_object(
        *_coords(TRAININGJOBS), "job", {"metadata": {"labels": {"a": "b"}}}
    )
    assert (labelled["metadata"]["labels"], labelled["metadata"]["generation"]) == ({"a": "b"}, 2)

    replaced = custom.replace_namespaced_custom_object(
        *_coords(TRAININGJOBS), "job", {**labelled, "spec": {"replicas": 3}, "status": {"phase": "Ignored"}}
    )
    assert (replaced["spec"], replaced["status"], replaced["metadata"]["generation"]) == (
        {"replicas": 3},
        {"phase": "Running"},
        3,
    )

    final = custom.replace_namespaced_custom_object_status(
        *_coords(TRAININGJOBS), "job", {**replaced, "spec": {"replicas": 0}, "status": {"phase": "Done"}}
    )
    assert (final["spec"], final["status"], final["metadata"]["generation"]) == (
        {"replicas": 3},
        {"phase": "Done"},
        3,
    )

    versions = [int(obj["metadata"]["resourceVersion"]) for obj in (main, status, labelled, replaced, final)]
    assert versions == sorted(set(versions)) and versions[0] > rv  # every write got a newer resourceVersion


def test_writes_with_a_stale_resource_version_are_409_conflicts(custom: CustomObjectsApi) -> None:
    stale = _create(custom, TRAININGJOBS, "job")
    current = custom.patch_namespaced_custom_object(*_coords(TRAININGJOBS), "job", {"spec": {"replicas": 2}})

    with pytest.raises(ApiException) as put_error:
        custom.replace_namespaced_custom_object(
            *_coords(TRAININGJOBS), "job", {**stale, "spec": {"replicas": 5}}
        )
    with pytest.raises(ApiException) as patch_error:
        custom.patch_namespaced_custom_object(
            *_coords(TRAININGJOBS),
            "job",
            {"metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]}, "spec": {"replicas": 5}},
        )
    with pytest.raises(ApiException) as status_error:
        custom.patch_namespaced_custom_object_status(
            *_coords(TRAININGJOBS),
            "job",
            {
                "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
                "status": {"phase": "Lost"},
            },
        )

    for error in (put_error, patch_error, status_error):
        assert (error.value.status, _status_of(error)["reason"]) == (409, "Conflict")
    assert custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job") == current
    fresh = custom.patch_namespaced_custom_object(
        *_coords(TRAININGJOBS),
        "job",
        {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "spec": {"replicas": 5}},
    )
    assert fresh["spec"] == {"replicas": 5}


def test_json_patches_apply_when_their_test_operations_pass(custom: CustomObjectsApi) -> None:
    created = _create(custom, TRAININGJOBS, "job")

    def json_patch(rv: str, replicas: int) -> dict[str, Any]:
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "replace", "path": "/spec/replicas", "value": replicas},
            {"op": "add", "path": "/metadata/labels", "value": {"app~/x": "y"}},
            {"op": "copy", "from": "/metadata/labels/app~0~1x", "path": "/spec/app"},
        ]
        return custom.patch_namespaced_custom_object(
            *_coords(TRAININGJOBS), "job", ops, _content_type="application/json-patch+json"
        )

    patched = json_patch(created["metadata"]["resourceVersion"], 5)
    assert (patched["spec"], patched["metadata"]["labels"]) == ({"replicas": 5, "app": "y"}, {"app~/x": "y"})
    with pytest.raises(ApiException) as error:
        json_patch(created["metadata"]["resourceVersion"], 7)  # the same resourceVersion is stale now
    assert (error.value.status, _status_of(error)["reason"]) == (422, "Invalid")
    assert custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job") == patched


def test_listing_filters_by_label_and_field_selectors(custom: CustomObjectsApi, core: CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    for name, labels in [
        ("a", {"app": "x", "tier": "web"}),
        ("b", {"app": "y"}),
        ("c", {}),
        ("d", {"app": "x"}),
    ]:
        _create(custom, TRAININGJOBS, name, metadata={"labels": labels})
    last = _create(custom, TRAININGJOBS, "e", namespace="other", metadata={"labels": {"app": "x"}})

    def names(**selectors: str) -> list[str]:
        listing = custom.list_cluster_custom_object(
            TRAININGJOBS.group, TRAININGJOBS.version, TRAININGJOBS.plural, **selectors
        )
        assert listing["metadata"]["resourceVersion"] == last["metadata"]["resourceVersion"]
        return sorted(item["metadata"]["name"] for item in listing["items"])

    assert names() == ["a", "b", "c", "d", "e"]
    assert names(label_selector="app") == ["a", "b", "d", "e"]
    assert names(label_selector="app=x") == names(label_selector="app==x") == ["a", "d", "e"]
    assert names(label_selector="app!=x") == ["b", "c"]
    assert names(label_selector="!app") == ["c"]
    assert names(label_selector="app=x,tier=web") == ["a"]
    assert names(label_selector="app in (x, y),!tier") == ["b", "d", "e"]
    assert names(label_selector="app notin (x)") == ["b", "c"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.namespace!=default,metadata.name!=b") == ["e"]
    in_other = custom.list_namespaced_custom_object(*_coords(TRAININGJOBS, "other"), label_selector="app")
    assert [item["metadata"]["name"] for item in in_other["items"]] == ["e"]
    with pytest.raises(ApiException) as error:
        names(label_selector="app=x=y")
    assert error.value.status == 400


def test_watching_replays_history_after_the_resource_version(custom: CustomObjectsApi) -> None:
    created = _create(custom, TRAININGJOBS, "a", metadata={"labels": {"app": "x"}})
    custom.patch_namespaced_custom_object(*_coords(TRAININGJOBS), "a", {"spec": {"replicas": 2}})
    _create(custom, RAYJOBS, "other-kind")
    _create(custom, TRAININGJOBS, "b")
    custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "a")
    list_fn, args = custom.list_namespaced_custom_object, _coords(TRAININGJOBS)

    since = created["metadata"]["resourceVersion"]
    assert _watch(list_fn, *args, count=3, resource_version=since) == [
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    assert _watch(list_fn, *args, count=2, resource_version=since, label_selector="app=x") == [
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    assert _watch(list_fn, *args, count=1) == [("ADDED", "b")]  # no resourceVersion: the current state


def test_watchers_see_changes_over_http_and_via_helpers_promptly(
    emulator: EmulatorHandle, custom: CustomObjectsApi
) -> None:
    received: list[tuple[str, str, dict[str, Any], float]] = []

    def consume() -> None:
        watch = kubernetes.watch.Watch()
        for event in watch.stream(
            custom.list_namespaced_custom_object, *_coords(TRAININGJOBS), timeout_seconds=10
        ):
            obj = event["object"]
            received.append((event["type"], obj["metadata"]["name"], obj.get("status", {}), time.monotonic()))
            if len(received) == 4:
                watch.stop()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    watching = ApiRequest(
        "watch", TRAININGJOBS.group, TRAININGJOBS.version, TRAININGJOBS.plural, None, "default"
    )
    emulator.wait_for(lambda: watching in emulator.requests)

    started = time.monotonic()
    emulator.create(TRAININGJOBS, {"metadata": {"name": "job"}, "spec": {}})
    emulator.wait_for(lambda: received, interval=0.005)
    latency = received[0][3] - started
    emulator.patch(TRAININGJOBS, "default", "job", {"status": {"phase": "Running"}}, subresource="status")
    custom.patch_namespaced_custom_object(*_coords(TRAININGJOBS), "job", {"metadata": {"labels": {"a": "b"}}})
    emulator.delete(TRAININGJOBS, "default", "job")
    consumer.join(timeout=10)

    assert [event[:3] for event in received] == [
        ("ADDED", "job", {}),
        ("MODIFIED", "job", {"phase": "Running"}),
        ("MODIFIED", "job", {"phase": "Running"}),
        ("DELETED", "job", {"phase": "Running"}),
    ]
    assert latency < 0.2


def test_finalizers_hold_deletion_until_removed(custom: CustomObjectsApi) -> None:
    created = _create(custom, TRAININGJOBS, "job", metadata={"finalizers": ["rayship.dev/cleanup"]})

    marked = custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    again = custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    fetched = custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    assert marked["metadata"]["deletionTimestamp"] and fetched == again == marked

    custom.patch_namespaced_custom_object(*_coords(TRAININGJOBS), "job", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as error:
        custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    assert error.value.status == 404
    events = _watch(
        custom.list_namespaced_custom_object,
        *_coords(TRAININGJOBS),
        count=2,
        resource_version=created["metadata"]["resourceVersion"],
    )
    assert events == [("MODIFIED", "job"), ("DELETED", "job")]


def test_deleting_an_owner_garbage_collects_its_dependents_recursively(
    custom: CustomObjectsApi, core: CoreV1Api
) -> None:
    parent = _create(custom, TRAININGJOBS, "parent")
    other = _create(custom, TRAININGJOBS, "other")
    child = _create(custom, RAYJOBS, "child", metadata={"ownerReferences": [_owner(parent)]})
    _create(custom, RAYJOBS, "shared", metadata={"ownerReferences": [_owner(parent), _owner(other)]})
    _create(custom, RAYJOBS, "stranger", metadata={"ownerReferences": [_owner(other)]})
    for name, owner in [("grandchild", child), ("unrelated", other)]:
        core.create_namespaced_config_map(
            "default", {"metadata": {"name": name, "ownerReferences": [_owner(owner)]}}
        )
    since = core.list_namespaced_config_map("default").metadata.resource_version

    custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "parent")

    rayjobs = custom.list_namespaced_custom_object(*_coords(RAYJOBS))["items"]
    assert sorted(obj["metadata"]["name"] for obj in rayjobs) == ["shared", "stranger"]
    assert [cm.metadata.name for cm in core.list_namespaced_config_map("default").items] == ["unrelated"]
    assert _watch(
        custom.list_namespaced_custom_object, *_coords(RAYJOBS), count=1, resource_version=since
    ) == [("DELETED", "child")]
    assert _watch(core.list_namespaced_config_map, "default", count=1, resource_version=since) == [
        ("DELETED", "grandchild")
    ]


def test_discovery_serves_what_kopf_and_the_client_need(
    kube_api: ApiClient, custom: CustomObjectsApi
) -> None:
    assert kubernetes.client.CoreApi(kube_api).get_api_versions().versions == ["v1"]
    assert kubernetes.client.VersionApi(kube_api).get_code().major == "1"
    groups = {group.name for group in kubernetes.client.ApisApi(kube_api).get_api_versions().groups}
    assert groups == {"rayship.dev", "ray.io", "events.k8s.io", "rbac.authorization.k8s.io"}
    core = {res.name: res for res in CoreV1Api(kube_api).get_api_resources().resources}
    assert set(core) == {"namespaces", "events", "configmaps", "serviceaccounts"}
    assert not core["namespaces"].namespaced
    rayship = {res.name: res.kind for res in custom.get_api_resources("rayship.dev", "v1alpha1").resources}
    assert rayship == {
        "trainingjobs": "TrainingJob",
        "trainingjobs/status": "TrainingJob",
        "modelservices": "ModelService",
        "modelservices/status": "ModelService",
    }


def test_requests_are_recorded_with_rbac_verbs(
    emulator: EmulatorHandle, custom: CustomObjectsApi, core: CoreV1Api
) -> None:
    group, version, _, plural = _coords(TRAININGJOBS)
    created = _create(custom, TRAININGJOBS, "job")
    custom.get_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    custom.list_namespaced_custom_object(*_coords(TRAININGJOBS))
    custom.list_cluster_custom_object(group, version, plural)
    _watch(custom.list_namespaced_custom_object, *_coords(TRAININGJOBS), count=1)
    custom.replace_namespaced_custom_object(*_coords(TRAININGJOBS), "job", created)
    custom.patch_namespaced_custom_object(*_coords(TRAININGJOBS), "job", {"spec": {"replicas": 2}})
    custom.patch_namespaced_custom_object_status(
        *_coords(TRAININGJOBS), "job", {"status": {"phase": "Running"}}
    )
    custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
    custom.delete_collection_namespaced_custom_object(*_coords(TRAININGJOBS))
    core.create_namespaced_event(
        "default", {"metadata": {"generateName": "e-"}, "involvedObject": {"name": "job"}}
    )
    core.read_namespace("default")
    with pytest.raises(ApiException):
        custom.list_cluster_custom_object("unknown.dev", "v1", "things")
    emulator.create(CONFIGMAPS, {"metadata": {"name": "not-over-http"}})

    def request(verb: str, subresource: str | None = None, namespace: str | None = "default") -> ApiRequest:
        return ApiRequest(verb, group, version, plural, subresource, namespace)

    assert emulator.requests == [
        request("create"),
        request("get"),
        request("list"),
        request("list", namespace=None),
        request("watch"),
        request("update"),
        request("patch"),
        request("patch", "status"),
        request("delete"),
        request("deletecollection"),
        ApiRequest("create", "", "v1", "events", None, "default"),
        ApiRequest("get", "", "v1", "namespaces", None, None),
        ApiRequest("list", "unknown.dev", "v1", "things", None, None),
    ]
    assert [event["metadata"]["name"][:2] for event in emulator.list(EVENTS)] == ["e-"]


@pytest.mark.operator
def test_kopf_runs_end_to_end_against_the_emulator(
    emulator: EmulatorHandle, custom: CustomObjectsApi, run_kopf: Callable[..., Any]
) -> None:
    def parent_status() -> dict[str, Any]:
        parent = emulator.get(TRAININGJOBS, "default", "job")
        return parent.get("status", {}) if parent else {}

    with run_kopf("toy_operator", "--namespace=default") as runner:
        parent = _create(custom, TRAININGJOBS, "job", spec={"entrypoint": "python train.py"})
        child = emulator.wait_for(lambda: emulator.get(RAYJOBS, "default", "job-ray"))
        assert child["metadata"]["ownerReferences"] == [
            _owner(parent) | {"controller": True, "blockOwnerDeletion": True}
        ]
        assert child["spec"] == {"entrypoint": "python train.py"}
        emulator.wait_for(lambda: parent_status().get("phase") == "Created")

        custom.patch_namespaced_custom_object_status(
            *_coords(RAYJOBS), "job-ray", {"status": {"jobStatus": "RUNNING"}}
        )
        emulator.wait_for(lambda: parent_status() == {"phase": "Created", "jobStatus": "RUNNING"})

        custom.delete_namespaced_custom_object(*_coords(TRAININGJOBS), "job")
        emulator.wait_for(lambda: emulator.get(RAYJOBS, "default", "job-ray") is None)
        event = emulator.wait_for(lambda: emulator.list(EVENTS, "default"))[0]
        assert (event["reason"], event["involvedObject"]["uid"]) == (
            "RayJobCreated",
            parent["metadata"]["uid"],
        )

    log_problems = [
        line for line in runner.output.splitlines() if re.search(r"\[(ERROR|CRITICAL) *\]|Traceback", line)
    ]
    assert not log_problems, runner.output
    assert "Operator is stopping" in runner.output
