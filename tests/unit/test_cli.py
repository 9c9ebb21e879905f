"""`rayship render`: exact objects for good input; for bad input a clear error naming the field,
exit code 1, never a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rayship import cli
from tests.conftest import SAMPLES, handed_document
from tests.unit.bad_corpus import (
    MESSAGE_CASES,
    METADATA_CASES,
    RAYSHIP_ONLY_CASES,
    SPEC_CASES,
    TEXT_CASES,
    YAML_CASES,
)

SAMPLE = SAMPLES / "trainingjob-ddp.yaml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_yaml_and_json_agree(capsys) -> None:
    code, out, _ = run(capsys, "render", "-f", str(SAMPLE))
    assert code == 0
    as_yaml = list(yaml.safe_load_all(out))
    code, out, _ = run(capsys, "render", "-f", str(SAMPLE), "-o", "json")
    assert code == 0 and json.loads(out) == {"apiVersion": "v1", "kind": "List", "items": as_yaml}
    assert [o["kind"] for o in as_yaml] == [
        "ServiceAccount",
        "RoleBinding",
        "NetworkPolicy",
        "Secret",
        "RayJob",
    ]
    assert as_yaml[-1]["metadata"]["name"] == "mlp-ddp"


def test_render_multi_document_file(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    other = copy.deepcopy(doc)
    other["metadata"]["name"] = "second"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([doc, other]))
    code, out, _ = run(capsys, "render", "-f", str(path), "-o", "json")
    assert code == 0
    rayjobs = [o["metadata"]["name"] for o in json.loads(out)["items"] if o["kind"] == "RayJob"]
    assert rayjobs == ["mlp-ddp", "second"]


@pytest.mark.parametrize(
    ("case", "mutate", "field"),
    SPEC_CASES + RAYSHIP_ONLY_CASES,
    ids=[c[0] for c in SPEC_CASES + RAYSHIP_ONLY_CASES],
)
def test_bad_spec_names_the_field(case: str, mutate, field: str, tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    mutate(doc)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert code == 1, f"{case}: exit {code}"
    assert out == ""
    assert err.startswith(f"error: {path}: ")
    assert field in err, err
    assert "Traceback" not in err and "pydantic" not in err and "errors.pydantic.dev" not in err


@pytest.mark.parametrize(("case", "text", "message"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_bad_document_is_explained(case: str, text: str, message: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (1, "")
    assert message in err, err


@pytest.mark.parametrize(
    ("case", "sample", "mutate", "line"), MESSAGE_CASES, ids=[c[0] for c in MESSAGE_CASES]
)
def test_a_common_mistake_is_said_with_its_fix_and_its_values(
    case: str, sample: str, mutate, line: str, tmp_path: Path, capsys
) -> None:
    doc = yaml.safe_load((SAMPLES / sample).read_text())
    mutate(doc)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (1, "")
    assert err == f"error: {path}: {line}\n"


@pytest.mark.parametrize(("case", "text", "line"), YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_a_yaml_syntax_error_says_where_what_yaml_wanted_and_the_line(
    case: str, text: str, line: str, tmp_path: Path, capsys
) -> None:
    """PyYAML's (libyaml's) words alone ("mapping values are not allowed in this context") leave a new
    user to guess: the line says where, shows that line, says what YAML wanted there in plain words,
    and keeps the parser's own words at the end."""
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (1, "")
    if not yaml.__with_libyaml__:  # PyYAML's own parser: the same words, its own in parentheses
        line = line.rsplit(" (", 1)[0]
    assert err.startswith(f"error: {path}: not valid YAML {line}") and err.count("\n") == 1, err


@pytest.mark.parametrize(("case", "text", "line"), YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_pyyamls_own_parser_gets_the_same_plain_words(case: str, text: str, line: str) -> None:
    """Where libyaml is absent PyYAML parses (and the kubernetes client reads kubeconfigs with it): its
    problems, worded otherwise, map to the same plain words at the same place."""
    from rayship.api import yamlio

    with pytest.raises(yaml.YAMLError) as err:
        list(yaml.load_all(text, Loader=yaml.SafeLoader))
    said = yamlio.explain(err.value, text)
    assert said.startswith(f"not valid YAML {line.rsplit(' (', 1)[0]} ("), said


def test_every_problem_is_listed_once(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["workers"]["replicas"] = -1
    doc["spec"]["trainer"]["epochs"] = 0
    path = tmp_path / "two-problems.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run(capsys, "render", "-f", str(path))
    assert code == 1
    assert err.count("\n") == 2 and "spec.workers.replicas" in err and "spec.trainer.epochs" in err


def test_unknown_field_suggests_the_right_name(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["workers"]["gpuPerWorker"] = 2
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(doc))
    _, _, err = run(capsys, "render", "-f", str(path))
    assert "spec.workers.gpuPerWorker: unknown field; did you mean 'gpusPerWorker'?" in err


def test_missing_file_and_binary_file(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "render", "-f", str(tmp_path / "absent.yaml"))
    assert code == 1 and "cannot read: No such file or directory" in err
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x80\x81\xfe\xff" * 10)
    code, _, err = run(capsys, "render", "-f", str(binary))
    assert code == 1 and "not a text file" in err


def test_bad_operator_environment_is_explained(monkeypatch, capsys) -> None:
    monkeypatch.setenv("RAYSHIP_GPU_TOLERATIONS", "not json")
    code, _, err = run(capsys, "render", "-f", str(SAMPLE))
    assert code == 1 and "RAYSHIP_" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["render", "-f", "/nonexistent.yaml"], ["render", "-f", "-"]])
def test_real_process_exit_code_and_no_traceback(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rayship.cli", *argv],
        input="kind: [",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


PROGRAM_EXIT = """
import atexit, sys, threading, time
from rayship import cli
atexit.register(lambda: print("atexit ran", end=""))  # unflushed: the exit must flush it
if sys.argv[1] == "thread":  # a thread that outlives main(): the normal exit waits for it
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()
sys.argv = ["rayship", "render", "-f", "/nonexistent.yaml"]
cli.command()
print("not reached")
"""


@pytest.mark.parametrize("case", ["fast", "thread"])
def test_the_program_exits_with_mains_code_after_its_atexit_functions_and_threads(case: str) -> None:
    """`rayship` (cli.command) ends without Python's module teardown, but as a normal exit otherwise."""
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM_EXIT, case], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ("thread done\natexit ran" if case == "thread" else "atexit ran"), proc.stdout


def test_usage_error_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rayship.cli", "render"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "-f/--file" in proc.stderr


def test_yaml_numbers_are_read_as_kubernetes_reads_them(tmp_path: Path, capsys) -> None:
    """`2e-5` is a float in YAML 1.2 (Kubernetes) but a string in PyYAML's YAML 1.1."""
    text = SAMPLE.read_text().replace("learningRate: 0.01", "learningRate: 2e-5")
    assert "2e-5" in text
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    code, out, err = run(capsys, "render", "-f", str(path), "-o", "json")
    assert code == 0, err
    assert handed_document(json.loads(out)["items"])["spec"]["trainer"]["learningRate"] == 2e-05


@pytest.mark.parametrize(("case", "mutate", "said"), METADATA_CASES, ids=[c[0] for c in METADATA_CASES])
def test_labels_and_annotations_the_api_server_refuses_are_refused_first(
    case: str, mutate, said: str, tmp_path: Path, capsys
) -> None:
    """No CRD rule holds metadata (the API server checks it itself; tests/operator/test_admission.py
    proves it refuses these): rayship refuses them before anything is sent, in one line."""
    doc = yaml.safe_load(SAMPLE.read_text())
    mutate(doc)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (1, "") and said in err and len(err.strip().splitlines()) == 1, err


def test_yaml_merge_keys_merge_as_kubectl_reads_them(tmp_path: Path, capsys) -> None:
    """`<<: *anchor` (kubectl accepts it) was refused as "not valid YAML": it merges, a key the mapping
    gives itself wins over a merged one, and a key given twice is still refused."""
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["trainer"]["config"] = {"hidden": [8], "note": "own"}
    expanded = tmp_path / "expanded.yaml"
    expanded.write_text(yaml.safe_dump(doc))
    doc["spec"]["trainer"]["config"] = "CONFIG"
    text = yaml.safe_dump(doc).replace("CONFIG", "{<<: &defaults {hidden: [8], note: theirs}, note: own}")
    merged = tmp_path / "merged.yaml"
    merged.write_text(text)
    code, out, err = run(capsys, "render", "-f", str(merged), "-o", "json")
    assert code == 0, err
    _, want, _ = run(capsys, "render", "-f", str(expanded), "-o", "json")
    assert handed_document(json.loads(out)["items"]) == handed_document(json.loads(want)["items"])
    merged.write_text(text.replace("note: own}", "note: own, note: again}"))
    code, _, err = run(capsys, "render", "-f", str(merged))
    assert code == 1 and "duplicate key 'note'" in err, err


def test_an_unquoted_date_is_a_string_as_kubernetes_reads_it(tmp_path: Path, capsys) -> None:
    """PyYAML makes `2026-01-01` a date, which no JSON field holds; the API server keeps the string."""
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["trainer"]["config"] = {"dataset_date": "DATE"}
    path = tmp_path / "dated.yaml"
    path.write_text(yaml.safe_dump(doc).replace("DATE", "2026-01-01"))
    code, out, err = run(capsys, "render", "-f", str(path), "-o", "json")
    assert code == 0, err
    handed = handed_document(json.loads(out)["items"])
    assert handed["spec"]["trainer"]["config"] == {"dataset_date": "2026-01-01"}


def test_serve_with_a_wrong_model_uri_is_explained_before_ray_starts(tmp_path: Path, capsys) -> None:
    pytest.importorskip("ray", reason="the workload stack is not installed: run `make setup`")
    code, _, err = run(capsys, "serve", "--model", str(tmp_path / "absent"))
    assert code == 1 and "--model" in err and "no such directory" in err and "Traceback" not in err
    code, _, err = run(capsys, "serve", "--model", str(tmp_path))  # a directory, but not a model
    assert code == 1 and "not a rayship model (no rayship-model.json)" in err


def test_run_with_a_missing_working_dir_is_explained_before_ray_starts(tmp_path: Path, capsys) -> None:
    """runtimeEnv.workingDir is a local folder for `rayship run`, relative to the YAML file."""
    pytest.importorskip("ray", reason="the workload stack is not installed: run `make setup`")
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["runtimeEnv"] = {"workingDir": "my-code"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "run", "-f", str(path), "--runs-dir", str(tmp_path / "runs"))
    assert code == 1 and out == ""
    assert err == f"error: {path}: spec.runtimeEnv.workingDir: {tmp_path / 'my-code'} is not a folder\n"


def test_render_ships_the_runtime_env_and_refuses_a_local_folder(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["runtimeEnv"] = {
        "workingDir": "https://example.com/code/v1.zip",
        "pip": ["emoji==2.14.1"],
        "envVars": {"LOG_LEVEL": "debug"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, _ = run(capsys, "render", "-f", str(path))
    *_, secret, rayjob = list(yaml.safe_load_all(out))
    assert code == 0 and yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]) == {
        "working_dir": "https://example.com/code/v1.zip",
        "pip": ["emoji==2.14.1"],
    }
    # envVars reach the driver and every worker as the pods' env, their values from the spec Secret
    for group in (
        rayjob["spec"]["rayClusterSpec"]["headGroupSpec"],
        *rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"],
    ):
        (container,) = group["template"]["spec"]["containers"]
        ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "runtime-env.LOG_LEVEL"}}
        assert {"name": "LOG_LEVEL", "valueFrom": ref} in container["env"]
    assert secret["stringData"]["runtime-env.LOG_LEVEL"] == "debug"
    # a local folder: packed onto the checkpoint claim (`rayship apply` uploads it), said on stderr
    doc["spec"]["runtimeEnv"]["workingDir"] = "."
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "render", "-f", str(path))
    *_, rayjob = list(yaml.safe_load_all(out))
    working_dir = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["working_dir"]
    assert code == 0 and working_dir.startswith("file:///mnt/checkpoints/rayship-code/"), err
    assert f"spec.runtimeEnv.workingDir {tmp_path} is packed (1 file) as {working_dir}" in err


def test_operator_with_a_bad_setting_says_which_in_one_line_before_it_starts(capsys, monkeypatch) -> None:
    """The operator's configuration is read when it starts (not at import): a bad RAYSHIP_* variable is
    one line naming it, exit 1, before kopf or any API call."""
    monkeypatch.setenv("RAYSHIP_WORKERS", "abc")
    code, _, err = run(capsys, "operator")
    assert code == 1
    assert err.strip().splitlines() == [err.strip()] and "RAYSHIP_WORKERS" in err and "Traceback" not in err
