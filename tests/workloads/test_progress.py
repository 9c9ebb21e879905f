"""Status patches from the workload (`progress.TrainingJobStatus`): never NaN or Infinity, said once.

No Ray is started: the Kubernetes client is replaced by a recorder of what it would send."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from rayship_workloads import job, progress

pytestmark = pytest.mark.workloads


class RecordingApi:
    """Stands in for `kubernetes.client.CustomObjectsApi`: keeps each status patch's body as the
    client would serialize it (strict JSON, as the API server parses it)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.timeouts: list[Any] = []

    def patch_namespaced_custom_object_status(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        body: dict[str, Any],
        *,
        _request_timeout: Any = None,
    ) -> None:
        self.bodies.append(json.loads(json.dumps(body, allow_nan=False)))  # raises on NaN/Infinity
        self.timeouts.append(_request_timeout)


def recording_status() -> tuple[progress.TrainingJobStatus, RecordingApi]:
    status = progress.TrainingJobStatus("team-a/run-1")
    recorder = RecordingApi()
    status._api = recorder  # the in-cluster client, created on first use, is this object
    return status, recorder


def test_finite_drops_nan_and_infinity_and_names_them() -> None:
    value = {
        "progress": {"epoch": 3, "metrics": {"loss": float("nan"), "acc": 0.5, "grad": float("-inf")}},
        "tuning": {"bestMetric": float("inf"), "bestConfig": {"lr": [0.1, float("nan")]}, "trials": 4},
        "checkpoint": {"model": "/store/team-a.run-1/model"},
    }
    clean, dropped = progress.finite(value)
    assert clean == {
        "progress": {"epoch": 3, "metrics": {"acc": 0.5}},
        "tuning": {"bestConfig": {"lr": [0.1, None]}, "trials": 4},
        "checkpoint": {"model": "/store/team-a.run-1/model"},
    }
    assert sorted(dropped) == [
        "status.progress.metrics.grad",
        "status.progress.metrics.loss",
        "status.tuning.bestConfig.lr[1]",
        "status.tuning.bestMetric",
    ]
    assert progress.finite({"a": 1.0, "b": [2, "x"], "c": None}) == ({"a": 1.0, "b": [2, "x"], "c": None}, [])


def test_a_nan_metric_never_reaches_the_patch_and_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    status, recorder = recording_status()
    caplog.set_level(logging.WARNING, logger="rayship.progress")
    for epoch in (1, 2):
        progress_status = {
            "epoch": epoch,
            "metrics": {"loss": float("nan"), "mae": 0.25},
            "lastCheckpoint": "/c",
        }
        assert status.patch({"progress": progress_status})
    assert [b["status"]["progress"]["metrics"] for b in recorder.bodies] == [{"mae": 0.25}, {"mae": 0.25}]
    assert all(b["status"]["progress"]["lastCheckpoint"] == "/c" for b in recorder.bodies)
    assert recorder.timeouts == [progress.PATCH_TIMEOUT] * 2  # a hung API server cannot stall training
    said = [r.getMessage() for r in caplog.records if "not finite" in r.getMessage()]
    assert len(said) == 1, said
    assert "status.progress.metrics.loss" in said[0] and "team-a/run-1" in said[0]


def test_the_final_status_keeps_the_model_uri_when_the_best_metric_is_infinite() -> None:
    from rayship import api

    result = job.JobResult(
        api.CheckpointStatus.model_validate({"model": "/store/m", "bestModel": "/store/m"}),
        tuning=api.TuningStatus.model_construct(
            trials=2, best_trial="t1", best_metric=float("inf"), best_config={}
        ),
    )
    status, recorder = recording_status()
    assert status.patch(result.status())
    (body,) = recorder.bodies
    assert body["status"]["checkpoint"]["model"] == "/store/m"
    assert "bestMetric" not in body["status"]["tuning"] and body["status"]["tuning"]["bestTrial"] == "t1"


def test_a_resumed_attempt_says_which_epoch_it_resumed_from(tmp_path, monkeypatch) -> None:
    """The built-in recipes report `resumed_from_epoch` (0: from scratch); status.progress says it,
    the metrics stay numbers only."""
    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)  # every report patches
    status, recorder = recording_status()
    callback = progress.ProgressCallback(epochs=8, storage_root=str(tmp_path), echo=False)
    callback.status = status
    rank = {"epoch": 1, "step": 10, "loss": 0.5, "resumed_from_epoch": 0}
    callback.after_report(None, [rank, rank], None)
    resumed = {"epoch": 4, "step": 40, "loss": 0.25, "resumed_from_epoch": 3}
    callback.after_report(None, [resumed, resumed], None)
    first, second = (b["status"]["progress"] for b in recorder.bodies)
    assert "resumedFromEpoch" not in first and first["metrics"] == {"loss": 0.5}
    assert second["resumedFromEpoch"] == 3 and second["metrics"] == {"loss": 0.25}


def test_a_checkpointed_report_reaches_the_status_first_naming_its_epoch_and_ray_cluster(
    tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray Train has registered a report's checkpoint before the callback runs: its status patch goes
    out before the line is printed (the window in which a killed driver loses it, kept short), with
    the checkpoint's epoch and the attempt's Ray cluster (the operator takes a report into the attempt
    that ran on it only); a report without a checkpoint keeps the last one's epoch."""
    monkeypatch.setenv("RAY_CLUSTER_NAME", "mlp-abcde")
    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)
    status, recorder = recording_status()
    printed_at_patch: list[str] = []
    patch = recorder.patch_namespaced_custom_object_status

    def patch_noting_the_terminal(*args: Any, **kw: Any) -> None:
        printed_at_patch.append(capsys.readouterr().out)
        patch(*args, **kw)

    recorder.patch_namespaced_custom_object_status = patch_noting_the_terminal  # type: ignore[method-assign]
    callback = progress.ProgressCallback(epochs=8, storage_root=str(tmp_path), echo=True)
    callback.status = status

    class Checkpoint:
        path = str(tmp_path / "run" / "epoch-00002")

    callback.after_report(None, [{"epoch": 2, "step": 20, "loss": 0.5}], Checkpoint())  # type: ignore[arg-type]
    callback.after_report(None, [{"epoch": 3, "step": 30, "loss": 0.4}], None)
    assert "[rayship] epoch" not in printed_at_patch[0], printed_at_patch
    first, second = (b["status"]["progress"] for b in recorder.bodies)
    assert (first["checkpointEpoch"], first["rayCluster"], first["lastCheckpoint"]) == (
        2, "mlp-abcde", Checkpoint.path)  # fmt: skip
    assert (second["epoch"], second["checkpointEpoch"]) == (3, 2)


def test_the_callback_goes_to_ray_trains_controller_after_the_driver_patched_the_status() -> None:
    """The driver patches the status before training (`ProgressCallback.recover`), which makes the
    Kubernetes client (locks: not picklable); the callback is then pickled for Ray Train's controller.
    It pickles without the client, and the copy makes its own (the clean-clone CI of bb2076a: every
    resumed attempt on real pods failed 'FailTuple(get_run_config ...)' before training)."""
    import kubernetes
    import ray.cloudpickle

    callback = progress.ProgressCallback(
        epochs=2, storage_root="/tmp", trainingjob="team-a/run-1", echo=False
    )
    assert callback.status is not None
    callback.status._api = kubernetes.client.CustomObjectsApi()  # as a patch in the driver leaves it
    copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(callback))
    assert copy.status._api is None and (copy.status.namespace, copy.status.name) == ("team-a", "run-1")
    assert callback.status._api is not None  # the driver keeps its own


def test_a_record_says_where_training_stopped_early_and_keeps_an_own_loops_flags() -> None:
    """`stopped_early` (the built-in loops' report at the epoch earlyStopping ended) becomes the
    record's `stoppedEarly`, not a metric; an own loop's boolean metrics stay metrics (as 1.0/0.0),
    averaged over the ranks like the rest."""
    record = progress.summarize(
        [
            {"epoch": 4, "step": 40, "loss": 0.5, "stopped_early": True, "ok": True},
            {"epoch": 4, "step": 40, "loss": 0.7, "stopped_early": True, "ok": False},
        ]
    )
    assert record["stoppedEarly"] is True
    assert record["metrics"] == {"loss": pytest.approx(0.6), "ok": 0.5}
    assert "stoppedEarly" not in progress.summarize([{"epoch": 1, "step": 1, "loss": 1.0}])
    assert "stopped early" in progress.epoch_line(record, 10)


def test_an_unreadable_metrics_json_is_set_aside_not_overwritten(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A resumed run whose metrics.json cannot be read keeps it (renamed, and said) instead of writing
    its new history over it; the history is written whole (never half a file)."""
    metrics = tmp_path / "metrics.json"
    metrics.write_text('[{"epoch": 1, "step": 4, "metrics": {"loss": 0.5}}, {"epo')  # cut short by a crash
    with caplog.at_level(logging.WARNING, logger="rayship.progress"):
        callback = progress.ProgressCallback(
            epochs=3, storage_root=str(tmp_path), metrics_path=str(metrics), echo=False
        )
    assert callback.history == [] and not metrics.exists()
    (aside,) = tmp_path.glob("metrics.json.unreadable-*")
    assert aside.read_text().endswith('{"epo') and str(aside) in caplog.text
    callback.after_report(None, [{"epoch": 2, "step": 8, "loss": 0.25}], None)
    assert [r["epoch"] for r in json.loads(metrics.read_text())] == [2]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("metrics.json.unreadable")) == [
        "metrics.json"
    ]  # no partial file left
    assert progress.read_history(str(metrics)) == json.loads(metrics.read_text())
