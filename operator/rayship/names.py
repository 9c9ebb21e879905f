"""Names, labels and annotations: every key rayship writes comes from here."""

from __future__ import annotations

import hashlib
import re

from rayship import api

PART_OF = "rayship"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TRAININGJOB = f"{api.GROUP}/trainingjob"
LABEL_MODELSERVICE = f"{api.GROUP}/modelservice"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"

# On a RayJob: the TrainingJob spec it was rendered from (canonical JSON), to tell edits apart.
ANNOTATION_SPEC = f"{api.GROUP}/applied-spec"

ENV_TRAININGJOB = "RAYSHIP_TRAININGJOB"

# KubeRay rejects RayJob names longer than this (it derives RayCluster and pod names from them).
MAX_RAYJOB_NAME = 47
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def dns1035_name(name: str, max_length: int) -> str:
    """`name` itself when it is a DNS-1035 label within `max_length`; otherwise a stable, readable
    truncation ending in a hash of the full name, so distinct names never collide."""
    if len(name) <= max_length and _DNS1035.match(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    stem = re.sub(r"[^-a-z0-9]", "-", name.lower())
    stem = re.sub(r"^[^a-z]+", "", stem)[: max_length - len(digest) - 1].strip("-")
    return f"{stem}-{digest}" if stem else f"r{digest}"


def rayjob_name(trainingjob_name: str) -> str:
    return dns1035_name(trainingjob_name, MAX_RAYJOB_NAME)


def rayservice_name(modelservice_name: str) -> str:
    return dns1035_name(modelservice_name, MAX_RAYJOB_NAME)  # KubeRay: RayService names <= 47 too


def workload_account(trainingjob_name: str) -> str:
    """ServiceAccount (and Role, RoleBinding) the Ray pods of one TrainingJob run as."""
    return dns1035_name(f"{trainingjob_name}-workload", 63)


def labels(kind: str, name: str, component: str) -> dict[str, str]:
    """Labels on every object rayship renders for the custom resource `kind/name`."""
    return {
        LABEL_NAME: PART_OF,
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        LABEL_PART_OF: PART_OF,
        LABEL_MANAGED_BY: "rayship-operator",
        f"{api.GROUP}/{kind.lower()}": name,
    }
