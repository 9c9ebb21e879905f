"""`rayship apply -f FILE|DIR [-f ...] [-R] [-n NS] [--dry-run client|server]`: `kubectl apply`
(server-side) of the documents `-f` names, with a user's own code shipped: each local
`runtimeEnv.workingDir` is packed into a zip named by its content hash and put on the claim the job's
Ray pods mount (`codepack`, `codeupload`), and the object is applied pointing at it. Documents of other
kinds (the checkpoint claim, a ConfigMap) are applied first, in their order, so a claim in the same
files exists before code is put on it; rayship's kinds last.

Every document is checked first, by the rules the API server applies: one problem is one line naming
the file, the document and the field, and then nothing is uploaded or applied.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

from rayship import api, codeupload
from rayship.api.validation import SpecError, other_kind
from rayship.cli import kube
from rayship.cli.render import read, validated, with_code
from rayship.config import OperatorConfig, from_environment

FIELD_MANAGER = "rayship"


def namespaced(
    docs: list[tuple[str, Any, Any]], flag: str | None, default: str
) -> list[tuple[str, Any, Any]]:
    """Each document in its namespace, as kubectl decides it: its own, else -n's, else the context's;
    its own and -n's differing is an error (kubectl's too). A cluster-scoped kind is left as it is
    (its namespace, if any, is the API server's to refuse)."""
    out, errors = [], []
    for label, doc, base in docs:
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        if not isinstance(meta, dict):
            out.append((label, doc, base))
            continue
        own = meta.get("namespace")
        if own and flag and own != flag:
            errors.append(
                f"{label}: metadata.namespace is {own} and -n says {flag}: drop one of them (as kubectl, "
                "rayship applies an object only to the namespace it names)"
            )
            continue
        if not own and not cluster_scoped(doc):
            doc = {**doc, "metadata": {**meta, "namespace": flag or default}}
        out.append((label, doc, base))
    if errors:
        raise SpecError(errors)
    return out


# Kinds of no namespace that a manifest beside a job may hold (others get the default namespace, as
# kubectl gives them; the API server refuses a namespace on a cluster-scoped kind anyway).
CLUSTER_SCOPED = frozenset({"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                            "ClusterRoleBinding", "PriorityClass", "CustomResourceDefinition"})  # fmt: skip


def cluster_scoped(doc: dict[str, Any]) -> bool:
    return doc.get("kind") in CLUSTER_SCOPED


def image_of(doc: dict[str, Any], flag: str | None, config: OperatorConfig) -> str:
    """The uploader pod's image: --image, else the object's spec.image, else the operator's default
    (RAYSHIP_DEFAULT_IMAGE here, as the operator reads it): one the cluster already pulls for Ray."""
    return flag or (doc.get("spec") or {}).get("image") or config.default_image


def cmd_apply(args: argparse.Namespace) -> int:
    config = from_environment()
    entries = read(args.file, args.recursive)
    conn = kube.connect(args.kubeconfig, args.context) if args.dry_run != "client" else None
    default = conn.namespace if conn else "default"
    entries = namespaced(entries, args.namespace, default)
    docs, shipments = with_code(entries, _lookup(conn) if conn else None)
    validated(docs)  # every problem of every document, before anything is sent
    rayship_kinds = [(label, doc) for label, doc in docs if not other_kind(doc)]
    others = [(label, doc) for label, doc in docs if other_kind(doc)]
    if conn is None:
        for label, planned in shipments.items():
            print(f"{label}: {planned.field} would be packed ({planned.package.counted}) as {planned.uri}")
        for _, doc in others + rayship_kinds:
            print(f"{_ref(doc)} (dry run: client)")
        return kube.EXIT_OK
    dry = args.dry_run == "server"
    for _, doc in others:
        _apply(conn, doc, dry)
    uploaded: set[tuple[str, str, str]] = set()
    for label, doc in rayship_kinds:
        shipment = shipments.get(label)
        if shipment is None:
            continue
        namespace = doc["metadata"]["namespace"]
        key = (namespace, shipment.claim.claim_name, shipment.package.sha256)
        if key in uploaded:
            continue
        uploaded.add(key)
        if dry:
            print(
                f"{shipment.folder} -> {shipment.uri} on claim {shipment.claim.claim_name} (dry run: server)"
            )
            continue
        print(
            f"packing {shipment.folder} ({shipment.package.counted}, {len(shipment.package.data)} bytes) "
            f"-> {shipment.uri} on claim {shipment.claim.claim_name} ...",
            flush=True,
        )
        core = _core(conn)
        with kube.talking(conn, f"the code of {label}", "pods"):
            try:
                said = codeupload.upload(core, shipment, namespace, image_of(doc, args.image, config), config)
            except codeupload.UploadError as err:
                raise kube.ClusterError(f"{label}: {err}") from None
        print(f"  {'already there' if said == 'present' else 'uploaded'}: {shipment.package.name}")
    for _, doc in rayship_kinds:
        _apply(conn, doc, dry)
    return kube.EXIT_OK


def _core(conn: kube.Connection) -> Any:
    import kubernetes

    return kubernetes.client.CoreV1Api(conn.client)


def _lookup(conn: kube.Connection) -> Any:
    """A TrainingJob of the cluster by (name, namespace), as a dict, or None."""

    def lookup(name: str, namespace: str | None) -> dict[str, Any] | None:
        import kubernetes
        from kubernetes.client import ApiException

        kind = api.TRAINING_JOB
        group, version, plural = kind.resource
        custom = kubernetes.client.CustomObjectsApi(conn.client)
        where = namespace or conn.namespace
        with kube.talking(conn, f"trainingjob {name} in namespace {where}", kind.crd_name):
            try:
                found = custom.get_namespaced_custom_object(
                    group, version, where, plural, name, _request_timeout=kube.TIMEOUT
                )
                return cast(dict[str, Any], found)
            except ApiException as err:
                if err.status == 404 and kube.status_body(err.body)[1].get("name"):
                    return None
                raise

    return lookup


def _ref(doc: dict[str, Any]) -> str:
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    kind = str(doc.get("kind", "")).lower()
    return f"{kind}.{group}/{doc['metadata']['name']}" if group else f"{kind}/{doc['metadata']['name']}"


def _apply(conn: kube.Connection, doc: dict[str, Any], dry: bool) -> None:
    """Server-side apply (as `kubectl apply --server-side`), said as kubectl says it."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

    name = doc["metadata"]["name"]
    namespace = doc["metadata"].get("namespace")
    what = f"{_ref(doc)}" + (f" in namespace {namespace}" if namespace else "")
    with kube.talking(conn, what, f"{doc.get('kind')} ({doc.get('apiVersion')})"):
        try:
            dynamic = DynamicClient(conn.client)
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        except ResourceNotFoundError:
            raise kube.not_served(conn, f"{doc.get('kind')} ({doc.get('apiVersion')})") from None
        try:
            before = resource.get(
                name=name, namespace=namespace, _request_timeout=kube.TIMEOUT
            ).metadata.resourceVersion
        except DynamicApiError as err:
            if err.status != 404:
                raise _said(conn, err, what) from None
            before = None
        try:
            after = resource.server_side_apply(
                body=doc, name=name, namespace=namespace, field_manager=FIELD_MANAGER,
                dry_run="All" if dry else None, _request_timeout=kube.TIMEOUT,
            )  # fmt: skip
        except DynamicApiError as err:
            raise _said(conn, err, what) from None
    verb = (
        "created"
        if before is None
        else "unchanged"
        if after.metadata.resourceVersion == before
        else "configured"
    )
    print(f"{_ref(doc)} {verb}" + (" (server dry run)" if dry else ""))


def _said(conn: kube.Connection, err: Any, what: str) -> kube.ClusterError:
    """The dynamic client's error as the CLI's one line (the API server's message: a refused field
    names it; a conflict names the other manager)."""
    message, _ = kube.status_body(err.body)
    if err.status in (401, 403, 404):
        return kube.api_error(err, conn, what)
    return kube.ClusterError(f"{what}: {message or err.summary()}")


def add_parser(sub: Any, cluster: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "apply",
        parents=[cluster],
        help="apply TrainingJobs, ModelServices and other manifests to a cluster, your code folder included",
        description="kubectl apply (server-side) of -f's documents, read as kubectl reads them. A local "
        "runtimeEnv.workingDir is packed into a zip named by its content hash, put on the claim the Ray "
        "pods mount (a short-lived pod, as kubectl cp), and the object applied pointing at it.",
    )
    p.add_argument("-f", "--file", action="append", required=True, help="a YAML/JSON file, a folder, or -")
    p.add_argument("-R", "--recursive", action="store_true", help="also read the folders' subfolders")
    p.add_argument(
        "--image",
        help="image of the pod that puts code on the claim (default: spec.image, else the operator's "
        "default workload image, RAYSHIP_DEFAULT_IMAGE)",
    )
    p.add_argument(
        "--dry-run",
        choices=("none", "client", "server"),
        default="none",
        help="client: check and pack, send nothing; server: the API server checks the objects, nothing is "
        "stored or uploaded",
    )
    p.set_defaults(func=cmd_apply)
