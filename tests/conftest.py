"""Shared fixtures: repository paths, the KubeRay CRDs, strict validators."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.schema import StrictValidator, load_crd_schema

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "manifests" / "samples"
KUBERAY_HINT = (
    "KubeRay v1.7.0 CRDs not found: set RAYSHIP_KUBERAY_CRDS to a directory holding "
    "ray.io_rayjobs.yaml (e.g. `helm pull kuberay/kuberay-operator --version 1.7.0 --untar` "
    "and point it at kuberay-operator/crds), or check out ../shared/kuberay/crds beside the repo"
)


def kuberay_crds_dir() -> Path | None:
    for candidate in (os.environ.get("RAYSHIP_KUBERAY_CRDS"), ROOT.parent / "shared" / "kuberay" / "crds"):
        if candidate and (Path(candidate) / "ray.io_rayjobs.yaml").is_file():
            return Path(candidate)
    return None


def _kuberay_validator(filename: str) -> StrictValidator:
    crds = kuberay_crds_dir()
    if crds is None:
        pytest.skip(KUBERAY_HINT)
    return StrictValidator(load_crd_schema(crds / filename, "v1"))


def _rayship_validator(plural: str) -> StrictValidator:
    from rayship import api

    return StrictValidator(
        load_crd_schema(ROOT / "manifests" / "crds" / f"{plural}.{api.GROUP}.yaml", api.VERSION)
    )


@pytest.fixture(scope="session")
def rayjob_validator() -> StrictValidator:
    return _kuberay_validator("ray.io_rayjobs.yaml")


@pytest.fixture(scope="session")
def rayservice_validator() -> StrictValidator:
    return _kuberay_validator("ray.io_rayservices.yaml")


@pytest.fixture(scope="session")
def trainingjob_validator() -> StrictValidator:
    return _rayship_validator("trainingjobs")


@pytest.fixture(scope="session")
def modelservice_validator() -> StrictValidator:
    return _rayship_validator("modelservices")
