"""What the operator may do in the cluster: the single source for the chart's (Cluster)Role.

Least privilege: exactly the verbs the controller uses (every request the operator tests record
is checked against these rules), no wildcards.
"""

from __future__ import annotations

from typing import Any

from rayship import api
from rayship.api import names

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
    {  # each TrainingSchedule's runs: made at their times, deleted beyond the history limits
        "apiGroups": [api.GROUP],
        "resources": [api.TRAININGJOBS[2]],
        "verbs": ["create", "delete"],
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
    {  # binds each TrainingJob's ServiceAccount to the workload ClusterRole (get: whose it is)
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["rolebindings"],
        "verbs": ["get", "create"],
    },
    {  # that ClusterRole only (its release's: `operator_rules`). A RoleBinding made without `bind` on
        # its role costs the API server a read of every RoleBinding in the namespace (its no-escalation
        # check): O(jobs) per job.
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles"],
        "resourceNames": [names.WORKLOAD_ROLE],
        "verbs": ["bind"],
    },
    {  # the NetworkPolicy of each resource's Ray pods; get: whose it is; patch: a new serveFrom
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "patch"],
    },
    {  # each ModelService's Ray token Secret, each TrainingJob's spec Secret: created, never read;
        # patched only where one of its name exists, with tests that it is the owner's (k8s.ensure)
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["create", "patch"],
    },
    {  # Serve's own application state from the Ray dashboard, as KubeRay reaches it
        "apiGroups": [""],
        "resources": ["services/proxy"],
        "verbs": ["get"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},  # why a Ray pod does not start
    # whether a TrainingJob's checkpoint claim exists, before its Ray cluster is made: list, watch:
    # kopf's index of the claims' names; get: a reconcile before the index has them
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch"]},
    {  # list, watch: kopf's index of the namespaces being deleted (the cluster-wide operator only:
        # `namespaced_operator_rules`); get: whether a namespace whose objects go is being deleted
        "apiGroups": [""],
        "resources": ["namespaces"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


# How the chart's generated files name its release's own cluster-wide objects: helm fills these in
# (`tpl`, from charts/rayship/templates/_helpers.tpl), `<release full name>-workload` and
# `<release full name>-workload-writes-its-own-status` (names.workload_role / names.workload_policy).
CHART_WORKLOAD_ROLE = '{{ include "rayship.workloadRole" . }}'
CHART_WORKLOAD_POLICY = '{{ include "rayship.workloadPolicy" . }}'


def operator_rules(workload_role: str) -> list[dict[str, Any]]:
    """OPERATOR_RULES of the release whose workload ClusterRole is `workload_role`: `bind` names that
    one ClusterRole, no other release's."""
    return [
        {**rule, "resourceNames": [workload_role]} if rule["resources"] == ["clusterroles"] else rule
        for rule in OPERATOR_RULES
    ]


def namespaced_operator_rules(workload_role: str) -> list[dict[str, Any]]:
    """The rules of the Role in each namespace of the chart's `watchNamespaces`: `operator_rules`, but
    `get` alone on namespaces. A Role grants reading its own namespace's Namespace object (the API
    server authorizes GET /api/v1/namespaces/NAME as a request in namespace NAME) and no list or watch
    of namespaces, which only the operator of every namespace makes (handlers.run)."""
    return [
        {**rule, "verbs": ["get"]} if rule["resources"] == ["namespaces"] else rule
        for rule in operator_rules(workload_role)
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


# The Ray pods of a TrainingJob (the release's ClusterRole, names.workload_role, bound per job): they
# report progress, checkpoints and tuning results into status. Which TrainingJob: `workload_policy`.
WORKLOAD_RULES: list[dict[str, Any]] = [
    {"apiGroups": [api.GROUP], "resources": [f"{api.TRAINING_JOB.plural}/status"], "verbs": ["patch"]},
]

_ACCOUNT_PREFIX = "'system:serviceaccount:' + request.namespace + ':'"


# The workload ServiceAccounts the operator makes carry these labels (names.labels, component
# workload-rbac): the admission policy takes them as its params, so it judges rayship's accounts only,
# not another team's `etl-workload` writing its own objects' status.
WORKLOAD_ACCOUNT_LABELS = {names.LABEL_COMPONENT: "workload-rbac", names.LABEL_MANAGED_BY: "rayship-operator"}
_NOT_THE_REQUESTER = f"request.userInfo.username != {_ACCOUNT_PREFIX} + params.metadata.name"


def workload_policy() -> dict[str, Any]:
    """The spec of each release's ValidatingAdmissionPolicy (names.workload_policy): a request by one of
    rayship's workload ServiceAccounts (its params: the ServiceAccounts of the request's namespace with
    WORKLOAD_ACCOUNT_LABELS, each judged in turn) may write only the status of the TrainingJob whose
    `status.workloadAccount` (the operator's) names it, never that field, and of it only the fields the
    workload writes (names.WORKLOAD_STATUS_FIELDS). RBAC cannot say "its own" for names made per job
    without a Role per job, whose create costs the API server a read of every RoleBinding in the
    namespace. Every validation holds for a param that is not the requester (`_NOT_THE_REQUESTER`), so another
    account, whatever its name, is left to RBAC.

    The same for every release, in every namespace (no namespaceSelector): several releases' policies
    admit exactly the same requests, so none refuses another release's workload accounts, and a
    namespace a release stops watching keeps its jobs' accounts narrowed as long as any release is
    installed."""
    account = f"{_ACCOUNT_PREFIX} + oldObject.status.workloadAccount"
    own = [
        {
            "expression": "has(oldObject.status) && has(oldObject.status.workloadAccount) && "
            f"request.userInfo.username == {account}",
            "reason": "Forbidden",
            "messageExpression": "request.userInfo.username + ' may write the status of its own "
            "TrainingJob only, not ' + request.namespace + '/' + object.metadata.name",
        },
        {
            "expression": "has(oldObject.status) && has(oldObject.status.workloadAccount) && "
            "has(object.status) && has(object.status.workloadAccount) && "
            "object.status.workloadAccount == oldObject.status.workloadAccount",
            "reason": "Forbidden",
            "message": "status.workloadAccount is the operator's to write",
        },
        *_operator_status_fields_unchanged(),
    ]
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "v1", "kind": "ServiceAccount"},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [api.GROUP],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": [f"{api.TRAINING_JOB.plural}/status"],
                }
            ]
        },
        "matchConditions": [
            {
                "name": "workload-accounts",
                "expression": f"request.userInfo.username.startsWith({_ACCOUNT_PREFIX}) && "
                f"request.userInfo.username.endsWith('{names.WORKLOAD_SUFFIX}')",
            }
        ],
        "validations": [{**v, "expression": f"{_NOT_THE_REQUESTER} || ({v['expression']})"} for v in own],
    }


def _operator_status_fields_unchanged() -> list[dict[str, Any]]:
    """One validation per status field the operator owns (every field of TrainingJobStatus but
    names.WORKLOAD_STATUS_FIELDS): the workload's account leaves it as it was. Code in the Ray pods (the
    user's image, any pip package) could otherwise rewrite the phase, the GPU- and CPU-hours a
    chargeback reads, or the attempts. One each, so that each stays within the API server's cost
    budget and the refusal names the field."""
    fields = [
        f.alias or name
        for name, f in api.TrainingJobStatus.model_fields.items()
        if (f.alias or name) not in (*names.WORKLOAD_STATUS_FIELDS, "workloadAccount")
    ]
    return [
        {
            "expression": f"!has(oldObject.status) || !has(object.status) || "
            f"(has(object.status.{field}) == has(oldObject.status.{field}) && "
            f"(!has(object.status.{field}) || object.status.{field} == oldObject.status.{field}))",
            "reason": "Forbidden",
            "message": f"status.{field} is the operator's to write (a TrainingJob's pods write "
            f"{', '.join(names.WORKLOAD_STATUS_FIELDS)})",
        }
        for field in fields
    ]


def workload_objects(
    role: str = names.WORKLOAD_ROLE, policy: str = names.WORKLOAD_POLICY
) -> list[dict[str, Any]]:
    """A release's cluster-wide objects for the Ray pods of its TrainingJobs: the ClusterRole `role`
    each job's RoleBinding binds, and the admission policy `policy` (with its binding) that narrows it."""
    admission = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": WORKLOAD_RULES,
        },
        {
            "apiVersion": admission,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": workload_policy(),
        },
        {
            "apiVersion": admission,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                # each of rayship's workload accounts in the request's namespace, judged in turn; none
                # there (no rayship job): nothing to judge
                "paramRef": {
                    "selector": {"matchLabels": dict(WORKLOAD_ACCOUNT_LABELS)},
                    "parameterNotFoundAction": "Allow",
                },
            },
        },
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
