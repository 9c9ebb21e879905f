"""The shipped TrainingJob examples (examples/*/trainingjob.yaml), one per tutorial flow: each is valid
for `rayship run` as shipped, and `rayship render` shows its cluster side after exactly the changes
its header comment (and the README) names. The render is checked strictly against the KubeRay CRD and
KubeRay's rules and kept as a golden file; the changed document passes the generated CRD."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import cli
from rayship.api.validation import parse, parse_trainingjob
from rayship.config import OperatorConfig
from rayship.controller import trainingjob
from tests.conftest import ROOT, SAMPLES, rayship_samples
from tools.kuberay_rules import rayjob_violations

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*/trainingjob.yaml"))
# What a cluster needs changed in each example, as its header says (spec paths, dotted).
FOR_A_CLUSTER: dict[str, dict[str, Any]] = {
    "byo-loop": {"runtimeEnv.workingDir": "s3://bucket/code/byo-loop.zip"},
    "lm-finetune": {"data.uri": "/mnt/checkpoints/datasets/corpus.jsonl"},
    "tune-asha": {},
    "tune-pbt": {},
}


def for_a_cluster(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    for dotted, value in FOR_A_CLUSTER[path.parent.name].items():
        node = doc["spec"]
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return doc


def test_every_example_says_what_a_cluster_needs() -> None:
    assert {p.parent.name for p in EXAMPLES} == set(FOR_A_CLUSTER)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_example_runs_locally_as_shipped_and_render_names_what_to_change(path: Path, capsys) -> None:
    parse(yaml.safe_load(path.read_text()), local=True)
    code = cli.main(["render", "-f", str(path)])
    err = capsys.readouterr().err
    changes = FOR_A_CLUSTER[path.parent.name]
    if not changes:
        assert code == 0, err
        return
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert any(dotted.split(".")[-1] in err for dotted in changes), err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_example_renders_for_a_cluster_strictly(path: Path, trainingjob_validator, rayjob_validator) -> None:
    doc = for_a_cluster(path)
    assert trainingjob_validator.errors(doc) == []
    objects = trainingjob.render_trainingjob(parse_trainingjob(doc), OperatorConfig())
    (rayjob,) = [o for o in objects if o["kind"] == "RayJob"]
    assert rayjob_validator.errors(rayjob) == []
    assert rayjob_violations(rayjob) == []
    golden = GOLDEN / f"example-{path.parent.name}.rayjob.yaml"
    text = yaml.safe_dump_all(objects, sort_keys=False, width=120)
    if os.environ.get("RAYSHIP_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file; run with RAYSHIP_UPDATE_GOLDEN=1 to create {golden.name}"
    assert text == golden.read_text(), (
        f"render changed; review and run RAYSHIP_UPDATE_GOLDEN=1 ({golden.name})"
    )


def test_the_samples_ship_the_claim_they_name_read_write_many_and_applied_first() -> None:
    """Every sample's checkpoint claim is in manifests/samples, as ReadWriteMany (a job's Ray pods and a
    ModelService's replicas mount it from any node), in a file `kubectl apply -f manifests/samples/`
    applies before the jobs (kubectl takes a folder's files in name order)."""
    claims = {}
    for path in sorted(SAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "PersistentVolumeClaim":
            claims[doc["metadata"]["name"]] = (path.name, doc)
    named = set()
    for path in rayship_samples():
        text = path.read_text()
        named |= set(re.findall(r"claimName: ([a-z0-9-]+)", text))
    assert named and named <= set(claims), (named, set(claims))
    for name in named:
        file, claim = claims[name]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], file
        assert all(file < p.name for p in rayship_samples()), file
