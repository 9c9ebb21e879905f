"""`rayship logs tj/NAME` (and `ms/NAME`, below): a TrainingJob's output as its workload keeps it next to the checkpoints
(`<mount>/<namespace>.<name>/logs/attempt-<N>/<process>.log`, rayship_workloads.joblog), so that it
outlives the Ray cluster.

The files are read by one shell script (`reader_script`), run where the checkpoint PVC is mounted:
in the job's Ray head while its cluster runs (`kubectl exec`'s API: follows the file with -f), else
in a short-lived reader pod that mounts the PVC read-only, is read with `kubectl logs`' API and
deleted. The caller's kubeconfig and context are used, as kubectl's (`rayship.cli.kube`, which says in
one line what goes wrong reaching the cluster); they need pods get/list/create/delete, pods/exec and
pods/log in the namespace, and get on trainingjobs.

`rayship logs ms/NAME`: a ModelService's replica logs (each request, each error), which Serve writes
to files in the Ray pod that runs the replica, read from each of its running worker pods while they
run. They are not kept after (a service's pods come and go with its load).
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from rayship import api
from rayship.api import names
from rayship.api.validation import SpecError, parse_trainingjob
from rayship.cli.kube import TIMEOUT, connect, status_body, talking
from rayship.controller.conditions import pod_problem

TRAININGJOB_REFS = ("tj", "trainingjob", "trainingjobs")
MODELSERVICE_REFS = ("ms", "modelservice", "modelservices")
SERVE_LOGS = "/tmp/ray/session_latest/logs/serve"  # where Serve writes each replica's log, per Ray pod
READER_SECONDS = 180  # a reader pod that has not finished by then is named with why
NOT_YET = 3  # the script's exit code when the job has written no logs (yet)


class LogsError(Exception):
    """One line naming what is missing and what to do."""


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    claim: str | None  # the checkpoint PVC (None: object storage)
    mount: str | None
    logs_dir: str  # a path in the PVC's pods, or an object-store URI
    image: str | None  # the job's image, for a reader pod


def target(trainingjob: dict[str, Any]) -> Target:
    """Where a TrainingJob (as the API server returned it) keeps its logs."""
    try:
        tj = parse_trainingjob(trainingjob, admitted=True)
    except SpecError as err:
        raise LogsError(f"the TrainingJob as stored is not valid: {'; '.join(err.problems)}") from None
    store = tj.spec.checkpoint.storage
    if store is None:
        raise LogsError("spec.checkpoint.storage is not set: the job keeps no logs (read its pods' logs)")
    namespace = tj.metadata.namespace or "default"
    run = names.run_name(namespace, tj.metadata.name)  # as the workload names it (the same contract)
    if store.pvc is None:
        uri = f"{str(store.uri).rstrip('/')}/{run}/{names.LOGS_DIR}"
        return Target(namespace, tj.metadata.name, None, None, uri, tj.spec.image)
    return Target(
        namespace=namespace,
        name=tj.metadata.name,
        claim=store.pvc.claim_name,
        mount=store.pvc.mount_path,
        logs_dir=f"{store.pvc.mount_path.rstrip('/')}/{run}/{names.LOGS_DIR}",
        image=tj.spec.image,
    )


def process_name(rank: int | None) -> str:
    return names.DRIVER_LOG if rank is None else names.rank_log(rank)


def reader_script(logs_dir: str, attempt: int | None, process: str, follow: bool) -> str:
    """The POSIX shell script that prints one process's log of one attempt (the latest by default),
    its rotated files oldest first; with `follow`, then follows the file as it grows."""
    folder = shlex.quote(logs_dir)
    pick = (
        f"a={attempt}"
        if attempt is not None
        else "a=$(ls -d attempt-* 2>/dev/null | sed 's/^attempt-//' | sort -n | tail -n 1)"
    )
    backups = " ".join(str(n) for n in range(names.LOG_BACKUPS, 0, -1))
    last = f"exec tail -n +1 -F {'$f'}" if follow else 'cat "$f"'
    return "\n".join(
        [
            f"cd {folder} 2>/dev/null || {{ echo 'rayship: no logs yet in '{folder} >&2; exit {NOT_YET}; }}",
            pick,
            f"[ -n \"$a\" ] || {{ echo 'rayship: no attempt has started yet in '{folder} >&2; exit {NOT_YET}; }}",
            f'f="attempt-$a/{process}.log"',
            '[ -f "$f" ] || { echo "rayship: no $f; attempt $a has: $(ls "attempt-$a" 2>/dev/null | '
            "sed -n 's/[.]log$//p' | tr '\\n' ' ')(and attempts: $(ls -d attempt-* 2>/dev/null | "
            "tr '\\n' ' '))\" >&2; exit 4; }",
            f'for n in {backups}; do [ ! -f "$f.$n" ] || cat "$f.$n"; done',
            last,
        ]
    )


def reader_pod(where: Target, script: str, image: str) -> dict[str, Any]:
    """A pod that runs `script` with the checkpoint PVC mounted read-only, as the Ray pods do (uid 1000,
    non-root), small enough for any node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.dns1035_name(f"{where.name}-logs-{uuid.uuid4().hex[:5]}", 63),
            "namespace": where.namespace,
            "labels": names.labels("TrainingJob", where.name, "logs-reader"),
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "logs",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "checkpoints", "mountPath": where.mount, "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": where.claim, "readOnly": True}}
            ],
        },
    }


# --- Kubernetes I/O ---------------------------------------------------------------------------------


def _running_pods(core: Any, namespace: str, kind: str, name: str, node_type: str) -> list[str]:
    """The running Ray pods (`head` or `worker`) made for `kind/name`, by name."""
    selector = f"{names.owner_label(kind)}={name},ray.io/node-type={node_type}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=TIMEOUT).items
    return sorted(
        p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    )


def _exec(
    core: Any, pod: str, namespace: str, container: str, script: str, out: Callable[[str], None] | None = None
) -> int:
    """Run `script` in the pod's container; its stdout to `out` (default: ours, as it comes)."""
    from kubernetes.stream import stream

    write = out or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    resp = stream(
        core.connect_get_namespaced_pod_exec, pod, namespace, container=container,
        command=["sh", "-c", script], stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False,
    )  # fmt: skip
    try:
        while resp.is_open():
            resp.update(timeout=1)
            if resp.peek_stdout():
                write(resp.read_stdout())
            if resp.peek_stderr():
                sys.stderr.write(resp.read_stderr())
    finally:
        resp.close()
    return resp.returncode or 0


def _reader(core: Any, where: Target, script: str, image: str) -> int:
    from kubernetes.client import ApiException

    pod = reader_pod(where, script, image)
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(where.namespace, pod, _request_timeout=TIMEOUT)
    try:
        deadline = time.monotonic() + READER_SECONDS
        while True:
            found = core.read_namespaced_pod(name, where.namespace, _request_timeout=TIMEOUT)
            if found.status.phase in ("Succeeded", "Failed"):
                break
            if time.monotonic() > deadline:
                raise LogsError(
                    f"the reader pod {name} did not finish in {READER_SECONDS}s: {_why(core, found)}"
                )
            time.sleep(0.5)
        text = core.read_namespaced_pod_log(name, where.namespace, container="logs", _request_timeout=TIMEOUT)
        (state,) = found.status.container_statuses or [None]
        code = state.state.terminated.exit_code if state and state.state.terminated else 1
        (sys.stdout if code == 0 else sys.stderr).write(text)
        return int(code)
    finally:
        try:
            core.delete_namespaced_pod(
                name, where.namespace, grace_period_seconds=0, _request_timeout=TIMEOUT
            )
        except ApiException as err:
            if err.status != 404:
                raise


def _why(core: Any, pod: Any) -> str:
    """Why a pod has not finished: what the operator says of a Ray pod that cannot start, else its phase."""
    found = pod_problem([core.api_client.sanitize_for_serialization(pod)])
    return found[1] if found else f"it is {pod.status.phase}"


def show(
    ref: str,
    *,
    namespace: str | None,
    attempt: int | None,
    rank: int | None,
    follow: bool,
    image: str | None,
    kubeconfig: str | None,
    context: str | None,
) -> int:
    """Print the logs `ref` (tj/NAME or ms/NAME) names; the exit code (0: printed)."""
    kind, _, name = ref.partition("/")
    kind = kind.lower()
    if kind not in (*TRAININGJOB_REFS, *MODELSERVICE_REFS) or not name:
        raise LogsError(f"{ref}: name a TrainingJob as tj/NAME or a ModelService as ms/NAME")
    conn = connect(kubeconfig, context)  # the CLI's client: one line for what goes wrong (ClusterError)
    namespace = conn.namespace_or_default(namespace)
    what = "trainingjob" if kind in TRAININGJOB_REFS else "modelservice"
    with talking(conn, f"the logs of {what} {name} in namespace {namespace}"):
        if kind in MODELSERVICE_REFS:
            return _show_service(conn.client, namespace, name, follow)
        return _show_trainingjob(conn.client, namespace, name, attempt, rank, follow, image)


def _show_trainingjob(
    client: Any,
    namespace: str,
    name: str,
    attempt: int | None,
    rank: int | None,
    follow: bool,
    image: str | None,
) -> int:
    import kubernetes
    from kubernetes.client import ApiException

    group, version, plural = api.TRAININGJOBS
    try:
        obj = kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=TIMEOUT
        )
    except ApiException as err:
        if err.status == 404 and status_body(err.body)[1].get("name"):
            raise LogsError(f"trainingjob {name} not found in namespace {namespace}") from None
        raise
    where = target(cast(dict[str, Any], obj))
    if where.claim is None:
        return _from_object_storage(client, where, attempt, rank, follow)
    script = reader_script(where.logs_dir, attempt, process_name(rank), follow)
    core = kubernetes.client.CoreV1Api(client)
    heads = _running_pods(core, where.namespace, "TrainingJob", where.name, "head")
    if heads:  # the cluster runs: read (and follow) through its head
        return _exec(core, heads[0], where.namespace, names.HEAD_CONTAINER, script)
    if follow:
        print(
            "rayship: the Ray cluster is gone: printing the log as kept (nothing more will come)",
            file=sys.stderr,
        )
        script = reader_script(where.logs_dir, attempt, process_name(rank), False)
    if not (image or where.image):
        raise LogsError("the TrainingJob names no spec.image: name one for the reader pod with --image")
    return _reader(core, where, script, image or str(where.image))


def _from_object_storage(
    client: Any, where: Target, attempt: int | None, rank: int | None, follow: bool
) -> int:
    """A job's logs on object storage, read from here with this machine's own credentials (pyarrow's:
    AWS_* variables, ~/.aws, GOOGLE_APPLICATION_CREDENTIALS...), whether its Ray cluster runs or not;
    `follow`: until the TrainingJob has finished."""
    try:
        from rayship_workloads import joblog
    except ImportError as err:
        raise LogsError(
            f"reading logs on object storage needs pyarrow ({err}): pip install 'rayship[workloads]'"
        ) from None
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(client)

    def running() -> bool:
        group, version, plural = api.TRAININGJOBS
        obj = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object(
                group, version, where.namespace, plural, where.name, _request_timeout=TIMEOUT
            ),
        )
        return str((obj.get("status") or {}).get("phase")) not in api.TERMINAL_PHASES

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        joblog.read(where.logs_dir, attempt, process_name(rank), out, running if follow else None)
    except joblog.LogsMissing as missing:
        print(missing, file=sys.stderr)
        return missing.code
    except OSError as err:
        raise LogsError(f"{where.logs_dir}: {err} (this machine's credentials for it are used)") from None
    return 0


def serve_script(follow: bool, folder: str = SERVE_LOGS) -> str:
    """Prints (or follows) the Serve replica logs of the Ray pod it runs in (none: says so, exit 0)."""
    return "\n".join(
        [
            f"set -- {shlex.quote(folder)}/replica_*.log",
            '[ -e "$1" ] || { echo "rayship: no Serve replica has run in this pod" >&2; exit 0; }',
            f'exec tail -n +1 {"-F " if follow else ""}"$@"',
        ]
    )


def _show_service(client: Any, namespace: str, name: str, follow: bool) -> int:
    """A ModelService's replica logs, read from each of its running worker pods (Serve writes them
    there, not to the container's output). Not kept after the pods go."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(client)
    pods = _running_pods(core, namespace, "ModelService", name, "worker")
    if not pods:
        raise LogsError(
            f"no Ray worker pod of modelservice {namespace}/{name} runs: a ModelService's replica logs are "
            "read while its pods run (they are not kept after)"
        )
    script = serve_script(follow)
    if not follow:
        codes = []
        for pod in pods:
            print(f"=== pod {pod}", flush=True)
            codes.append(_exec(core, pod, namespace, names.WORKER_CONTAINER, script))
        return max(codes)
    # Following several pods at once: a thread each, whole lines, each prefixed with its pod.
    lock = threading.Lock()

    def follow_pod(pod: str) -> None:
        pending = [""]

        def out(text: str) -> None:
            *lines, pending[0] = (pending[0] + text).split("\n")
            with lock:
                for line in lines:
                    print(f"[{pod}] {line}", flush=True)

        _exec(core, pod, namespace, names.WORKER_CONTAINER, script, out)

    threads = [threading.Thread(target=follow_pod, args=(pod,), daemon=True) for pod in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=1)  # wakes up for Ctrl-C
    return 0
