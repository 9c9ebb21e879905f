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


def mounted(folder: Path, files: dict[str, str]) -> Path:
    """`files` as the kubelet mounts a Secret: each key a link into a hidden, timestamped folder
    through `..data`; the spec file's path."""
    stamped = folder / "..2026_12_06_23_59_59.000000001"
    stamped.mkdir(parents=True)
    for key, text in files.items():
        (stamped / key).write_text(text)
        (folder / key).symlink_to(Path("..data") / key)
    (folder / "..data").symlink_to(stamped.name)
    return folder / "trainingjob.json"


def rendered_secret(env: list[dict[str, Any]]) -> tuple[dict[str, str], str]:
    """The spec Secret's files as the operator renders them for a job with `env`, and the digest the
    RayJob's entrypoint gives the driver."""
    from rayship.controller.trainingjob import render_trainingjob

    objects = render_trainingjob(api.TrainingJob.model_validate(document(env)), api_config())
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    (rayjob,) = [o for o in objects if o["kind"] == "RayJob"]
    return secret["stringData"], rayjob["spec"]["entrypoint"].split("--spec-digest ")[1]


def api_config() -> Any:
    from rayship.config import OperatorConfig

    return OperatorConfig(ray_token_key="k" * 64)


def test_the_driver_runs_nothing_of_a_spec_secret_planted_under_its_name(tmp_path: Path, capsys) -> None:
    """Issue 57 section 3: KubeRay mounts whatever Secret carries the spec Secret's name when it makes
    the job's cluster (a suspended job let go, a retry). One planted there (a spec of the planter's,
    their env values) is found out by the files' digest the entrypoint carries, before anything of it
    is read; the operator's own passes, link folders and all."""
    files, digest = rendered_secret([{"name": "HF_TOKEN", "value": SECRET}])
    job.check_spec_files(str(mounted(tmp_path / "ours", files)), digest)  # the operator's: no error

    planted = {**files, "trainingjob.json": json.dumps(document([])), "env.HF_TOKEN": "theirs"}
    spec = mounted(tmp_path / "planted", planted)
    assert job.main(["--spec", str(spec), "--spec-digest", digest]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the Secret mounted at ") and "\n" not in err, err
    assert "is not the one the operator made for this job" in err and SECRET not in err, err
    binary = mounted(tmp_path / "binary", files)
    (binary.parent / "..2026_12_06_23_59_59.000000001" / "salt").write_bytes(b"\xff\xfe not text")
    assert job.main(["--spec", str(binary), "--spec-digest", digest]) == 1, "one line, not a traceback"
    err = capsys.readouterr().err
    assert err.startswith("error: the Secret mounted at ") and "Traceback" not in err, err
    for missing_or_added in ({k: v for k, v in files.items() if k != "salt"}, {**files, "extra": "x"}):
        folder = tmp_path / f"other-{len(missing_or_added)}"
        with pytest.raises(OSError, match="is not the one the operator made"):
            job.check_spec_files(str(mounted(folder, missing_or_added)), digest)
