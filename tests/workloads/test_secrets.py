"""Env values (`spec.env[].value`) never appear in what the workload prints: errors about the spec,
the `[rayship] done:` line, and the spec handed to the train loops (`***`). No Ray is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import api
from rayship_workloads import job, redact, train
from tests.conftest import SAMPLES

pytestmark = pytest.mark.workloads

SECRET = "hunter2-s3cr3t"


def document(env: list[dict[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["spec"]["env"] = env
    return doc


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "TOKEN", "value": 987654321}],
        [{"name": "TOKEN", "value": [SECRET]}],
        [{"name": "OK", "value": SECRET}, {"name": "TOKEN", "value": {"k": SECRET}}],
    ],
    ids=["number", "list", "object"],
)
def test_an_invalid_env_value_is_not_echoed_in_the_error(env: list[dict[str, Any]], capsys) -> None:
    assert job.main(["--spec", json.dumps(document(env))]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: invalid TrainingJob: spec.env[") and "***" in err, err
    assert SECRET not in err and "987654321" not in err, err


def test_a_yaml_error_is_one_line_not_a_traceback(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text(f"spec:\n  env:\n  - name: A\n    value: [{SECRET}\n")
    assert job.main(["--spec", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: invalid TrainingJob: ") and err.count("\n") == 1, err
    assert SECRET not in err


def test_the_done_line_has_no_env_values(capsys) -> None:
    tj = job.load_trainingjob(json.dumps(document([{"name": "TOKEN", "value": SECRET}])))
    result = job.JobResult(api.CheckpointStatus.model_validate({"model": "/store/m", "latest": "/store/c"}))
    job.ClusterReporter(None).finished(tj, result)
    out = capsys.readouterr().out
    assert out.startswith("[rayship] done: ") and json.loads(out.removeprefix("[rayship] done: "))["model"]
    assert SECRET not in out


def test_train_loops_get_the_spec_with_env_values_redacted() -> None:
    doc = document(
        [
            {"name": "TOKEN", "value": SECRET},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]
    )
    tj = job.load_trainingjob(json.dumps(doc))
    prepared = train.Prepared(
        dataset=None,  # type: ignore[arg-type]  # loop_config does not read the data
        recipe=None,
        setup=train.recipes.ModelSetup({"in_features": 8}),
        storage_root="/store",
        run_name="default.mlp-ddp",
    )
    config = prepared.loop_config(tj)
    assert SECRET not in json.dumps(config)
    assert config["rayship"]["spec"]["env"] == [
        {"name": "TOKEN", "value": "***"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    assert tj.spec.env[0].value == SECRET  # the driver's own spec is unchanged


def test_redacted_and_scrub() -> None:
    doc = {"spec": {"env": [{"name": "A", "value": SECRET}, {"name": "B", "value": 42}, "junk"]}}
    assert redact.redacted(doc) == {
        "spec": {"env": [{"name": "A", "value": "***"}, {"name": "B", "value": "***"}, "junk"]}
    }
    assert doc["spec"]["env"][0]["value"] == SECRET  # a copy
    assert redact.redacted(doc["spec"])["env"][0]["value"] == "***"  # a spec alone
    assert redact.scrub(f"bad {SECRET!r} and (got 42)", doc) == "bad *** and (got ***)"
    assert redact.scrub("nothing to hide", None) == "nothing to hide"
    nested = {"spec": {"env": [{"name": "A", "value": {"k": [SECRET]}}]}}
    assert redact.scrub(f"got {{'k': ['{SECRET}']}} or {SECRET}", nested) == "got *** or ***"
