"""The run's checkpoint listing (`train.latest_checkpoint`) over a storage that fails: a hiccup is
waited out; a storage that stays unreadable fails the attempt, never "no checkpoint" (a restart from
epoch 0 whose new checkpoints would rotate the good ones out). No Ray: the listing is plain pyarrow."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rayship_workloads import storage, train

pytestmark = pytest.mark.workloads


class Flaky:
    """A local filesystem whose listing fails with `error` the first `failures` times."""

    def __init__(self, failures: int, error: OSError) -> None:
        self.local, self.failures, self.error, self.calls = pafs.LocalFileSystem(), failures, error, 0

    def get_file_info(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.local.get_file_info(selector)


def runs(tmp_path: Path, monkeypatch, flaky: Flaky) -> list[float]:
    for epoch in (1, 2, 3):
        (tmp_path / "job" / f"epoch-{epoch:05d}").mkdir(parents=True)
    monkeypatch.setattr(storage, "filesystem", lambda uri: (flaky, uri))
    return []


def test_a_storage_hiccup_is_waited_out(tmp_path: Path, monkeypatch) -> None:
    flaky = Flaky(2, OSError(5, "Input/output error"))
    slept = runs(tmp_path, monkeypatch, flaky)
    assert train.latest_checkpoint(str(tmp_path), "job", sleep=slept.append) == "epoch-00003"
    assert slept == list(train.LIST_RETRY_DELAYS[:2]) and flaky.calls == 3


def test_a_storage_that_stays_unreadable_fails_with_the_path_and_the_error(
    tmp_path: Path, monkeypatch
) -> None:
    flaky = Flaky(99, ConnectionResetError(104, "Connection reset by peer"))
    slept = runs(tmp_path, monkeypatch, flaky)
    with pytest.raises(train.CheckpointStorageError) as err:
        train.latest_checkpoint(str(tmp_path), "job", sleep=slept.append)
    line = str(err.value)
    assert f"checkpoint storage {tmp_path / 'job'} cannot be listed (5 tries over 7.5 s)" in line
    assert "ConnectionResetError: [Errno 104] Connection reset by peer" in line and "\n" not in line
    assert slept == list(train.LIST_RETRY_DELAYS)
    assert isinstance(err.value, train.TrainingFailed)  # said as one line, the job's exit code != 0


def test_a_run_without_checkpoints_is_none_at_once(tmp_path: Path) -> None:
    slept: list[float] = []
    assert train.latest_checkpoint(str(tmp_path), "never-ran", sleep=slept.append) is None
    (tmp_path / "empty").mkdir()
    assert train.latest_checkpoint(str(tmp_path), "empty", sleep=slept.append) is None
    assert slept == []
