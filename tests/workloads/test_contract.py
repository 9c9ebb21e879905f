"""The contracts of the workload package: what the RayJob runs resolves and accepts exactly what the
renderer hands it; the driver refuses a cluster run without checkpoint storage in one line; the
recipe registry matches the API's enum; and the modules import each other without a cycle."""

from __future__ import annotations

import ast
import importlib
import json
import shlex
import typing
from pathlib import Path

import pytest
import yaml

from rayship import api
from rayship.api.validation import parse_trainingjob
from rayship.config import OperatorConfig
from rayship.controller import trainingjob
from rayship_workloads import data, job, recipes, train
from tests.conftest import SAMPLES, handed_document

pytestmark = pytest.mark.workloads

PACKAGE = Path(job.__file__).parent


@pytest.mark.parametrize("sample", sorted(SAMPLES.glob("trainingjob-*.yaml")), ids=lambda p: p.stem)
def test_rendered_entrypoint_runs_the_workload_with_the_rendered_spec(ray_session, sample, tmp_path) -> None:
    tj = parse_trainingjob(yaml.safe_load(sample.read_text()))
    objects = trainingjob.render_trainingjob(tj, OperatorConfig())
    handed = handed_document(objects)  # the spec Secret's file, which the head mounts
    argv = shlex.split(objects[-1]["spec"]["entrypoint"])
    assert argv[:4] == ["python", "-m", job.__name__, "--spec"]
    assert callable(importlib.import_module(argv[2]).main)
    # the driver reads it from the file the entrypoint names (here: where the Secret would be mounted)
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    for key, text in secret["stringData"].items():  # every key a file, as a Secret volume has them
        (tmp_path / key).write_text(text)
    mounted = tmp_path / Path(argv[4]).name
    job.check_spec_files(str(mounted), argv[argv.index("--spec-digest") + 1])  # the files it wrote
    loaded = job.load_trainingjob(str(mounted))
    # the renderer hands over an already resolved spec, without `env` (the pods have it, by reference
    # to the same Secret)
    assert "env" not in handed["spec"]
    assert loaded.spec.wire() == {**handed["spec"], "env": []}
    assert {k: getattr(loaded.metadata, k) for k in ("name", "namespace")} == handed["metadata"]
    assert tj.spec.checkpoint.storage is not None and tj.spec.checkpoint.storage.pvc is not None
    assert job.cluster_storage_root(loaded.spec) == tj.spec.checkpoint.storage.pvc.mount_path
    if loaded.spec.data.source == "synthetic":  # others read cluster paths that exist only there
        trainer, prepared = train.build_trainer(loaded, storage_root=str(tmp_path))
        assert prepared.storage_root == str(tmp_path) and trainer is not None
        assert prepared.loop_config(loaded)["rayship"]["spec"] == loaded.spec.wire()  # what own loops get


def test_the_driver_refuses_a_cluster_run_without_checkpoint_storage(tmp_path, capsys) -> None:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    del doc["spec"]["checkpoint"]["storage"]
    assert job.main(["--spec", json.dumps(doc)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint.storage" in err and "Traceback" not in err, err
    # Valid for local Ray, where the driver never asks for it; asked anyway, it says what is missing.
    local = parse_trainingjob(doc, local=True)
    assert local.spec.checkpoint.storage is None
    with pytest.raises(job.JobError, match=r"^spec\.checkpoint\.storage: required to run in a cluster"):
        job.cluster_storage_root(local.spec)


def test_every_recipe_of_the_api_has_a_registry_record() -> None:
    annotation = api.TrainerSpec.model_fields["recipe"].annotation
    (literal,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    assert set(typing.get_args(literal)) == set(recipes.RECIPES)
    for name, recipe in recipes.RECIPES.items():
        assert recipe.name == name and recipe.data_kind in typing.get_args(data.DataKind)
    with pytest.raises(ValueError, match="unknown recipe 'gan'; known: mlp, causal-lm"):
        recipes.get("gan")


def imports_of(path: Path) -> set[str]:
    """The rayship_workloads modules `path` imports anywhere (module level, functions, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("rayship_workloads.")}
        elif isinstance(node, ast.ImportFrom) and node.module == "rayship_workloads":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rayship_workloads."):
            found.add((node.module or "").split(".")[1])
    return found


def test_the_modules_import_each_other_without_a_cycle() -> None:
    graph = {p.stem: imports_of(p) - {p.stem} for p in PACKAGE.glob("*.py")}
    assert "tune" in graph["job"] and "train" in graph["tune"] and "recipes" in graph["models"]  # it parses
    assert not graph["train"] & {"tune", "job", "local"}, graph["train"]

    def cycle_from(module: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if module in path:
            return (*path[path.index(module) :], module)
        for imported in sorted(graph.get(module, ())):
            found = cycle_from(imported, (*path, module))
            if found:
                return found
        return None

    cycles = [c for m in graph if (c := cycle_from(m, ()))]
    assert not cycles, " -> ".join(cycles[0])


def test_train_is_a_library() -> None:
    tree = ast.parse(Path(train.__file__).read_text())
    functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    mains = [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and "__main__" in ast.unparse(n)]
    assert "main" not in functions and not mains
