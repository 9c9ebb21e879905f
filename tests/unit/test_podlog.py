"""rayship_workloads.podlog: a worker's few lines reach the pod's log (the container's stream)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayship_workloads import podlog


@pytest.fixture
def stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "container-stdout"
    target.write_text("")
    monkeypatch.setattr(podlog, "CONTAINER_STDOUT", str(target))
    monkeypatch.setattr(podlog, "_unwritable", [])
    return target


def test_in_a_pod_the_line_goes_to_the_container_stream_and_to_stdout(stream, monkeypatch, capsys) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    podlog.worker_started(1, 2, 3)
    line = "rayship: training worker rank 1 of 2 on "
    assert stream.read_text().startswith(line) and "resuming after epoch 3" in stream.read_text()
    assert capsys.readouterr().out.startswith(line)


def test_outside_a_pod_only_stdout(stream, monkeypatch, capsys) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    podlog.say("rank 0 epoch 1/3 loss 0.5")
    assert stream.read_text() == ""
    assert capsys.readouterr().out == "rayship: rank 0 epoch 1/3 loss 0.5\n"


def test_an_unwritable_stream_is_said_once_and_training_goes_on(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setattr(podlog, "CONTAINER_STDOUT", str(tmp_path / "no-such-dir" / "fd"))
    monkeypatch.setattr(podlog, "_unwritable", [])
    podlog.say("one")
    podlog.say("two")
    warnings = [r for r in caplog.records if r.name == "rayship.podlog"]
    assert len(warnings) == 1 and "cannot be written" in warnings[0].getMessage()
