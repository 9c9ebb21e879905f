"""`rayship logs` (rayship.joblogs): where a TrainingJob's logs are, and the shell script that reads them,
run here with a real `sh` on files the workload's own writer made (rayship_workloads.joblog)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import cli, joblogs
from rayship.api import names
from rayship_workloads import joblog
from tests.conftest import SAMPLES


def stored(**storage: Any) -> dict[str, Any]:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["metadata"].update(namespace="team-a", uid="u1")
    if storage:
        doc["spec"]["checkpoint"]["storage"] = storage
    return doc


def test_the_logs_are_under_the_runs_folder_on_the_checkpoint_pvc() -> None:
    where = joblogs.target(stored())
    pvc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())["spec"]["checkpoint"]["storage"][
        "pvc"
    ]
    assert (where.namespace, where.name, where.claim) == ("team-a", "mlp-ddp", pvc["claimName"])
    assert where.logs_dir == f"{pvc.get('mountPath', '/mnt/checkpoints')}/team-a.mlp-ddp/logs"


def test_logs_on_object_storage_are_read_from_here_with_this_machines_credentials(
    s3, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job whose checkpoints are on object storage keeps its logs there: `rayship logs` reads them
    with this machine's credentials, whether the Ray cluster runs or not (no pod needed)."""
    where = joblogs.target(stored(uri=s3.uri("runs")))
    assert where.claim is None and where.logs_dir == f"{s3.uri('runs')}/team-a.mlp-ddp/logs"
    saved = sys.stdout, sys.stderr
    try:
        joblog.capture(s3.uri("runs"), "team-a.mlp-ddp", names.DRIVER_LOG, new_attempt=True)
        print("rank 0 epoch 1/3 loss 0.25")
        sys.stdout.handler.close()  # type: ignore[attr-defined]  # as at exit: the last part written
    finally:
        sys.stdout, sys.stderr = saved
    capsys.readouterr()  # what the job printed as it ran
    assert joblogs._from_object_storage(None, where, None, None, follow=False) == 0
    assert capsys.readouterr().out == "rank 0 epoch 1/3 loss 0.25\n"
    assert joblogs._from_object_storage(None, where, None, 3, follow=False) == 4
    assert "no attempt-1/rank-3; attempt 1 has: driver" in capsys.readouterr().err


def test_object_storage_out_of_reach_is_one_line_naming_it(s3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: pyarrow's error, one line
    where = joblogs.target(stored(uri=s3.uri("runs")))
    with pytest.raises(
        joblogs.LogsError, match=r"^s3://.*/team-a.mlp-ddp/logs: .*this machine's credentials"
    ):
        joblogs._from_object_storage(None, where, None, None, follow=False)


def run_script(
    folder: Path, attempt: int | None = None, rank: int | None = None
) -> subprocess.CompletedProcess[str]:
    script = joblogs.reader_script(str(folder), attempt, joblogs.process_name(rank), follow=False)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two attempts as the workload writes them: the driver and two ranks, the first driver's file
    rotated past its backups."""
    monkeypatch.setattr(names, "LOG_ROTATE_BYTES", 64)
    saved = sys.stdout, sys.stderr
    try:
        for attempt, lines in ((1, 6), (2, 2)):
            joblog.capture(str(tmp_path), "run", names.DRIVER_LOG, new_attempt=True)
            for i in range(lines):
                print(f"attempt {attempt} driver line {i:02d} " + "." * 10)
            for rank in (0, 1):
                joblog.capture(str(tmp_path), "run", names.rank_log(rank), new_attempt=False)
                print(f"attempt {attempt} rank {rank}")
            sys.stdout.flush()
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, joblog.Tee):
                stream.handler.close()
        sys.stdout, sys.stderr = saved
    return tmp_path / "run" / names.LOGS_DIR


def test_the_latest_attempts_driver_by_default_an_older_one_or_a_rank_on_request(written: Path) -> None:
    latest = run_script(written)
    assert latest.returncode == 0 and latest.stdout.splitlines() == [
        f"attempt 2 driver line {i:02d} .........." for i in range(2)
    ]
    first = run_script(written, attempt=1)
    # one line a file at 64 bytes: 6 lines made the file and its 4 backups, the oldest rotated out;
    # what is kept is read oldest first, in order
    assert (written / "attempt-1" / f"driver.log.{names.LOG_BACKUPS}").is_file()
    assert first.stdout.splitlines() == [f"attempt 1 driver line {i:02d} .........." for i in range(1, 6)]
    assert run_script(written, attempt=1, rank=1).stdout == "attempt 1 rank 1\n"


def test_what_is_not_there_is_named_with_what_is(written: Path, tmp_path: Path) -> None:
    missing = run_script(written, rank=7)
    assert missing.returncode == 4
    assert "no attempt-2/rank-7.log; attempt 2 has: driver rank-0 rank-1" in missing.stderr
    assert "attempt-1 attempt-2" in missing.stderr
    nothing = run_script(tmp_path / "none")
    assert nothing.returncode == joblogs.NOT_YET and "no logs yet" in nothing.stderr
    (tmp_path / "empty").mkdir()
    assert run_script(tmp_path / "empty").returncode == joblogs.NOT_YET


def test_the_reader_pod_mounts_the_pvc_read_only_as_a_non_root_user() -> None:
    where = joblogs.target(stored())
    pod = joblogs.reader_pod(where, "cat x", "img:1")
    (container,) = pod["spec"]["containers"]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": where.mount, "readOnly": True}]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": where.claim, "readOnly": True}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] and pod["spec"]["restartPolicy"] == "Never"
    assert container["command"] == ["sh", "-c", "cat x"] and container["image"] == "img:1"


def test_a_reference_that_is_neither_kind_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logs", "rayjob/mlp"]) == 1
    err = capsys.readouterr().err
    assert err == "error: rayjob/mlp: name a TrainingJob as tj/NAME or a ModelService as ms/NAME\n"


def test_a_serve_pod_prints_each_replicas_log_or_says_it_has_none(tmp_path: Path) -> None:
    def run(folder: Path) -> subprocess.CompletedProcess[str]:
        script = joblogs.serve_script(False, str(folder))
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)

    none = run(tmp_path)
    assert (
        none.returncode == 0 and none.stdout == "" and "no Serve replica has run in this pod" in none.stderr
    )
    (tmp_path / "replica_app_Model_a.log").write_text("POST /predict 200 3.1ms\n")
    (tmp_path / "controller_1.log").write_text("not a replica\n")
    assert run(tmp_path).stdout == "POST /predict 200 3.1ms\n"
    (tmp_path / "replica_app_Model_b.log").write_text("POST /predict 413 0.4ms\n")
    both = run(tmp_path).stdout
    assert "==> " in both and "200 3.1ms" in both and "413 0.4ms" in both and "not a replica" not in both


def test_a_kubeconfig_that_is_missing_or_names_no_server_that_answers_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in a fresh `rayship` process: no root logging handler. An earlier test in the same process
    # may leave one on a stream since closed, which turned urllib3's retry warnings into "Logging error".
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    assert cli.main(["logs", "tj/mlp", "--kubeconfig", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.startswith(f"error: no kubeconfig at {tmp_path / 'none'}: ")
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],  # nothing listens
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    assert cli.main(["logs", "tj/mlp", "--kubeconfig", str(config), "--context", "other"]) == 1
    assert capsys.readouterr().err == f"error: --context other: no such context in {config} (it has: ctx)\n"
    assert cli.main(["logs", "tj/mlp", "--kubeconfig", str(config)]) == 5  # kube.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "error: cannot reach the API server at https://127.0.0.1:1 (context ctx): connection refused;"
        )
        and err.count("\n") == 1
    )
