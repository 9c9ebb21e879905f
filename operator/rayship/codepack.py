"""A user's own code for a cluster: the local folder `runtimeEnv.workingDir` names (as `rayship run`
reads it, relative to the YAML file) packed into a zip whose name is its content hash, and where the
Ray pods read it: a folder of the PersistentVolumeClaim they already mount
(`<mountPath>/rayship-code/<hash>.zip`), handed to Ray as a `file://` URI.

Pure: `pack` reads the folder, `plan` says what each document needs (which folder, which claim, the
URI it becomes), `rewritten` gives the document with that URI. `rayship render` prints what that
would apply; `rayship apply` uploads the zips (`codeupload`) and applies the rewritten documents.

Why a zip on the claim: Ray takes a working_dir from a zip URI (s3://, gs://, https://, file://) and
unpacks it on every node the job runs on; the claim is already mounted on every Ray pod of the job,
so nothing else (an object store, credentials) is needed. The content hash in the name means an
unchanged folder is never uploaded twice and a running job's code is never replaced under it.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayship import api

CODE_FOLDER = "rayship-code"  # on the claim, beside the jobs' checkpoint folders
# The zip's one top-level folder: Ray strips a single top-level folder when it unpacks a remote zip,
# and only then; without it a folder holding one subfolder would be unpacked one level too deep.
TOP = "code"
MAX_BYTES = 256 * 1024 * 1024  # packed; Ray's own limit for an uploaded working_dir is 500 MiB
# Left out of the zip: what is never code (VCS, caches, virtualenvs, `rayship run`'s outputs).
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", "rayship-runs", ".ipynb_checkpoints"})  # fmt: skip
SKIPPED_SUFFIXES = (".pyc", ".pyo")
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # every entry's time: the same folder packs to the same bytes
HASH_CHARS = 20  # of the sha256 in the zip's name (80 bits)


class PackError(Exception):
    """The folder cannot be packed (missing, unreadable, too large): one line naming the field."""


@dataclass(frozen=True)
class Package:
    data: bytes
    sha256: str
    files: int

    @property
    def name(self) -> str:
        return f"{self.sha256[:HASH_CHARS]}.zip"

    @property
    def counted(self) -> str:
        return f"{self.files} file{'' if self.files == 1 else 's'}"


def _walk(root: Path) -> list[Path]:
    """The folder's files sorted by their path in it, skipping SKIPPED_*; a linked file is read (as
    Ray's own upload does) unless it leads outside the folder."""
    found: list[Path] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        found += [Path(folder) / name for name in names if not name.endswith(SKIPPED_SUFFIXES)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def pack(folder: Path, field: str) -> Package:
    """The folder as a deterministic zip (fixed times, sorted names, modes 644/755) under TOP/."""
    if not folder.is_dir():
        raise PackError(
            f"{field}: {folder} is not a folder (a local workingDir is relative to the YAML file)"
        )
    root = folder.resolve()
    buffer = io.BytesIO()
    count, total = 0, 0
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path in _walk(root):
            real = path.resolve()
            if not real.is_relative_to(root):
                raise PackError(f"{field}: {path} links outside {folder}: copy the file in instead")
            try:
                mode = real.stat().st_mode
                data = real.read_bytes()
            except OSError as err:
                raise PackError(f"{field}: cannot read {path}: {err.strerror or err}") from None
            if not stat.S_ISREG(mode):
                continue  # a socket, a fifo: nothing to ship
            total += len(data)
            if total > MAX_BYTES:
                raise PackError(
                    f"{field}: {folder} holds over {MAX_BYTES // 2**20} MiB: ship code, not data "
                    "(put data on the claim or an object store and point data.uri at it)"
                )
            info = zipfile.ZipInfo(f"{TOP}/{path.relative_to(root).as_posix()}", ZIP_EPOCH)
            info.external_attr = (0o100755 if mode & 0o111 else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            count += 1
    if not count:
        raise PackError(f"{field}: {folder} has no files to ship")
    data = buffer.getvalue()
    return Package(data, hashlib.sha256(data).hexdigest(), count)


def is_local(working_dir: str) -> bool:
    """A folder, not a URI (s3://, file://, ...)."""
    return "://" not in working_dir


@dataclass(frozen=True)
class Shipment:
    """One document's local folder: where it is, the claim its pods mount, the URI it becomes."""

    field: str  # e.g. spec.runtimeEnv.workingDir
    folder: Path
    package: Package
    claim: api.PvcStorage

    @property
    def path(self) -> str:
        """Where the zip lies in the pods (and on the claim, under its mountPath)."""
        return f"{self.claim.mount_path.rstrip('/')}/{CODE_FOLDER}/{self.package.name}"

    @property
    def uri(self) -> str:
        return f"file://{self.path}"


def _working_dir_field(doc: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The local workingDir of a TrainingJob or a ModelService document, and its keys' path."""
    kind = doc.get("kind")
    keys = {"TrainingJob": ["spec", "runtimeEnv", "workingDir"],
            "ModelService": ["spec", "application", "runtimeEnv", "workingDir"]}.get(str(kind))  # fmt: skip
    if keys is None:
        return None
    value: Any = doc
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    if isinstance(value, str) and value and is_local(value):
        return value, keys
    return None


def _pvc(value: Any) -> api.PvcStorage | None:
    return (
        api.PvcStorage.model_validate(value)
        if isinstance(value, Mapping) and value.get("claimName")
        else None
    )


def claim_of(doc: Mapping[str, Any], trainingjob: Mapping[str, Any] | None) -> api.PvcStorage | str:
    """The claim the document's Ray pods mount, or why there is none (a line naming the field).
    A TrainingJob: checkpoint.storage.pvc. A ModelService serving a TrainingJob's model: that job's
    checkpoint claim (`trainingjob`), which the operator mounts on the service's pods; else its
    spec.storage.pvc."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "TrainingJob":
        storage = (spec.get("checkpoint") or {}).get("storage") or {}
        if (pvc := _pvc(storage.get("pvc"))) is not None:
            return pvc
        return (
            "a local folder is uploaded to the claim the Ray pods mount, and this job has no "
            "checkpoint.storage.pvc: set one, or zip the folder to an object store yourself and set "
            "workingDir to its URI (s3://.../code.zip)"
        )
    model = spec.get("model") or {}
    if ref := (model.get("fromTrainingJob") or {}).get("name"):
        if trainingjob is None:
            return (
                f"a local folder is uploaded to the checkpoint claim of TrainingJob {ref}, which was not "
                "found: apply it first, or with this file (-f both)"
            )
        tj_storage = ((trainingjob.get("spec") or {}).get("checkpoint") or {}).get("storage") or {}
        if (pvc := _pvc(tj_storage.get("pvc"))) is not None:
            return pvc
        return (
            f"TrainingJob {ref} keeps its checkpoints in an object store, not on a claim the service's pods "
            "mount: zip the folder to an object store and set workingDir to its URI"
        )
    if (pvc := _pvc((spec.get("storage") or {}).get("pvc"))) is not None:
        return pvc
    return (
        "a local folder is uploaded to the claim the Ray pods mount, and this service mounts none: set "
        "spec.storage.pvc, or zip the folder to an object store and set workingDir to its URI"
    )


def referenced_trainingjob(doc: Mapping[str, Any]) -> str | None:
    """The TrainingJob whose claim a ModelService document's code would go to, if that is where."""
    spec = doc.get("spec") or {}
    if doc.get("kind") != "ModelService":
        return None
    return ((spec.get("model") or {}).get("fromTrainingJob") or {}).get("name")


def plan(doc: Mapping[str, Any], base: Path, trainingjob: Mapping[str, Any] | None = None) -> Shipment | None:
    """What a document's local workingDir needs, or None (it names none). Raises PackError."""
    found = _working_dir_field(doc)
    if found is None:
        return None
    value, keys = found
    field = ".".join(keys)
    claim = claim_of(doc, trainingjob)
    if isinstance(claim, str):
        raise PackError(f"{field}: {claim}")
    folder = Path(value) if Path(value).is_absolute() else base / value
    return Shipment(field, folder, pack(folder, field), claim)


def rewritten(doc: Mapping[str, Any], shipment: Shipment) -> dict[str, Any]:
    """The document with its workingDir replaced by the zip's URI (the rest as written)."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    found = _working_dir_field(out)
    assert found is not None
    _, keys = found
    node = out
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = shipment.uri
    return out
