"""The building blocks both kinds share: the API group, the patterns and CEL rules written once (the
API server and pydantic enforce the same text), the base model, core-style types (tolerations, env,
secret references), metav1.Condition, and what the CRD generator knows of a kind (`Kind`)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "rayship.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# (group, version, plural) of every resource the operator reads or writes: each plural spelled once.
Resource = tuple[str, str, str]
KUBERAY_GROUP = "ray.io"
KUBERAY_VERSION = "v1"
RAYJOBS: Resource = (KUBERAY_GROUP, KUBERAY_VERSION, "rayjobs")
RAYSERVICES: Resource = (KUBERAY_GROUP, KUBERAY_VERSION, "rayservices")
# The checkpoint claim a TrainingJob names, looked up before its Ray cluster is made (core group: "").
PVCS: Resource = ("", "v1", "persistentvolumeclaims")

# --- shared patterns ---------------------------------------------------------------------------

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A label key / taint key: an optional DNS subdomain prefix and '/', then a name (Kubernetes'
# IsQualifiedName).
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
CIDR_PATTERN = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"  # an IPv4 or IPv6 CIDR (the API server checks it exactly)
IMAGE_PATTERN = r"^\S+$"  # no whitespace anywhere: the kubelet cannot pull such a reference
# Memory: whole bytes (no milli-units such as 1m); bounds (>= 64Mi, < 8Ei) are CEL rules below.
MEMORY_PATTERN = r"^[0-9]+(\.[0-9]+)?(k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
MIN_MEMORY = "64Mi"
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# Ray >= 2.52.0: KubeRay v1.7 rejects token auth (which rayship always enables) on older Ray.
RAY_VERSION_PATTERN = r"^(2\.(5[2-9]|[6-9][0-9]|[1-9][0-9]{2,})|([3-9]|[1-9][0-9]+)\.[0-9]+)\.[0-9]+$"
INT32_MAX = 2**31 - 1  # KubeRay's int32 fields (activeDeadlineSeconds, ttlSecondsAfterFinished)
MAX_SPEC_BYTES = 64 * 1024  # the resolved spec travels in the RayJob's entrypoint and an annotation
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
# Environment variable names that say they hold a secret (RE2 and Python re alike): their values
# belong in a Secret (`env[].valueFrom.secretKeyRef`), never in the spec.
SECRET_NAME_PATTERN = r"(?i)(pass(word)?|secret|token|api_?key|access_?key|private_?key|credential)"
# runtimeEnv.workingDir in a cluster: a zip archive Ray downloads, or (file://) one on a volume the Ray
# pods mount, where `rayship apply` uploads a local folder (a local folder itself only for `rayship run`).
WORKING_DIR_URI_PATTERN = r"^((s3|gs|https?)://.+|file:///.+)[.]zip$"
# data.uri / data.validation.uri in a cluster: an absolute path (a mounted volume) or a URI (a
# relative path is read from runtimeEnv.workingDir, as `rayship run` reads it beside the YAML file).
DATA_URI_IN_CLUSTER_PATTERN = r"^(/|[a-z][a-z0-9+.-]*://)"


# --- CEL rules: written once, enforced by the API server and by pydantic -----------------------


@dataclass(frozen=True)
class CelRule:
    """A Kubernetes `x-kubernetes-validations` rule on the object it is attached to."""

    rule: str
    message: str
    # In the CRD (the cluster needs it) but not checked for local runs (`rayship run`), which
    # validate with `parse(doc, local=True)`.
    cluster_only: bool = False
    # False for the rare rule the API server's CEL cannot type-check (checked by rayship only).
    in_crd: bool = True
    # A CEL string expression saying the values that broke the rule (Kubernetes' messageExpression):
    # the API server and rayship both say it (`explained`); `message` where it cannot be evaluated.
    message_expression: str = ""

    def as_schema(self) -> dict[str, str]:
        schema = {"rule": self.rule, "message": self.message}
        if self.message_expression:
            schema["messageExpression"] = self.message_expression
        return schema

    def explained(self, value: Any) -> str:
        """What the API server says when the rule fails on `value`: its messageExpression's text, or
        its message."""
        if not self.message_expression:
            return self.message
        from rayship.api import cel

        return cel.text(self.message_expression, value) or self.message


def said_with_values(*parts: str) -> str:
    """A messageExpression from text and `self.` fields, each said as its value: `said_with_values(
    "replicas.min (", "self.min", ") is more than ...")`. Written with the strings library's `format`
    (Kubernetes >= 1.29): the API server bounds its cost by the constant text, where concatenating
    `string(self.min)` has a cost it cannot bound, and refuses the CRD."""
    text = "".join("%s" if p.startswith("self.") else p.replace("%", "%%") for p in parts)
    values = ", ".join(p for p in parts if p.startswith("self."))
    return f"{text!r}.format([{values}])"


# Query parameters that carry a credential: an S3 or GCS presigned URL's signature, an Azure SAS's
# `sig`, a bearer token or an API key in the query.
SIGNATURE_PARAMS = (
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
    "sig", "signature", "token", "access_token", "api_key", "apikey", "key",
)  # fmt: skip
_CREDENTIAL_IN_URI = "[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\\\\s]*@"
# Azure's container@account is no credential (abfs://container@account.dfs.core.windows.net/path).
_AZURE_CONTAINER = "^(abfss?|wasbs?)://[-a-z0-9]+@"
_SIGNATURE_IN_QUERY = "(?i)[?&](" + "|".join(SIGNATURE_PARAMS) + ")="
_BY_REFERENCE = (
    "is readable by anyone who can read this object; remove it and give it by reference: "
    "spec.env[].valueFrom.secretKeyRef (e.g. MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY)"
)


def no_credentials_rule(field: str, path: str) -> CelRule:
    """A URI field holds no credential (`user:password@` or `token@`, blanks before it or not): the
    object, and the RayJob or RayService made from it, are readable by anyone who may `get` them, and Ray
    shows the job's entrypoint on its dashboard. Credentials reach the workload by reference, as
    environment variables. See `uri_rules` for the whole set a URI field takes."""
    return CelRule(
        f"!has(self.{field}) || !self.{field}.matches('^\\\\s*{_CREDENTIAL_IN_URI}') || "
        f"self.{field}.matches('{_AZURE_CONTAINER}')",
        f"{path}: a credential in the URI (user:password@ or token@) {_BY_REFERENCE}",
    )


def uri_rules(field: str, path: str) -> tuple[CelRule, ...]:
    """What every URI field takes: no blanks around it (a leading one hid a credential from the rule),
    no credential before the host, no signature or token in the query (a presigned S3 URL, an Azure SAS)."""
    return (
        CelRule(
            f"!has(self.{field}) || !self.{field}.matches('^\\\\s|\\\\s$')",
            f"{path}: blanks before or after the URI: remove them",
        ),
        no_credentials_rule(field, path),
        CelRule(
            f"!has(self.{field}) || !self.{field}.matches('{_SIGNATURE_IN_QUERY}')",
            f"{path}: a signature or token in the query (X-Amz-Signature, sig=, token=, ...) {_BY_REFERENCE}; "
            "give the plain URI",
        ),
    )


def pip_rules(field: str, path: str) -> tuple[CelRule, ...]:
    """What a list of pip requirements takes: packages, not pip's options (`-r /etc/passwd` reads a
    local file, `--extra-index-url` invites dependency confusion, `--index-url` often holds a password),
    and no credential or signature in any entry (`git+https://user:token@...`, `pkg @ https://...?sig=`)."""
    guard = f"!has(self.{field}) || self.{field}.all(p, "
    return (
        CelRule(
            guard + "!p.matches('^\\\\s*-'))",
            f"{path}: pip options (-r, -e, -c, -f, --index-url, --extra-index-url, ...) are not taken: list "
            "packages only; a private index belongs in the image's pip configuration",
        ),
        CelRule(
            guard + f"!p.matches('{_CREDENTIAL_IN_URI}') && !p.matches('{_SIGNATURE_IN_QUERY}'))",
            f"{path}: a credential in a package's URL (user:token@, or a signature in its query) {_BY_REFERENCE}",
        ),
    )


def data_uri_rule(field: str) -> CelRule:
    """In a cluster, data is read from an absolute path (a mounted volume) or a URI; a relative path
    only from the job's own runtimeEnv.workingDir (as `rayship run` reads it beside the YAML file)."""
    parts = field.split(".")
    present = " && ".join(f"has(self.{'.'.join(parts[:i])})" for i in range(1, len(parts) + 1))
    return CelRule(
        "(has(self.runtimeEnv) && has(self.runtimeEnv.workingDir)) || "
        f"!({present}) || self.{field}.matches('{DATA_URI_IN_CLUSTER_PATTERN}')",
        f"{field}: in a cluster a relative path is read from runtimeEnv.workingDir, and there is none: "
        "use an absolute path (e.g. on the checkpoint volume) or a URI (s3://...)",
        cluster_only=True,
    )


def cel_holds(rule: str, value: Any) -> bool:
    """Evaluate a CEL rule with `self` bound to `value` (a JSON-like structure) as the API server
    does: a rule whose evaluation fails (e.g. a missing field) does not hold. cel-expr-python is
    imported on the first rule evaluated (`rayship.api.cel`)."""
    from rayship.api import cel

    return cel.holds(rule, value)


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected, CEL rules checked."""

    # strict: like the API server, "yes" is not a boolean and "5" is not an integer
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", validate_default=True, strict=True)
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self, info: ValidationInfo) -> ApiModel:
        context = info.context or {}
        local, admitted = bool(context.get("local")), bool(context.get("admitted"))
        # `admitted`: read from the API server, which enforced the CRD's rules when it was written.
        rules = [r for r in self.cel_rules if not (local and r.cluster_only) and not (admitted and r.in_crd)]
        if rules:
            wire = self.model_dump(mode="json", by_alias=True, exclude_none=True)
            failed = [r.explained(wire) for r in rules if not cel_holds(r.rule, wire)]
            if failed:
                raise ValueError("; ".join(failed))
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, defaults applied, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def sub(model: type[BaseModel], description: str) -> Any:
    """A nested object field that defaults to the object of its own defaults: the API server checks
    a default against the object's CEL rules as it stands, so `{}` would fail rules on its fields."""

    def default(schema: dict[str, Any]) -> None:
        schema["default"] = model().model_dump(mode="json", by_alias=True, exclude_none=True)

    def factory() -> BaseModel:
        # The defaults' CEL rules are not evaluated: the API server checks the CRD's defaults
        # against them (and tests/unit/test_cel.py does too).
        return model.model_validate({}, context={"admitted": True})

    return Field(default_factory=factory, description=description, json_schema_extra=default)


# --- core-style building blocks ----------------------------------------------------------------


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1 Toleration) added to the worker pods."""

    cel_rules: ClassVar = (
        CelRule(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "operator Exists matches any value: remove value (or use operator Equal)",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds applies only to effect NoExecute",
        ),
        CelRule(
            "(has(self.key) && self.key != '') || self.operator == 'Exists'",
            "an empty key matches every taint only with operator Exists",
        ),
    )
    key: str | None = Field(
        None,
        pattern=QUALIFIED_NAME_PATTERN,
        max_length=316,
        description="Taint key the toleration applies to; empty matches all keys.",
    )
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(
        None,
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Taint value to match when operator is Equal.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None,
        ge=0,
        description="For NoExecute: how long the pod stays bound after the taint appears.",
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the TrainingJob's namespace."""

    name: str = Field(
        ..., pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253, description="Name of the Secret."
    )
    key: str = Field(..., pattern=SECRET_KEY_PATTERN, max_length=253, description="Key within the Secret.")
    optional: bool | None = Field(None, description="Start even if the Secret or key is missing.")


class EnvValueFrom(ApiModel):
    """Where an environment value comes from. Only Secret references are allowed: no inline secrets."""

    secret_key_ref: SecretKeyRef = Field(..., description="Read the value from a Secret key.")


# Env names no user list may set, in any kind and any env list (spec.env, runtimeEnv.envVars): rayship's
# own (RAYSHIP_MODELSERVICE names the pod's owner), and the NVIDIA container runtime's, which it reads to
# hand a container devices: in its default env mode, NVIDIA_VISIBLE_DEVICES=all in a CPU pod shows it
# every GPU of its node, other tenants' included (NVIDIA_MIG_MONITOR_DEVICES, NVIDIA_DRIVER_CAPABILITIES
# and the rest widen it too). NVIDIA_TF32_OVERRIDE is a CUDA library's knob read inside the process.
RESERVED_ENV_PREFIXES = ("RAYSHIP_", "NVIDIA_")
ALLOWED_ENV_NAMES = ("NVIDIA_TF32_OVERRIDE",)


def reserved_env_rule(names: str, field: str) -> CelRule:
    """On an object: no env name in `names` (a CEL list of strings, or a map whose keys are the names,
    e.g. `self.envVars`, which may be absent) is reserved (RESERVED_ENV_PREFIXES). `field` is said in the
    message."""
    reserved = " || ".join(f"n.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES)
    allowed = ", ".join(f"'{a}'" for a in ALLOWED_ENV_NAMES)
    guard = f"!has({names}) || " if names.startswith("self.") else ""
    return CelRule(
        f"{guard}{names}.all(n, !({reserved}) || n in [{allowed}])",
        f"{field}: names starting with {' or '.join(RESERVED_ENV_PREFIXES)} are rayship's or the GPU "
        "runtime's (NVIDIA_VISIBLE_DEVICES would show the pod GPUs it was not given); rename the variable",
    )


class EnvVar(ApiModel):
    """An environment variable for every Ray container: a plain value, or a Secret reference."""

    cel_rules: ClassVar = (
        CelRule("has(self.value) != has(self.valueFrom)", "set exactly one of value or valueFrom"),
        reserved_env_rule("[self.name]", "env[].name"),
    )
    name: str = Field(..., pattern=ENV_NAME_PATTERN, max_length=128, description="Variable name.")
    value: str | None = Field(None, description="Plain value (never a secret: use valueFrom).")
    value_from: EnvValueFrom | None = Field(None, description="Value from a Secret key.")


# Where GPU worker pods go: shared by TrainingJob workers and ModelService replicas.
GpuProduct = Annotated[
    str | None,
    Field(
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Required GPU model (value of the node label nvidia.com/gpu.product).",
    ),
]
LabelValues = Annotated[
    dict[str, Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]],
    Field(max_length=64, description="Labels that must all match (keys are label keys)."),
]


def label_keys_rule(field: str) -> CelRule:
    """On an object with the label map `field`: its keys must be label keys (values are checked by
    pattern)."""
    return CelRule(
        f"!has(self.{field}) || self.{field}.all(k, k.size() <= 316 && k.matches('"
        + QUALIFIED_NAME_PATTERN.replace("\\", "\\\\")  # a CEL string literal: backslashes escaped
        + "'))",
        f"{field} keys must be label keys: [prefix/]name, name at most 63 letters, digits, '-', '_', '.'",
    )


def name_rule(limit: int = 63, why: str = "") -> CelRule:
    """On a kind: metadata.name is a DNS-1123 label of at most `limit` characters (`why`: the reason
    for a limit below 63, said in the message)."""
    return CelRule(
        f"self.metadata.name.size() <= {limit} && self.metadata.name.matches('{DNS1123_LABEL_PATTERN}')",
        f"metadata.name must be a DNS-1123 label: at most {limit} lowercase letters, digits and '-', "
        "starting and ending with a letter or digit" + (f" ({why})" if why else ""),
    )


NodeSelector = Annotated[
    LabelValues,
    Field(default_factory=dict, description="Extra node labels the worker pods must match."),
]
NODE_SELECTOR_KEYS = label_keys_rule("nodeSelector")


def cpu_rule(field: str) -> CelRule:
    """CPU of at least 1m, as CEL: the API server checks `minimum: 0.001` against an integer 0 as
    the integer minimum 0 (kube-openapi truncates it) and lets 0 through; CEL sees the double."""
    return CelRule(f"self.{field} >= 0.001", f"{field} must be at least 0.001 (1m): a pod needs some CPU")


def memory_rule(field: str) -> CelRule:
    return CelRule(
        f"quantity(self.{field}).compareTo(quantity('{MIN_MEMORY}')) >= 0 "
        f"&& quantity(self.{field}).isLessThan(quantity('8Ei'))",
        f"{field} must be at least {MIN_MEMORY} (Ray needs more) and below 8Ei",
    )


Tolerations = Annotated[
    list[Toleration],
    Field(default_factory=list, max_length=32, description="Extra tolerations for the worker pods."),
]


class LabelSelector(ApiModel):
    """Pods or namespaces by their labels (a metav1.LabelSelector with matchLabels only); `{}` selects
    all."""

    cel_rules: ClassVar = (label_keys_rule("matchLabels"),)
    match_labels: LabelValues = Field(default_factory=dict, description="Labels that must all match.")


class IpBlock(ApiModel):
    """Addresses outside the pod network (a networking/v1 IPBlock)."""

    cidr: str = Field(..., pattern=CIDR_PATTERN, max_length=43, description="A CIDR, e.g. 10.0.0.0/8.")
    except_: list[Annotated[str, Field(pattern=CIDR_PATTERN, max_length=43)]] | None = Field(
        None, alias="except", max_length=32, description="CIDRs inside cidr that are not allowed."
    )

    @model_validator(mode="after")
    def _cidrs_the_api_server_takes(self) -> IpBlock:
        """The pattern only shapes a CIDR; the NetworkPolicy the operator writes would be refused for
        /33 or an octet of 999 (checked here, as the API server parses it, host bits allowed)."""
        for field, value in [("cidr", self.cidr), *(("except", c) for c in self.except_ or [])]:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError as err:
                raise ValueError(f"{field}: {value!r} is not a CIDR ({err}); e.g. 10.0.0.0/8") from None
        return self


class NetworkPeer(ApiModel):
    """Who may connect (a networking/v1 NetworkPolicyPeer): pods by podSelector, in the namespaces of
    namespaceSelector (none: the object's own namespace), or addresses by ipBlock."""

    cel_rules: ClassVar = (
        CelRule(
            "has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",
            "set podSelector, namespaceSelector or ipBlock",
        ),
        CelRule(
            "!has(self.ipBlock) || (!has(self.podSelector) && !has(self.namespaceSelector))",
            "ipBlock goes alone: put pods and namespaces in another entry",
        ),
    )
    pod_selector: LabelSelector | None = Field(None, description="Pods by their labels.")
    namespace_selector: LabelSelector | None = Field(None, description="Namespaces by their labels.")
    ip_block: IpBlock | None = Field(None, description="Addresses outside the pod network.")


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(..., max_length=316, description="Condition type, e.g. Running, Complete.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(
        ..., pattern=CONDITION_REASON_PATTERN, max_length=1024, description="CamelCase reason."
    )
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(..., description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation it reflects.")


# --- the resource ------------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The part of metadata that rayship reads; the rest is kept as-is."""

    model_config = ConfigDict(extra="allow")
    # strict: a name is a string as written, not bytes a YAML tag made (yamlio refuses those first)
    name: str = Field(..., min_length=1, strict=True)
    # what the API server takes: a namespace is a DNS-1123 label (omit it for the context's own)
    namespace: str | None = Field(None, max_length=63, pattern=DNS1123_LABEL_PATTERN, strict=True)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _labels_the_api_server_takes(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            _qualified_name(key)
            if len(value) > 63 or not re.match(LABEL_VALUE_PATTERN, value):
                raise ValueError(
                    f"{key}={value!r}: a label value is at most 63 letters, digits, '-', '_' and '.', "
                    "starting and ending with a letter or digit (or empty): put longer text in an annotation"
                )
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotations_the_api_server_takes(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            _qualified_name(key.lower())  # the API server checks annotation keys lowercased
        size = sum(len(k) + len(v) for k, v in annotations.items())
        if size > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"{size} bytes in all: annotations may hold at most 256 KiB (keys and values)")
        return annotations


MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's TotalAnnotationSizeLimitB


def _qualified_name(key: str) -> None:
    """A label or annotation key as the API server's IsQualifiedName takes it: [prefix/]name, the prefix
    a DNS subdomain of at most 253, the name at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if (
        not re.match(QUALIFIED_NAME_PATTERN, key)
        or len(name) > 63
        or len(prefix) > 253
        or (prefix == "" and "/" in key)
    ):
        raise ValueError(
            f"key {key!r} is not a qualified name: [prefix/]name, the name at most 63 letters, digits, '-', "
            "'_' and '.' starting and ending with a letter or digit, the prefix a DNS subdomain "
            "(lowercase, at most 253)"
        )


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0  # 1: shown by `kubectl get -o wide` only

    def as_crd(self) -> dict[str, str | int]:
        column: dict[str, str | int] = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class Kind:
    """Everything the CRD generator needs to know about a kind besides its schema."""

    model: type[ApiModel]
    spec_model: type[ApiModel]
    status_model: type[ApiModel]
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def resource(self) -> Resource:
        return (GROUP, VERSION, self.plural)

    @property
    def root_rules(self) -> tuple[CelRule, ...]:
        return self.model.cel_rules
