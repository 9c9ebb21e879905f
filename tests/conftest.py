"""Shared fixtures: repository paths, the KubeRay CRDs, strict validators."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.check_kuberay import KUBERAY_HINT, kuberay_crds_dir
from tools.strict_schema import StrictValidator, load_crd_schema

pytest_plugins = ["tests.cluster_fixtures"]  # the real control plane: cluster, api, namespace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "manifests" / "samples"


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
