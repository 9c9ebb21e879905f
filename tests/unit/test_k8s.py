"""How `rayship.controller.k8s` reads the API server's refusals (the only Kubernetes I/O module; its calls are
exercised on the real control plane in tests/operator)."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from rayship.controller import k8s


def refusal(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="refused")
    err.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return err


def test_an_invalid_object_is_rejected_for_good_with_the_servers_message() -> None:
    refused = k8s._classified(refusal(422, 'RayJob.ray.io "x" is invalid: spec.entrypoint: Required value'))
    assert isinstance(refused, k8s.Rejected)
    assert (refused.phase, refused.reason) == ("Invalid", "RejectedByAPIServer")
    assert "spec.entrypoint: Required value" in refused.message


def test_an_owner_kind_the_api_server_cannot_map_yet_is_retried_soon() -> None:
    """Seen right after a control plane (and our CRDs) came up: OwnerReferencesPermissionEnforcement
    refused the owner reference because discovery did not know TrainingJob yet."""
    message = (
        'serviceaccounts "mlp-cpu-workload" is forbidden: cannot set blockOwnerDeletion in this case '
        "because cannot find RESTMapping for APIVersion rayship.dev/v1alpha1 Kind TrainingJob: no matches "
        'for kind "TrainingJob" in version "rayship.dev/v1alpha1"'
    )
    busy = k8s._classified(refusal(403, message))
    assert isinstance(busy, k8s.Busy) and "does not know the owner's kind yet" in str(busy)


def test_anything_new_in_a_namespace_being_deleted_is_not_needed() -> None:
    message = (
        'rayjobs.ray.io "j" is forbidden: unable to create new content in namespace team-a because it is '
        "being terminated"
    )
    assert isinstance(k8s._classified(refusal(403, message)), k8s.Terminating)


def test_other_refusals_are_raised_as_they_are() -> None:
    assert k8s._classified(refusal(403, 'trainingjobs "x" is forbidden: User "y" cannot patch')) is None
    assert k8s._classified(refusal(409, "already exists")) is None
    assert k8s._classified(refusal(500, "etcdserver: request timed out")) is None


def test_the_connection_pool_holds_a_connection_per_concurrent_reconcile(monkeypatch) -> None:
    """With more reconciles at once than the client's pool (5 per CPU), each extra request would open
    a new TLS connection and drop it after."""
    import kubernetes

    previous = kubernetes.client.Configuration.get_default_copy()
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
    try:
        k8s.configure(connections=500)
        assert k8s._client().configuration.connection_pool_maxsize == 500
        assert k8s._client().rest_client.pool_manager.connection_pool_kw["maxsize"] == 500
    finally:
        kubernetes.client.Configuration.set_default(previous)
        k8s._client.cache_clear()
