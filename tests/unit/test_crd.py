"""The generated CRD: up to date, structural, explainable, and it agrees with the pydantic models."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import api, generate
from rayship.api.validation import SpecError, parse
from tests.conftest import ROOT, SAMPLES, rayship_samples
from tests.unit.bad_corpus import SPEC_CASES

CRD_PATH = ROOT / "manifests" / "crds" / "trainingjobs.rayship.dev.yaml"
GOOD = rayship_samples() + sorted((Path(__file__).parent / "specs").glob("*.yaml"))


def walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def test_generated_files_are_up_to_date() -> None:
    for path, content in {**generate.outputs(ROOT), **generate.helm_outputs(ROOT)}.items():
        assert path.read_text() == content, f"{path} is stale: run `make generate`"


def test_check_mode_reports_drift(tmp_path: Path, capsys) -> None:
    import shutil

    shutil.copytree(ROOT / "charts", tmp_path / "charts")  # templates are hand-written; the rest regenerates
    assert generate.main(["--root", str(tmp_path)]) == 0
    assert generate.main(["--root", str(tmp_path), "--check"]) == 0
    target = tmp_path / "manifests" / "crds" / "trainingjobs.rayship.dev.yaml"
    target.write_text(target.read_text().replace("shortNames", "shortNamez"))
    assert generate.main(["--root", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_structural_schema(crd) -> None:
    """What the API server demands of a structural schema, and what `kubectl explain` needs."""
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(root):
        if path == ".metadata":
            continue
        untyped_ok = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or untyped_ok, f"{path}: no type"
        assert not ("properties" in node and "additionalProperties" in node), (
            f"{path}: both properties and additionalProperties"
        )
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "const", "title", "nullable"):
            assert banned not in node, f"{path}: {banned} is not allowed here"
        if path.startswith(".spec") and not path.endswith(("{}", "[]")):  # items: described by their list
            assert node.get("description"), f"{path}: no description for kubectl explain"
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, f"{path}: exclusiveMinimum without minimum"


def test_crd_metadata(crd) -> None:
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns) == [
        "Phase",
        "Workers",
        "Ready",
        "GPUs",
        "Epoch",
        "Loss",
        "GPU-Hours",
        "Age",
        "Last Error",
    ]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide == ["Last Error"]  # `kubectl get tj -o wide` only
    root = version["schema"]["openAPIV3Schema"]
    for column, json_path in columns.items():
        if json_path.startswith(".metadata."):
            continue  # ObjectMeta is implicit in every CRD
        node = root
        for part in json_path.strip(".").split("."):
            if part not in node.get("properties", {}) and isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]  # .status.progress.metrics.loss
                continue
            assert part in node.get("properties", {}), f"printer column {column}: {json_path} not in schema"
            node = node["properties"][part]
    conditions = root["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == [
        "type"
    ]


def test_cel_rules_are_in_the_crd(crd) -> None:
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for _, node in walk(root) for r in node.get("x-kubernetes-validations", [])]
    expected = [
        r.rule
        for cls in (
            api.TrainingJob,
            api.TrainerSpec,
            api.DataSpec,
            api.CheckpointStorage,
            api.EnvVar,
            api.DeepSpeedSpec,
        )
        for r in cls.cel_rules
    ]
    for rule in expected:
        assert rule in rules


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_crd_and_models_accept_the_samples(
    path: Path, trainingjob_validator, modelservice_validator, trainingschedule_validator
) -> None:
    doc = yaml.safe_load(path.read_text())
    validator = {
        "TrainingJob": trainingjob_validator,
        "ModelService": modelservice_validator,
        "TrainingSchedule": trainingschedule_validator,
    }[doc["kind"]]
    assert validator.errors(doc) == []
    parse(doc)


@pytest.mark.parametrize(("case", "mutate", "field"), SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_crd_and_models_reject_the_bad_corpus(case: str, mutate, field: str, trainingjob_validator) -> None:
    doc = copy.deepcopy(yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text()))
    mutate(doc)
    assert trainingjob_validator.errors(doc), f"{case}: the CRD accepts it"
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert field in str(err.value), f"{case}: {err.value}"


def test_defaults_in_crd_match_models(trainingjob_validator) -> None:
    """The API server's defaulting (from the CRD) and the models' defaults give the same spec."""
    from tools.strict_schema import apply_defaults

    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    server_side = apply_defaults(trainingjob_validator.schema, copy.deepcopy(doc))["spec"]
    model_side = parse(doc).spec.wire()
    for key in ("data", "workers", "head", "failurePolicy", "scheduling", "trainer", "checkpoint"):
        assert {k: v for k, v in server_side[key].items() if v not in ({}, [])} == {
            k: v for k, v in model_side[key].items() if v not in ({}, [])
        }, key


def test_every_env_list_of_every_kind_refuses_the_reserved_names() -> None:
    """One rule wherever an env name is given (spec.env[] items, runtimeEnv.envVars keys), in every
    kind's CRD, including lists added later: a list without it would let NVIDIA_VISIBLE_DEVICES=all
    give a CPU pod its node's GPUs."""
    from rayship.api.common import reserved_env_rule

    item_rule = reserved_env_rule("[self.name]", "env[].name").rule
    map_rule = reserved_env_rule("self.envVars", "runtimeEnv.envVars").rule
    found = []
    for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        schema = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for where, node in walk(schema):
            rules = [v["rule"] for v in node.get("x-kubernetes-validations", [])]
            if {"name", "value", "valueFrom"} <= set(node.get("properties", {})):
                found.append(f"{path.stem}:{where}")
                assert item_rule in rules, f"{path.name} {where}: an env var without the reserved-name rule"
            if "envVars" in node.get("properties", {}):
                found.append(f"{path.stem}:{where}.envVars")
                assert map_rule in rules, f"{path.name} {where}.envVars: without the reserved-name rule"
    kinds = {f.split(":")[0] for f in found}
    assert kinds == {"trainingjobs.rayship.dev", "modelservices.rayship.dev", "trainingschedules.rayship.dev"}
    assert any(f.endswith(".application.runtimeEnv.envVars") for f in found), found


@pytest.mark.parametrize(
    "uri",
    [
        "abfs://checkpoints@acct.dfs.core.windows.net/runs",  # container@account: no credential
        "s3://bucket/runs?versionId=3",  # a query that signs nothing
        "gs://bucket/runs",
    ],
)
def test_uris_that_hold_no_credential_are_taken(uri: str, trainingjob_validator) -> None:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["spec"]["checkpoint"]["storage"] = {"uri": uri}
    assert trainingjob_validator.errors(doc) == []
    assert parse(doc).spec.checkpoint.storage.uri == uri
