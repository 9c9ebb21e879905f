"""`rayship apply` before it reaches a cluster: the folder packed as `render` shows it, the namespace
decided as kubectl decides it, and every problem one line naming the field, nothing sent. (On the
real node: tests/e2e/test_realpods.py::test_rayship_apply_runs_the_examples_own_code_on_real_pods.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rayship import cli, codepack
from rayship.api.validation import SpecError
from rayship.cli.apply import namespaced
from tests.conftest import ROOT

EXAMPLES = ROOT / "examples"


def test_dry_run_client_packs_the_folder_as_render_says_and_sends_nothing(capsys) -> None:
    code = cli.main(["apply", "-f", str(EXAMPLES / "byo-loop"), "--dry-run", "client"])
    out, err = capsys.readouterr()
    package = codepack.pack(EXAMPLES / "byo-loop", "f")
    assert code == 0, err
    assert f"as file:///mnt/checkpoints/rayship-code/{package.name}" in out
    assert out.splitlines()[-1] == "trainingjob.rayship.dev/houses (dry run: client)"
    cli.main(["render", "-f", str(EXAMPLES / "byo-loop")])
    assert f"working_dir: file:///mnt/checkpoints/rayship-code/{package.name}" in capsys.readouterr().out


def test_a_folder_with_the_trainingjob_the_service_names_finds_its_claim(capsys) -> None:
    assert cli.main(["apply", "-f", str(EXAMPLES / "pipeline"), "--dry-run", "client"]) == 0
    out = capsys.readouterr().out
    assert "spec.application.runtimeEnv.workingDir would be packed" in out, out
    assert "modelservice.rayship.dev/pipeline" in out and "trainingjob.rayship.dev/pipeline-mlp" in out


def test_the_service_alone_says_where_its_code_would_go(capsys) -> None:
    code = cli.main(["apply", "-f", str(EXAMPLES / "pipeline" / "modelservice.yaml"), "--dry-run", "client"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("error: ") and "spec.application.runtimeEnv.workingDir:" in line
    assert "TrainingJob pipeline-mlp, which was not found: apply it first, or with this file" in line


def test_an_invalid_document_stops_everything_before_anything_is_sent(tmp_path: Path, capsys) -> None:
    (tmp_path / "loop.py").write_text("def train(config):\n    pass\n")
    (tmp_path / "job.yaml").write_text(
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: own}\nspec:\n"
        "  trainer: {entrypoint: loop:train, epochs: 0}\n  runtimeEnv: {workingDir: .}\n"
        "  checkpoint: {storage: {pvc: {claimName: c}}}\n"
    )
    code = cli.main(["apply", "-f", str(tmp_path), "--dry-run", "client"])
    err = capsys.readouterr().err
    assert code == 1 and "spec.trainer.epochs" in err and "Traceback" not in err, err


def test_the_namespace_is_the_documents_else_the_flags_else_the_contexts() -> None:
    base = Path(".")
    job = {"kind": "TrainingJob", "metadata": {"name": "a"}}
    placed = namespaced([("f", job, base), ("g", {**job, "metadata": {"name": "b", "namespace": "x"}}, base)],
                        None, "ctx")  # fmt: skip
    assert [d["metadata"]["namespace"] for _, d, _ in placed] == ["ctx", "x"]
    assert namespaced([("f", job, base)], "team", "ctx")[0][1]["metadata"]["namespace"] == "team"
    assert "namespace" not in job["metadata"]  # the document read is left as it was
    claim_class = {"kind": "StorageClass", "metadata": {"name": "s"}}
    assert "namespace" not in namespaced([("s", claim_class, base)], "team", "ctx")[0][1]["metadata"]
    with pytest.raises(SpecError) as err:
        namespaced([("g", {**job, "metadata": {"name": "b", "namespace": "x"}}, base)], "team", "ctx")
    assert err.value.problems == [
        "g: metadata.namespace is x and -n says team: drop one of them (as kubectl, rayship applies an object "
        "only to the namespace it names)"
    ]


def test_without_a_kubeconfig_it_says_so_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = cli.main(["apply", "-f", str(EXAMPLES / "byo-loop")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: no kubeconfig at ") and len(err.splitlines()) == 1, err
