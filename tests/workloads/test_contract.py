"""The contract between the renderer and the workload image: what the RayJob runs resolves, and
accepts exactly what the renderer hands it."""

from __future__ import annotations

import importlib
import json
import shlex

import pytest
import yaml

from rayship import names, render
from rayship.config import OperatorConfig
from rayship.validation import parse_trainingjob
from rayship_workloads import train
from tests.conftest import SAMPLES

pytestmark = pytest.mark.workloads


@pytest.mark.parametrize("sample", sorted(SAMPLES.glob("trainingjob-*.yaml")), ids=lambda p: p.stem)
def test_rendered_entrypoint_runs_the_workload_with_the_rendered_spec(ray_session, sample, tmp_path) -> None:
    tj = parse_trainingjob(yaml.safe_load(sample.read_text()))
    rayjob = render.build_rayjob(tj, OperatorConfig())
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", train.__name__]
    assert callable(importlib.import_module(argv[2]).main)
    doc = train.load_spec(argv[argv.index("--spec") + 1])
    handed = json.loads(argv[4])
    assert doc["spec"] == handed["spec"]  # the renderer hands over an already resolved spec
    assert {k: doc["metadata"][k] for k in ("name", "namespace")} == handed["metadata"]
    if doc["spec"]["data"]["source"] == "synthetic":  # others read cluster paths that exist only there
        trainer, context = train.build_trainer(doc, storage_override=str(tmp_path))
        assert context["storage_root"] == str(tmp_path) and trainer is not None
    assert train.storage_root(doc["spec"]) == tj.spec.checkpoint.storage.pvc.mount_path


def test_the_env_var_names_agree() -> None:
    assert train.ENV_TRAININGJOB == names.ENV_TRAININGJOB
