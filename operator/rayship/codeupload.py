"""Putting a packed folder (`codepack.Shipment`) on the claim the Ray pods mount: a short-lived pod
mounts the claim as the Ray pods do (the same non-root uid and fsGroup, so they can read what it
writes), the zip goes in through `exec` (base64 lines on stdin, as `kubectl cp` streams a tar), is
checked against its sha256 and renamed into place, and the pod is deleted. A zip already there with
the same content is not sent again.

`uploader_pod` and `RECEIVER` are pure; `upload` does the Kubernetes I/O (the CLI's client).
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from rayship.api import names
from rayship.cli.kube import TIMEOUT
from rayship.codepack import Shipment
from rayship.config import OperatorConfig
from rayship.controller.conditions import pod_problem
from rayship.controller.pods import container_security_context, pod_security_context

READY_SECONDS = 180  # a pod not running by then (image, scheduling, a claim that will not bind) is named
LIFETIME_SECONDS = 600  # the pod ends by itself if the CLI is interrupted before it deletes it
CHUNK = 48 * 1024  # raw bytes a stdin line carries (64 KiB of base64)

# Runs in the pod: says "present" if the zip is there with this content, else "send", then reads
# the base64 lines, checks size and sha256, and renames the zip into place (never half a zip).
RECEIVER = r"""
import base64, hashlib, os, sys
dest, size, sha = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
if os.path.isfile(dest) and digest(dest) == sha:
    print("present", flush=True)
    sys.exit(0)
os.makedirs(os.path.dirname(dest), exist_ok=True)
tmp = "%s.part-%d" % (dest, os.getpid())
print("send", flush=True)
got, h = 0, hashlib.sha256()
with open(tmp, "wb") as f:
    while got < size:
        line = sys.stdin.buffer.readline()
        if not line:
            break
        block = base64.b64decode(line)
        f.write(block)
        h.update(block)
        got += len(block)
    f.flush()
    os.fsync(f.fileno())
if got != size or h.hexdigest() != sha:
    os.unlink(tmp)
    print("received %d of %d bytes, sha256 %s" % (got, size, h.hexdigest()), file=sys.stderr, flush=True)
    sys.exit(3)
os.chmod(tmp, 0o644)
os.replace(tmp, dest)
print("stored", flush=True)
"""


class UploadError(Exception):
    """The zip could not be put on the claim: one line saying why."""


def uploader_pod(shipment: Shipment, namespace: str, image: str, config: OperatorConfig) -> dict[str, Any]:
    """A pod that mounts the shipment's claim (read-write) as the Ray pods do and waits for `exec`."""
    claim = shipment.claim
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.dns1035_name(
                f"rayship-code-{shipment.package.sha256[:10]}-{uuid.uuid4().hex[:5]}", 63
            ),
            "namespace": namespace,
            "labels": {names.LABEL_PART_OF: names.PART_OF, names.LABEL_COMPONENT: "code-upload"},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": LIFETIME_SECONDS,
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(config),
            "containers": [
                {
                    "name": "upload",
                    "image": image,
                    "command": ["sleep", str(LIFETIME_SECONDS)],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "64Mi"},
                        "limits": {"memory": "128Mi"},
                    },
                    "securityContext": container_security_context(config),
                    "volumeMounts": [{"name": names.CHECKPOINT_VOLUME, "mountPath": claim.mount_path}],
                }
            ],
            "volumes": [
                {"name": names.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim.claim_name}}
            ],
        },
    }


def lines(data: bytes) -> list[str]:
    """The zip as the receiver reads it: base64 lines of CHUNK raw bytes."""
    return [base64.b64encode(data[i : i + CHUNK]).decode() + "\n" for i in range(0, len(data), CHUNK)]


# --- Kubernetes I/O ---------------------------------------------------------------------------------


def upload(core: Any, shipment: Shipment, namespace: str, image: str, config: OperatorConfig) -> str:
    """Put the shipment's zip on its claim; "present" (it was there) or "stored"."""
    from kubernetes.client import ApiException

    claim = shipment.claim.claim_name
    try:
        core.read_namespaced_persistent_volume_claim(claim, namespace, _request_timeout=TIMEOUT)
    except ApiException as err:
        if err.status != 404:
            raise
        raise UploadError(
            f"{shipment.field}: the code goes on claim {claim}, which does not exist in namespace {namespace}: "
            "create it first (manifests/samples/checkpoints-pvc.yaml is one, ReadWriteMany), or apply it with "
            "this file (-f both)"
        ) from None
    pod = uploader_pod(shipment, namespace, image, config)
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod, _request_timeout=TIMEOUT)
    try:
        _running(core, name, namespace, shipment)
        return _send(core, name, namespace, shipment)
    finally:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _request_timeout=TIMEOUT)
        except ApiException as err:
            if err.status != 404:
                raise


def _running(core: Any, name: str, namespace: str, shipment: Shipment) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while True:
        found = core.read_namespaced_pod(name, namespace, _request_timeout=TIMEOUT)
        if found.status.phase == "Running":
            return
        problem = pod_problem([core.api_client.sanitize_for_serialization(found)])
        if found.status.phase in ("Failed", "Succeeded") or time.monotonic() > deadline:
            why = problem[1] if problem else f"it is {found.status.phase}"
            raise UploadError(
                f"the pod {name} that puts the code on claim {shipment.claim.claim_name} did not start in "
                f"{READY_SECONDS}s: {why}"
            )
        time.sleep(0.5)


def _send(core: Any, name: str, namespace: str, shipment: Shipment) -> str:
    from kubernetes.stream import stream

    package = shipment.package
    command = ["python3", "-c", RECEIVER, shipment.path, str(len(package.data)), package.sha256]
    resp = stream(
        core.connect_get_namespaced_pod_exec, name, namespace, container="upload", command=command,
        stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False,
    )  # fmt: skip
    said: list[str] = []
    errors: list[str] = []
    try:
        first = _line(resp, said, errors)
        if first == "send":
            for text in lines(package.data):
                resp.write_stdin(text)
            first = _line(resp, said, errors)
        while resp.is_open():  # until the receiver exits: its exit code
            resp.update(timeout=1)
            _drain(resp, said, errors)
    finally:
        resp.close()
    code = resp.returncode
    if code != 0 or first not in ("present", "stored"):
        raise UploadError(
            f"putting {shipment.package.name} on claim {shipment.claim.claim_name} failed in pod {name} "
            f"(exit {code}): {' '.join(errors).strip() or ' '.join(said) or 'no output'}"
        )
    return first


def _drain(resp: Any, said: list[str], errors: list[str]) -> None:
    if resp.peek_stdout():
        said.extend(resp.read_stdout().split())
    if resp.peek_stderr():
        errors.append(resp.read_stderr())


def _line(resp: Any, said: list[str], errors: list[str], timeout: float = 60) -> str | None:
    """The receiver's next word on stdout (None: it ended or said nothing in time)."""
    deadline = time.monotonic() + timeout
    seen = len(said)
    while len(said) == seen and resp.is_open() and time.monotonic() < deadline:
        resp.update(timeout=1)
        _drain(resp, said, errors)
    return said[seen] if len(said) > seen else None
