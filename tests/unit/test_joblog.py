"""A job's output kept next to its checkpoints (rayship_workloads.joblog): attempts, ranks, rotation.
Each test restores sys.stdout and sys.stderr (the capture replaces them for the process)."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayship.api import names
from rayship_workloads import joblog


@pytest.fixture
def streams() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Fresh sys.stdout and sys.stderr for the test's body (set here, in the call phase: pytest sets its
    own at each phase), restored after."""
    saved = sys.stdout, sys.stderr
    out, err = io.StringIO(), io.StringIO()
    yield out, err
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, joblog.Tee):
            stream.handler.close()
    sys.stdout, sys.stderr = saved


def use(streams: tuple[io.StringIO, io.StringIO]) -> tuple[io.StringIO, io.StringIO]:
    sys.stdout, sys.stderr = streams
    return streams


def test_the_driver_starts_an_attempt_and_the_workers_write_into_it(tmp_path: Path, streams) -> None:
    out, _ = use(streams)
    first = joblog.capture(str(tmp_path), "default.job", names.DRIVER_LOG, new_attempt=True)
    assert first == tmp_path / "default.job" / "logs" / "attempt-1" / "driver.log"
    print("epoch 1 loss 0.5")
    print("a warning", file=sys.stderr)
    assert out.getvalue() == "epoch 1 loss 0.5\n"  # the stream still gets everything
    rank = joblog.capture(str(tmp_path), "default.job", names.rank_log(1), new_attempt=False)
    assert rank == first.parent / "rank-1.log"
    print("rank 1 epoch 1")
    sys.stdout.flush()
    assert first.read_text() == "epoch 1 loss 0.5\na warning\n"
    assert rank.read_text() == "rank 1 epoch 1\n"
    # the next attempt (a retry on a new Ray cluster) gets its own folder; nothing of the first is lost
    second = joblog.capture(str(tmp_path), "default.job", names.DRIVER_LOG, new_attempt=True)
    assert second is not None and second.parent.name == "attempt-2"
    print("resumed from epoch 1")
    sys.stdout.flush()
    assert second.read_text() == "resumed from epoch 1\n" and first.read_text().startswith("epoch 1")
    assert joblog.attempts(tmp_path / "default.job" / "logs") == [1, 2]


def test_a_file_is_rotated_by_size_keeping_the_last_ones(tmp_path: Path, monkeypatch, streams) -> None:
    use(streams)
    monkeypatch.setattr(names, "LOG_ROTATE_BYTES", 100)
    path = joblog.capture(str(tmp_path), "run", names.DRIVER_LOG, new_attempt=True)
    assert path is not None
    lines = [f"line {i:03d} " + "x" * 30 + "\n" for i in range(40)]
    for line in lines:
        sys.stdout.write(line)
    sys.stdout.flush()
    rotated = [path.with_name(f"driver.log.{n}") for n in range(names.LOG_BACKUPS, 0, -1)]
    assert (
        all(p.is_file() for p in rotated)
        and not path.with_name(f"driver.log.{names.LOG_BACKUPS + 1}").exists()
    )
    kept = "".join(p.read_text() for p in [*rotated, path])  # oldest first, as `rayship logs` reads them
    assert all(p.stat().st_size <= 100 for p in [*rotated, path])
    assert kept == "".join(lines[-len(kept.splitlines()) :]) and lines[-1] in kept


def closed_parts() -> None:
    """The captured streams' object-storage writers, closed: every part written (as at exit)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, joblog.Tee):
            stream.handler.close()


def read_back(logs: str, attempt: int | None, process: str) -> str:
    out: list[str] = []
    joblog.read(logs, attempt, process, out.append)
    return "".join(out)


def test_on_object_storage_each_process_writes_parts_that_read_gives_back_in_order(s3, streams) -> None:
    """Object storage has no append: a process's output is a folder of parts, each written once; the
    attempts and ranks as on a PVC; `read` gives each process's output back whole, in order."""
    out, _ = use(streams)
    root = s3.uri("runs")
    where = joblog.capture(root, "default.job", names.DRIVER_LOG, new_attempt=True)
    assert where == f"{root}/default.job/logs/attempt-1/driver"
    for epoch in range(1, 4):
        print(f"epoch {epoch} loss 0.5")
    sys.stdout.handler.push()  # type: ignore[attr-defined]  # a part now, as every PART_SECONDS
    print("a warning", file=sys.stderr)
    joblog.capture(root, "default.job", names.rank_log(0), new_attempt=False)  # the driver's closed here
    print("rank 0 epoch 1")
    closed_parts()
    assert "epoch 1 loss 0.5" in out.getvalue()  # the stream still gets everything
    logs = joblog.logs_uri(root, "default.job")
    assert (
        read_back(logs, None, "driver") == "epoch 1 loss 0.5\nepoch 2 loss 0.5\nepoch 3 loss 0.5\na warning\n"
    )
    assert read_back(logs, 1, "rank-0") == "rank 0 epoch 1\n"
    # the next attempt (a retry on a new Ray cluster) gets its own folder; nothing of the first is lost
    assert (
        joblog.capture(root, "default.job", names.DRIVER_LOG, new_attempt=True) == f"{logs}/attempt-2/driver"
    )
    print("resumed from epoch 3")
    closed_parts()
    assert read_back(logs, None, "driver") == "resumed from epoch 3\n"
    assert read_back(logs, 1, "driver").startswith("epoch 1 loss 0.5")
    with pytest.raises(
        joblog.LogsMissing,
        match=r"no attempt-2/rank-0; attempt 2 has: driver \(and attempts: attempt-1 attempt-2\)",
    ) as missing:
        read_back(logs, None, "rank-0")
    assert missing.value.code == 4
    with pytest.raises(joblog.LogsMissing, match="no attempt has started yet") as nothing:
        read_back(joblog.logs_uri(root, "other.job"), None, "driver")
    assert nothing.value.code == 3


def test_on_object_storage_the_oldest_parts_go_past_the_total_a_pvc_keeps(s3, monkeypatch, streams) -> None:
    use(streams)
    monkeypatch.setattr(names, "LOG_ROTATE_BYTES", 100)  # (1 + LOG_BACKUPS) x 100 bytes kept
    joblog.capture(s3.uri("runs"), "run", names.DRIVER_LOG, new_attempt=True)
    lines = [f"line {i:03d} " + "x" * 30 + "\n" for i in range(40)]
    for line in lines:
        sys.stdout.write(line)
        sys.stdout.handler.push()  # type: ignore[attr-defined]  # a part per line
    closed_parts()
    kept = read_back(joblog.logs_uri(s3.uri("runs"), "run"), None, "driver")
    assert len(kept) <= 100 * (1 + names.LOG_BACKUPS) and kept == "".join(lines[-len(kept.splitlines()) :])
    assert lines[-1] in kept and lines[0] not in kept


def test_object_storage_out_of_reach_keeps_nothing_says_so_once_and_the_job_goes_on(
    streams, monkeypatch
) -> None:
    from tests.s3_server import S3_ENV

    _, err = use(streams)
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}.items():  # nothing listens
        monkeypatch.setenv(key, value)
    assert joblog.capture("s3://bucket/runs", "job", names.DRIVER_LOG, new_attempt=True) is None
    (line,) = err.getvalue().splitlines()
    assert line.startswith("rayship: logs: s3://bucket/runs/job/logs: ") and "pod logs only" in line
    assert not isinstance(sys.stdout, joblog.Tee)


def test_a_file_that_cannot_be_written_never_loops_and_the_stream_still_gets_the_text(
    tmp_path: Path, streams
) -> None:
    out, err = use(streams)
    path = joblog.capture(str(tmp_path), "run", names.DRIVER_LOG, new_attempt=True)
    assert path is not None
    tee = sys.stdout
    assert isinstance(tee, joblog.Tee)
    tee.handler.stream.close()  # the storage went away under the open file
    print("still printed")
    assert out.getvalue() == "still printed\n"
    assert "Logging error" in err.getvalue()  # logging says why, once per write, on the stream only
