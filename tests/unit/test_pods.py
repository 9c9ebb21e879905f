"""Shared pod builders (`rayship.controller.pods`): quantities, env, GPU placement."""

from __future__ import annotations

import pytest

from rayship import api
from rayship.api import names
from rayship.config import OperatorConfig
from rayship.controller import pods

CONFIG = OperatorConfig()


@pytest.mark.parametrize(
    ("cores", "quantity"), [(4, "4"), (4.0, "4"), (0.5, "500m"), (2.25, "2250m"), (0.001, "1m")]
)
def test_cpu_quantity(cores: float, quantity: str) -> None:
    assert pods.cpu_quantity(cores) == quantity


def test_container_env_hides_gpus_only_from_pods_without_them() -> None:
    user = [api.EnvVar.model_validate({"name": "HF_HOME", "value": "/tmp/hf"})]
    cpu = pods.container_env("ns/job", 0, user, names.ENV_TRAININGJOB)
    gpu = pods.container_env("ns/job", 2, user, names.ENV_TRAININGJOB)
    assert cpu == [
        {"name": names.ENV_TRAININGJOB, "value": "ns/job"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
    ]
    assert [e["name"] for e in gpu] == [names.ENV_TRAININGJOB, "HF_HOME"]


def test_gpu_placement_adds_conventions_only_for_gpu_pods() -> None:
    user_tol = [api.Toleration.model_validate({"key": "dedicated", "operator": "Exists"})]
    selector, tolerations = pods.gpu_placement(CONFIG, 1, "NVIDIA-L4", {"zone": "a"}, user_tol)
    assert selector == {CONFIG.gpu_product_label: "NVIDIA-L4", "zone": "a"}
    assert tolerations == [*CONFIG.gpu_tolerations, {"key": "dedicated", "operator": "Exists"}]
    selector, tolerations = pods.gpu_placement(CONFIG, 0, "NVIDIA-L4", {}, [])
    assert selector == {} and tolerations == []  # a product means nothing without GPUs
