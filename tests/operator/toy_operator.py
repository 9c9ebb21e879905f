"""
A toy kopf operator that proves kopf works end to end against the emulator (see test_emulator.py).

A TrainingJob gets a child RayJob (owned by it, so garbage-collected with it) and ``status.phase``;
the RayJob's ``status.jobStatus`` is copied back into its owner's status.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
import kubernetes

CHILD_SUFFIX = "-ray"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rayship.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="rayship.dev")
    settings.posting.level = logging.INFO  # so that kopf.info() below posts a core v1 Event


@kopf.on.create("rayship.dev", "v1alpha1", "trainingjobs")
def create_rayjob(
    body: kopf.Body, spec: kopf.Spec, name: str, namespace: str, patch: kopf.Patch, **_: Any
) -> None:
    child: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": f"{name}{CHILD_SUFFIX}"},
        "spec": {"entrypoint": spec.get("entrypoint", "python train.py")},
    }
    kopf.adopt(child, owner=body)
    kubernetes.client.CustomObjectsApi().create_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayjobs", child
    )
    patch.status["phase"] = "Created"  # kopf sends it to the status subresource
    kopf.info(body, reason="RayJobCreated", message=f"Created RayJob {child['metadata']['name']}.")


@kopf.on.event("ray.io", "v1", "rayjobs")
def relay_job_status(type: str, body: kopf.Body, namespace: str, **_: Any) -> None:
    job_status = body.get("status", {}).get("jobStatus")
    owners = [
        ref["name"] for ref in body.metadata.get("ownerReferences", []) if ref.get("kind") == "TrainingJob"
    ]
    if type == "DELETED" or job_status is None or not owners:
        return  # nothing to relay, or the owner is gone already (the child is garbage-collected after it)
    kubernetes.client.CustomObjectsApi().patch_namespaced_custom_object_status(
        "rayship.dev",
        "v1alpha1",
        namespace,
        "trainingjobs",
        owners[0],
        {"status": {"jobStatus": job_status}},
    )
