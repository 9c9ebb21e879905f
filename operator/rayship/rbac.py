"""What the operator may do in the cluster: the single source for the chart's (Cluster)Role.

Least privilege: exactly the verbs the controller uses (every request the operator tests record
is checked against these rules), no wildcards.
"""

from __future__ import annotations

from typing import Any

from rayship import api, names

_OURS = [kind.plural for kind in api.KINDS]
_KUBERAY = [api.RAYJOBS[2], api.RAYSERVICES[2]]

OPERATOR_RULES: list[dict[str, Any]] = [
    {  # watch our resources; kopf keeps its bookkeeping in annotations (patch)
        "apiGroups": [api.GROUP],
        "resources": _OURS,
        "verbs": ["get", "list", "watch", "patch"],
    },
    {
        "apiGroups": [api.GROUP],
        "resources": [f"{plural}/status" for plural in _OURS],
        "verbs": ["get", "patch"],
    },
    {  # the KubeRay objects the operator owns
        "apiGroups": [api.KUBERAY_GROUP],
        "resources": _KUBERAY,
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {  # owner references with blockOwnerDeletion (kopf.adopt) need this under
        # OwnerReferencesPermissionEnforcement
        "apiGroups": [api.GROUP],
        "resources": [f"{plural}/finalizers" for plural in _OURS],
        "verbs": ["update"],
    },
    {  # per-TrainingJob identity of the Ray pods (progress reporting); get: whose it is
        "apiGroups": [""],
        "resources": ["serviceaccounts"],
        "verbs": ["get", "create"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "create"],
    },
    {  # each ModelService's Ray token Secret: created, never read (the operator derives the token)
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["create"],
    },
    {  # Serve's own application state from the Ray dashboard, as KubeRay reaches it
        "apiGroups": [""],
        "resources": ["services/proxy"],
        "verbs": ["get"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},  # why a Ray pod does not start
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},  # kopf, cluster-wide
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


# In the operator's own namespace only: the key the Ray tokens are derived from (that one Secret).
KEY_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": [names.TOKEN_KEY_SECRET],
        "verbs": ["get"],
    },
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},  # made on first start
]


def allows(
    rules: list[dict[str, Any]], verb: str, group: str, resource: str, subresource: str | None
) -> bool:
    """Whether an RBAC rule list grants one request (as the API server matches them)."""
    full = f"{resource}/{subresource}" if subresource else resource
    return any(
        group in rule.get("apiGroups", [])
        and full in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in rules
    )
