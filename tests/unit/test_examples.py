"""The shipped examples (examples/*/), one per tutorial flow: each TrainingJob is valid for `rayship run`
as shipped, and each folder renders for a cluster as shipped (`rayship render -f examples/X/`): a local
runtimeEnv.workingDir packed onto the checkpoint claim, as `rayship apply` uploads it. The render is
checked strictly against the generated CRDs, KubeRay's CRDs and KubeRay's rules and kept as a golden
file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from rayship import cli
from rayship.api.validation import parse
from rayship.cli.render import read, render_documents, with_code
from rayship.config import OperatorConfig
from tests.conftest import ROOT, SAMPLES, rayship_samples
from tools.kuberay_rules import rayjob_violations, rayservice_violations

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())
# The examples whose folder is their code (runtimeEnv.workingDir: .), packed for a cluster.
SHIPS_ITS_FOLDER = {"byo-loop", "lm-finetune", "pipeline"}


def test_every_example_is_here() -> None:
    assert {p.name for p in EXAMPLES} == SHIPS_ITS_FOLDER | {"tune-asha", "tune-pbt"}


@pytest.mark.parametrize(
    "path", sorted(ROOT.glob("examples/*/trainingjob.yaml")), ids=lambda p: p.parent.name
)
def test_example_runs_locally_as_shipped(path: Path) -> None:
    parse(yaml.safe_load(path.read_text()), local=True)


@pytest.mark.parametrize("folder", EXAMPLES, ids=lambda p: p.name)
def test_example_folder_renders_for_a_cluster_as_shipped(folder: Path, capsys) -> None:
    """`rayship render -f examples/X/`, unchanged: a local workingDir is said to be packed onto the claim
    (and `rayship apply` to upload it), nothing else."""
    code = cli.main(["render", "-f", str(folder)])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("apiVersion"), err
    packed = [line for line in err.splitlines() if "is packed (" in line]
    if folder.name in SHIPS_ITS_FOLDER:
        (line,) = packed
        assert f"{folder} is packed" in line and "file:///mnt/checkpoints/rayship-code/" in line, line
        assert "`rayship apply -f` uploads it" in line, line
    else:
        assert packed == [], err


@pytest.mark.parametrize("folder", EXAMPLES, ids=lambda p: p.name)
def test_example_renders_for_a_cluster_strictly(
    folder: Path, trainingjob_validator, modelservice_validator, rayjob_validator, rayservice_validator
) -> None:
    """As `rayship apply` would send them: each document passes the generated CRD, each RayJob and
    RayService KubeRay's CRD and rules; the objects are kept as a golden file."""
    docs, shipments = with_code(read([str(folder)], False))
    assert ({label for label in shipments} != set()) == (folder.name in SHIPS_ITS_FOLDER)
    validators = {"TrainingJob": trainingjob_validator, "ModelService": modelservice_validator}
    for _, doc in docs:
        assert validators[doc["kind"]].errors(doc) == []
    objects = render_documents(docs, OperatorConfig())
    for obj in objects:
        if obj["kind"] == "RayJob":
            assert rayjob_validator.errors(obj) == [] and rayjob_violations(obj) == []
        if obj["kind"] == "RayService":
            assert rayservice_validator.errors(obj) == [] and rayservice_violations(obj) == []
    golden = GOLDEN / f"example-{folder.name}.yaml"
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
