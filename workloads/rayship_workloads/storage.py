"""Local paths, PVC paths and object-store URIs (s3://, gs://, ...) through one interface (pyarrow.fs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow.fs as pafs


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI."""
    if is_remote(uri):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, str(path)
    return pafs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://"))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts]) if is_remote(base) else str(Path(base, *parts))


def upload_dir(local: Path, uri: str) -> str:
    """Copy a local directory to `uri` (a path or an object-store prefix); return `uri`."""
    fs, path = filesystem(uri)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(local), path, destination_filesystem=fs)
    return uri


def fetch_dir(uri: str) -> Path:
    """A local directory with the contents of `uri` (downloaded to a temp dir if remote)."""
    if not is_remote(uri):
        path = Path(uri.removeprefix("file://"))
        if not path.is_dir():
            raise FileNotFoundError(f"{uri}: no such directory")
        return path
    fs, remote_path = filesystem(uri)
    target = Path(tempfile.mkdtemp(prefix="rayship-model-"))
    pafs.copy_files(remote_path, str(target), source_filesystem=fs)
    return target
