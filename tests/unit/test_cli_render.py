"""`rayship render` as kubectl reads files, so it fits a GitOps pipeline: `-f` repeated, a folder (its
.yaml, .yml and .json files in name order; `-R` for its subfolders), several documents and `kind: List`
in one file, other kinds passed through untouched in their place; one line per problem naming the file,
the document and the field, nothing on stdout; a ModelService whose TrainingJob is not rendered with it
is rendered, with a warning."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import cli
from tests.conftest import SAMPLES

TJ = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
MS = yaml.safe_load((SAMPLES / "modelservice-from-trainingjob.yaml").read_text())
PVC = yaml.safe_load((SAMPLES / "checkpoints-pvc.yaml").read_text())
CONFIGMAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "settings", "namespace": "default", "annotations": {"a": "b"}},
    "data": {"z": "1", "a": "2"},
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def named(name: str, doc: dict[str, Any] = TJ) -> dict[str, Any]:
    renamed = copy.deepcopy(doc)
    renamed["metadata"]["name"] = name
    return renamed


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects]


def rendered(out: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(out) if o is not None]


def test_the_samples_folder_renders_for_kubectl_apply_with_its_claim_first_and_untouched(capsys) -> None:
    """`rayship render -f manifests/samples/ | kubectl apply -f -`: the claim, a PersistentVolumeClaim,
    comes first (checkpoints-pvc.yaml sorts first) exactly as written; every TrainingJob's RayJob
    follows; the ModelServices name TrainingJobs rendered with them, so no warning."""
    code, out, err = run(capsys, "render", "-f", f"{SAMPLES}/")
    assert code == 0, err
    objects = rendered(out)
    assert objects[0] == PVC
    assert out.startswith("apiVersion: v1\nkind: PersistentVolumeClaim\n")  # as written, key order kept
    rayjobs = [o["metadata"]["name"] for o in objects if o["kind"] == "RayJob"]
    samples = sorted(SAMPLES.glob("*.yaml"))
    jobs = [
        d["metadata"]["name"]
        for p in samples
        if (d := yaml.safe_load(p.read_text()))["kind"] == "TrainingJob"
    ]
    assert rayjobs == jobs  # in the files' order; the schedule makes none until a time is due
    assert [o["kind"] for o in objects].count("RayService") == 2
    assert "warning: " not in err and "error: " not in err


def test_several_files_a_folder_and_stdin_keep_their_order(tmp_path: Path, capsys, monkeypatch) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "b.yml").write_text(yaml.safe_dump(named("b")))
    (folder / "a.json").write_text(json.dumps(named("a")))
    (folder / "c.yaml").write_text(yaml.safe_dump(CONFIGMAP))
    (folder / "notes.txt").write_text("not: [yaml")  # not a manifest's extension: not read
    (folder / "README.md").write_text("# nothing\n")
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump(named("first")))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(yaml.safe_dump(named("piped"))))
    code, out, err = run(capsys, "render", "-f", str(first), "-f", str(folder), "-f", "-", "-o", "json")
    assert code == 0, err
    objects = json.loads(out)["items"]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "RayJob"] == ["first", "a", "b", "piped"]
    assert kinds(objects).index("ConfigMap/settings") == kinds(objects).index("RayJob/b") + 1
    assert objects[kinds(objects).index("ConfigMap/settings")] == CONFIGMAP


def test_a_folder_is_read_without_its_subfolders_unless_recursive(tmp_path: Path, capsys) -> None:
    (tmp_path / "top.yaml").write_text(yaml.safe_dump(named("top")))
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "one.yaml").write_text(yaml.safe_dump(named("one")))
    (tmp_path / "sub" / "deeper" / "two.yaml").write_text(yaml.safe_dump(named("two")))
    (tmp_path / "z.yaml").write_text(yaml.safe_dump(named("z")))

    def rayjobs(*flags: str) -> list[str]:
        code, out, err = run(capsys, "render", "-f", str(tmp_path), *flags)
        assert code == 0, err
        return [o["metadata"]["name"] for o in rendered(out) if o["kind"] == "RayJob"]

    assert rayjobs() == ["top", "z"]
    # kubectl's order (a lexical walk): each folder's entries by name, a subfolder where its name sorts
    assert rayjobs("-R") == ["two", "one", "top", "z"]
    assert rayjobs("--recursive") == ["two", "one", "top", "z"]


def test_a_list_and_several_documents_are_taken_apart(tmp_path: Path, capsys) -> None:
    path = tmp_path / "list.yaml"
    listed = {"apiVersion": "v1", "kind": "List", "items": [named("in-list"), CONFIGMAP]}
    path.write_text(yaml.safe_dump_all([PVC, listed, named("after")]))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert code == 0, err
    objects = rendered(out)
    assert objects[0] == PVC
    assert [o["kind"] for o in objects] == [
        "PersistentVolumeClaim",
        *("ServiceAccount", "RoleBinding", "NetworkPolicy", "Secret", "RayJob"),  # in-list
        "ConfigMap",
        *("ServiceAccount", "RoleBinding", "NetworkPolicy", "Secret", "RayJob"),  # after
    ]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "RayJob"] == ["in-list", "after"]
    assert objects[6] == CONFIGMAP


def test_one_object_in_json_is_itself_and_several_a_list(tmp_path: Path, capsys) -> None:
    path = tmp_path / "pvc.yaml"
    path.write_text(yaml.safe_dump(PVC))
    code, out, _ = run(capsys, "render", "-f", str(path), "-o", "json")
    assert code == 0 and json.loads(out) == PVC
    code, out, _ = run(capsys, "render", "-f", str(path), "-f", str(path), "-o", "json")
    assert code == 0 and json.loads(out) == {"apiVersion": "v1", "kind": "List", "items": [PVC, PVC]}


def test_a_bad_document_anywhere_is_one_line_naming_file_document_and_field_and_nothing_is_printed(
    tmp_path: Path, capsys
) -> None:
    good = tmp_path / "a-good.yaml"
    good.write_text(yaml.safe_dump_all([PVC, named("fine")]))
    bad = named("bad")
    bad["spec"]["workers"]["replicas"] = 0
    listed = {"apiVersion": "v1", "kind": "List", "items": [CONFIGMAP, bad]}
    broken = tmp_path / "b-broken.yaml"
    broken.write_text(yaml.safe_dump_all([named("ok"), listed]))
    typo = tmp_path / "c-typo.yaml"
    typo.write_text(yaml.safe_dump({**named("typo"), "kind": "TrainingJobs"}))
    code, out, err = run(capsys, "render", "-f", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: {broken} (document 2, item 2): spec.workers.replicas: input should be greater than or "
        "equal to 1 (got 0)",
        f"error: {typo}: kind: 'TrainingJobs' is not a rayship kind; expected one of: TrainingJob, "
        "ModelService, TrainingSchedule",
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"kind": "ConfigMap", "metadata": {"name": "x"}}, "apiVersion: required field is missing"),
        ({"apiVersion": "v1", "metadata": {"name": "x"}}, "kind: required field is missing"),
        (
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "x"},
                "binaryData": {"k": b"\x00"},
            },
            "binaryData.k: a !!binary value is not JSON",
        ),
        ({"apiVersion": "v1", "kind": "List", "items": "x"}, "items: a List holds a list of objects"),
    ],
    ids=["no-api-version", "no-kind", "not-json", "list-of-nothing"],
)
def test_a_document_of_another_kind_must_still_be_an_object_kubectl_can_apply(
    doc: dict[str, Any], message: str, tmp_path: Path, capsys
) -> None:
    path = tmp_path / "other.yaml"
    path.write_text(yaml.dump(doc, Dumper=yaml.SafeDumper))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (1, "") and err.startswith(f"error: {path}: ") and message in err, err


def test_a_folder_with_nothing_to_render_and_a_missing_path_are_explained(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("x")
    code, out, err = run(capsys, "render", "-f", str(tmp_path))
    assert (code, out) == (1, "")
    assert (
        err == f"error: {tmp_path}: no .yaml, .yml or .json files in this folder (-R reads its subfolders)\n"
    )
    code, _, err = run(capsys, "render", "-f", str(tmp_path / "absent"))
    assert code == 1 and err == f"error: {tmp_path / 'absent'}: cannot read: No such file or directory\n"


def test_a_service_whose_trainingjob_is_not_rendered_with_it_renders_with_a_warning(
    tmp_path: Path, capsys
) -> None:
    service = copy.deepcopy(MS)
    service["spec"]["model"]["fromTrainingJob"]["name"] = "mlp-dpp"
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump_all([TJ, service]))
    code, out, err = run(capsys, "render", "-f", str(path))
    assert code == 0 and "RayService" in kinds(rendered(out))[-1]
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {path} (document 2): spec.model.fromTrainingJob: TrainingJob mlp-dpp is not among the "
        "documents rendered; in a cluster the service waits until a TrainingJob of that name exists and "
        "succeeds; did you mean mlp-ddp?"
    ]
    # alone, with no close name: no guess
    alone = tmp_path / "alone.yaml"
    alone.write_text(yaml.safe_dump(service))
    code, _, err = run(capsys, "render", "-f", str(alone))
    assert code == 0
    assert (
        f"warning: {alone}: spec.model.fromTrainingJob: TrainingJob mlp-dpp is not among the documents "
        "rendered; in a cluster the service waits until a TrainingJob of that name exists and succeeds\n"
    ) in err


def test_each_model_of_a_service_names_a_trainingjob_rendered_or_is_warned_about(
    tmp_path: Path, capsys
) -> None:
    service = copy.deepcopy(MS)
    del service["spec"]["model"]
    service["spec"]["models"] = {
        "good": {"fromTrainingJob": {"name": "mlp-ddp"}},
        "typo": {"fromTrainingJob": {"name": "mlp-dd"}},
    }
    other_namespace = named("mlp-dd")
    other_namespace["metadata"]["namespace"] = "elsewhere"  # not the service's namespace: not a match
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump_all([TJ, other_namespace, service]))
    code, _, err = run(capsys, "render", "-f", str(path))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {path} (document 3): spec.models.typo.fromTrainingJob: TrainingJob mlp-dd is not among "
        "the documents rendered; in a cluster the service waits until a TrainingJob of that name exists "
        "and succeeds; did you mean mlp-ddp?"
    ]


def test_no_warning_for_a_service_whose_trainingjob_is_rendered_with_it(tmp_path: Path, capsys) -> None:
    first, second = tmp_path / "ms.yaml", tmp_path / "tj.yaml"
    first.write_text(yaml.safe_dump(MS))
    second.write_text(yaml.safe_dump(TJ))
    code, _, err = run(capsys, "render", "-f", str(first), "-f", str(second))
    assert code == 0 and "warning: " not in err, err


@pytest.mark.parametrize("command", ["run", "demo", "serve"])
def test_run_serve_and_demo_still_take_one_document_of_their_kind(
    command: str, tmp_path: Path, capsys
) -> None:
    pytest.importorskip("ray", reason="the workload stack is not installed: run `make setup`")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([PVC, TJ if command != "serve" else MS]))
    code, out, err = run(capsys, command, "-f", str(path), "--runs-dir", str(tmp_path / "runs"))
    kind = "ModelService" if command == "serve" else "TrainingJob"
    assert (code, out) == (1, "") and err == f"error: {path}: expected one {kind}, found 2 documents\n"
    code, _, err = run(capsys, command, "-f", str(SAMPLES / "checkpoints-pvc.yaml"))
    assert code == 1 and err == (
        f"error: {SAMPLES / 'checkpoints-pvc.yaml'}: kind: 'PersistentVolumeClaim' is not a rayship kind; "
        "expected one of: TrainingJob, ModelService, TrainingSchedule\n"
    )


def test_render_warns_of_what_a_modelservice_makes_readable_or_runs(tmp_path: Path, capsys) -> None:
    """A ModelService's plain env is written into the RayService's pod templates, application.args and
    vllm.engineArgs into serveConfigV2, as they are: secret-looking names are warned of (keys that are
    settings, such as max_tokens or tokenizer, are not), and trust_remote_code is named. The render
    goes on (exit 0): these are likely, not certain."""
    own = copy.deepcopy(MS)
    own["metadata"]["name"] = "own"
    own["spec"]["env"] = [{"name": "HF_TOKEN", "value": "hf_abc"}, {"name": "LOG_LEVEL", "value": "info"}]
    own["spec"]["application"] = {
        "importPath": "app:app_builder",
        "args": {"max_tokens": 64, "tokenizer": "gpt2", "db": {"password": "pw"}, "api_key": ""},
    }
    vllm = yaml.safe_load((Path(__file__).parent / "specs" / "modelservice-vllm.yaml").read_text())
    vllm["spec"]["vllm"]["engineArgs"] = {
        "trust_remote_code": True,
        "max_num_batched_tokens": 4096,
        "hf_token": "x",
    }
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump_all([TJ, own, vllm]))
    assert cli.main(["render", "-f", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.count("kind: RayService") == 2
    warned = sorted(
        line.split(": ")[2]
        for line in err.splitlines()
        if line.startswith("warning: ")
        and "fromTrainingJob" not in line  # the vLLM spec's model is elsewhere
    )
    assert warned == [
        "spec.application.args.db.password",
        "spec.env[0] HF_TOKEN",
        "spec.vllm.engineArgs.hf_token",
        "spec.vllm.engineArgs.trust_remote_code",
    ], err
    assert "trust_remote_code: true runs the Python code that comes with the model's files" in err
