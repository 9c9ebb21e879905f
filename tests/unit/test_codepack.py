"""A local runtimeEnv.workingDir packed for a cluster (`rayship.codepack`): the same folder packs to the
same bytes, a changed file to another name; what is never code stays out; Ray finds the files where
the folder had them; each document's claim, or one line naming the field when there is none."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rayship import codepack
from rayship.api.validation import SpecError, parse

JOB = {
    "apiVersion": "rayship.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "own"},
    "spec": {
        "trainer": {"entrypoint": "loop:train"},
        "runtimeEnv": {"workingDir": "code", "envVars": {"A": "1"}},
        "checkpoint": {"storage": {"pvc": {"claimName": "ckpt", "mountPath": "/mnt/ckpt"}}},
    },
}
SERVICE = {
    "apiVersion": "rayship.dev/v1alpha1",
    "kind": "ModelService",
    "metadata": {"name": "svc"},
    "spec": {
        "model": {"fromTrainingJob": {"name": "own"}},
        "application": {"importPath": "app:build", "runtimeEnv": {"workingDir": "."}},
    },
}


def folder(root: Path) -> Path:
    code = root / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "loop.py").write_text("def train(config):\n    pass\n")
    (code / "pkg" / "util.py").write_text("X = 1\n")
    (code / "run.sh").write_text("#!/bin/sh\n")
    (code / "run.sh").chmod(0o755)
    for skipped in ("__pycache__", ".git", "rayship-runs", ".venv"):
        (code / skipped).mkdir()
        (code / skipped / "junk").write_text("not code")
    (code / "loop.pyc").write_bytes(b"\0")
    return code


def names(package: codepack.Package) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(package.data)).namelist()


def test_the_same_folder_packs_to_the_same_bytes_and_a_change_to_another_name(tmp_path: Path) -> None:
    code = folder(tmp_path)
    first = codepack.pack(code, "f")
    os.utime(code / "loop.py", (0, 0))  # a touched file (a checkout, a copy) is the same code
    assert codepack.pack(code, "f") == first
    (code / "loop.py").write_text("def train(config):\n    return 1\n")
    changed = codepack.pack(code, "f")
    assert changed.sha256 != first.sha256 and changed.name != first.name
    assert first.name == f"{first.sha256[:20]}.zip"


def test_what_is_never_code_stays_out_and_the_files_keep_their_places(tmp_path: Path) -> None:
    package = codepack.pack(folder(tmp_path), "f")
    assert names(package) == ["code/loop.py", "code/pkg/util.py", "code/run.sh"]
    assert package.files == 3
    modes = {i.filename: i.external_attr >> 16 for i in zipfile.ZipFile(io.BytesIO(package.data)).infolist()}
    assert modes["code/run.sh"] == 0o100755 and modes["code/loop.py"] == 0o100644


def test_ray_unpacks_it_to_the_folders_files(tmp_path: Path) -> None:
    """Ray's own unpacking of a remote working_dir zip (one top-level folder, stripped)."""
    packaging = pytest.importorskip(
        "ray._private.runtime_env.packaging", reason="the workload stack is not installed"
    )
    package = codepack.pack(folder(tmp_path), "f")
    zip_path = tmp_path / package.name
    zip_path.write_bytes(package.data)
    target = tmp_path / "unpacked"
    packaging.unzip_package(str(zip_path), str(target), remove_top_level_directory=True, unlink_zip=False)
    found = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert found == ["loop.py", "pkg/util.py", "run.sh"]


def test_a_link_out_of_the_folder_a_missing_folder_and_an_empty_one_are_said(tmp_path: Path) -> None:
    code = folder(tmp_path)
    (tmp_path / "secret").write_text("x")
    (code / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(codepack.PackError, match=r"^spec.runtimeEnv.workingDir: .*leak links outside"):
        codepack.pack(code, "spec.runtimeEnv.workingDir")
    with pytest.raises(codepack.PackError, match="is not a folder"):
        codepack.pack(tmp_path / "nope", "f")
    (tmp_path / "empty").mkdir()
    with pytest.raises(codepack.PackError, match="has no files to ship"):
        codepack.pack(tmp_path / "empty", "f")


def test_a_trainingjob_ships_to_its_checkpoint_claim(tmp_path: Path) -> None:
    folder(tmp_path)
    shipment = codepack.plan(JOB, tmp_path)
    assert shipment is not None and shipment.field == "spec.runtimeEnv.workingDir"
    assert (shipment.claim.claim_name, shipment.claim.mount_path) == ("ckpt", "/mnt/ckpt")
    assert shipment.uri == f"file:///mnt/ckpt/rayship-code/{shipment.package.name}"
    doc = codepack.rewritten(JOB, shipment)
    assert doc["spec"]["runtimeEnv"] == {"workingDir": shipment.uri, "envVars": {"A": "1"}}
    assert JOB["spec"]["runtimeEnv"]["workingDir"] == "code"  # the document read is left as it was
    parse(doc)  # valid for a cluster


def test_a_uri_working_dir_or_none_needs_nothing(tmp_path: Path) -> None:
    uri = {**JOB, "spec": {**JOB["spec"], "runtimeEnv": {"workingDir": "s3://b/code.zip"}}}
    assert codepack.plan(uri, tmp_path) is None
    assert codepack.plan({**JOB, "spec": {"trainer": {"recipe": "mlp"}}}, tmp_path) is None


def without_claim(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "spec": {**doc["spec"], "checkpoint": {"storage": {"uri": "s3://b/ckpt"}}}}


def test_no_claim_to_ship_to_is_one_line_naming_the_field(tmp_path: Path) -> None:
    folder(tmp_path)
    with pytest.raises(codepack.PackError, match=r"^spec.runtimeEnv.workingDir: .*no checkpoint.storage.pvc"):
        codepack.plan(without_claim(JOB), tmp_path)
    field = "spec.application.runtimeEnv.workingDir"
    with pytest.raises(codepack.PackError, match=rf"^{field}: .*TrainingJob own, which was not found"):
        codepack.plan(SERVICE, tmp_path, None)
    with pytest.raises(
        codepack.PackError, match=rf"^{field}: TrainingJob own keeps its checkpoints in an object"
    ):
        codepack.plan(SERVICE, tmp_path, without_claim(JOB))


def test_a_service_ships_to_its_trainingjobs_claim_which_its_pods_mount(tmp_path: Path) -> None:
    folder(tmp_path)
    assert codepack.referenced_trainingjob(SERVICE) == "own"
    shipment = codepack.plan(SERVICE, tmp_path, JOB)
    assert shipment is not None and shipment.claim.claim_name == "ckpt"
    assert shipment.uri.startswith("file:///mnt/ckpt/rayship-code/")
    by_uri = {**SERVICE, "spec": {**SERVICE["spec"], "model": {"uri": "/m/model"},
                                  "storage": {"pvc": {"claimName": "models", "mountPath": "/m"}}}}  # fmt: skip
    assert codepack.referenced_trainingjob(by_uri) is None
    shipment = codepack.plan(by_uri, tmp_path)
    assert shipment is not None and shipment.uri.startswith("file:///m/rayship-code/")


def test_a_file_uri_off_the_claim_is_refused_naming_the_field() -> None:
    def with_dir(working_dir: str) -> dict[str, Any]:
        return {**JOB, "spec": {**JOB["spec"], "runtimeEnv": {"workingDir": working_dir}}}

    parse(with_dir("file:///mnt/ckpt/rayship-code/a.zip"))
    for outside in ("file:///etc/a.zip", "file:///mnt/ckptx/a.zip"):
        with pytest.raises(SpecError) as err:
            parse(with_dir(outside))
        assert any(
            "runtimeEnv.workingDir" in p and "under file:///mnt/ckpt/" in p for p in err.value.problems
        ), err
    with pytest.raises(SpecError) as err:
        parse(without_claim(with_dir("file:///mnt/ckpt/a.zip")))
    assert any("which this job has none of" in p for p in err.value.problems), err.value.problems
