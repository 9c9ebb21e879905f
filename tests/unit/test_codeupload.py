"""Putting a packed folder on a claim (`rayship.codeupload`): the pod that does it mounts the claim as
the Ray pods do, and its receiver (run here as the pod runs it) stores the zip whole or not at all."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from rayship import api, codepack, codeupload
from rayship.config import OperatorConfig
from rayship.controller.pods import container_security_context, pod_security_context

CONFIG = OperatorConfig()


def shipment(tmp_path: Path, mount: Path) -> codepack.Shipment:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "loop.py").write_bytes(random.Random(0).randbytes(200_000))  # over a few stdin lines
    return codepack.Shipment(
        "spec.runtimeEnv.workingDir",
        code,
        codepack.pack(code, "f"),
        api.PvcStorage.model_validate({"claimName": "ckpt", "mountPath": str(mount)}),
    )


def test_the_pod_mounts_the_claim_writable_as_the_ray_pods_run_and_ends_by_itself(tmp_path: Path) -> None:
    pod = codeupload.uploader_pod(shipment(tmp_path, Path("/mnt/ckpt")), "team-a", "img:1", CONFIG)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert pod["metadata"]["namespace"] == "team-a" and container["image"] == "img:1"
    assert spec["securityContext"] == pod_security_context(CONFIG)  # the Ray pods' uid and fsGroup
    assert container["securityContext"] == container_security_context(CONFIG)
    assert spec["volumes"] == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/mnt/ckpt"}]
    assert spec["activeDeadlineSeconds"] == codeupload.LIFETIME_SECONDS and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert container["resources"]["requests"] == {"cpu": "10m", "memory": "64Mi"}


def receive(ship: codepack.Shipment, stdin: str, size: int | None = None) -> subprocess.CompletedProcess[str]:
    package = ship.package
    command = [
        sys.executable,
        "-c",
        codeupload.RECEIVER,
        ship.path,
        str(size or len(package.data)),
        package.sha256,
    ]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)


def test_the_receiver_stores_the_zip_then_says_it_is_present(tmp_path: Path) -> None:
    ship = shipment(tmp_path, tmp_path / "claim")
    sent = codeupload.lines(ship.package.data)
    assert len(sent) > 1
    done = receive(ship, "".join(sent))
    assert (done.returncode, done.stdout.split()) == (0, ["send", "stored"]), done.stderr
    assert Path(ship.path).read_bytes() == ship.package.data
    assert Path(ship.path).stat().st_mode & 0o777 == 0o644
    again = receive(ship, "")  # nothing sent: it is there already
    assert (again.returncode, again.stdout.split()) == (0, ["present"])


def test_a_short_or_corrupt_upload_leaves_nothing(tmp_path: Path) -> None:
    ship = shipment(tmp_path, tmp_path / "claim")
    sent = codeupload.lines(ship.package.data)
    short = receive(ship, "".join(sent[:-1]))
    assert short.returncode == 3 and "received" in short.stderr, short
    wrong = receive(ship, "".join(codeupload.lines(b"x" * len(ship.package.data))))
    assert wrong.returncode == 3 and "sha256" in wrong.stderr, wrong
    assert list((tmp_path / "claim" / codepack.CODE_FOLDER).iterdir()) == []  # no zip, no partial file
