"""Progress: every report's epoch, step, metrics and checkpoint go to the terminal, to a local
metrics.json, and (inside the cluster) to the TrainingJob's `status.progress`.

`ProgressCallback` runs as a Ray Train callback on the controller; the driver's reporter (`job`)
decides which of those it writes. Patching the TrainingJob is rate-limited and never fatal: a failed
patch is logged and training goes on.

A report can be lost as its attempt ends: Ray Train registers the report's checkpoint (and writes its
record of it to the storage) before it calls this callback, so a driver killed between the two leaves
a checkpoint that no report named (on real pods: attempt 2's last report said epoch 5, attempt 3
resumed from epoch 6). Before each attempt trains, `ProgressCallback.recover` reads Ray Train's record
of the newest checkpoint back (`registered_report`): the history gets the record it lacks, and the
TrainingJob's `status.progress.recovered`, for the operator to give to the attempt before.

A status patch never carries NaN or +-Inf (JSON has no such numbers and the API server rejects the
whole patch, the model URI with it): `finite` drops them from every patch (`TrainingJobStatus.patch`),
and each dropped field is said once in the log.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from typing import Any

import pyarrow.fs as pafs
import ray.train
from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
from ray.train.v2.api.callback import UserCallback

from rayship import api
from rayship_workloads import storage

STOPPED_EARLY = "stopped_early"  # in a loop's report of the epoch trainer.earlyStopping ended training at

log = logging.getLogger("rayship.progress")
MIN_INTERVAL_S = 10.0
_said_non_finite: set[str] = set()  # the fields already logged as dropped (once per process)


def finite(value: Any, path: str = "status") -> tuple[Any, list[str]]:
    """`value` without non-finite floats (NaN, +-Inf): left out of dicts, None in lists; and the
    dotted paths of what was dropped."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, [path]
    if isinstance(value, dict):
        clean: dict[Any, Any] = {}
        dropped: list[str] = []
        for key, item in value.items():
            kept, lost = finite(item, f"{path}.{key}")
            dropped += lost
            if not (isinstance(item, float) and lost):
                clean[key] = kept
        return clean, dropped
    if isinstance(value, list | tuple):
        items, dropped = [], []
        for i, item in enumerate(value):
            kept, lost = finite(item, f"{path}[{i}]")
            items.append(kept)
            dropped += lost
        return items, dropped
    return value, []


def checkpoint_uri(checkpoint: ray.train.Checkpoint, storage_root: str) -> str:
    """A URI users can paste: the scheme of the storage root plus the checkpoint's path."""
    scheme = storage_root.split("://", 1)[0] if "://" in storage_root else ""
    return f"{scheme}://{checkpoint.path}" if scheme and "://" not in checkpoint.path else checkpoint.path


def summarize(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every rank's metrics: epoch/step from rank 0, numeric metrics averaged."""
    first = metrics[0]
    numeric = {
        k: fmean(float(m[k]) for m in metrics if k in m)
        for k, v in first.items()
        if isinstance(v, int | float) and k not in ("epoch", "step", "resumed_from_epoch", STOPPED_EARLY)
    }
    record = {"epoch": int(first.get("epoch", 0)), "step": int(first.get("step", 0)), "metrics": numeric}
    if int(first.get("resumed_from_epoch") or 0) > 0:  # the built-in recipes say where they started
        record["resumedFromEpoch"] = int(first["resumed_from_epoch"])
    if first.get(STOPPED_EARLY) is True:  # trainer.earlyStopping ended training at this epoch
        record["stoppedEarly"] = True
    return record


def registered_report(storage_root: str, run: str) -> dict[str, Any] | None:
    """Ray Train's own record of run `run`'s newest checkpoint and of the report that carried it (as
    `summarize` makes a record, with the checkpoint's URI); None when the run has registered none."""
    fs, path = storage.filesystem(storage.join(storage_root, run))
    if fs.get_file_info(f"{path}/{CHECKPOINT_MANAGER_SNAPSHOT_FILENAME}").type == pafs.FileType.NotFound:
        return None
    result = ray.train.Result.from_path(path, storage_filesystem=fs)
    if result.checkpoint is None or not result.metrics or int(result.metrics.get("epoch") or 0) < 1:
        return None  # a loop that reports no epoch: nothing to put on record
    record = summarize([result.metrics])
    record["checkpoint"] = checkpoint_uri(result.checkpoint, storage_root)
    return record


def read_history(path: str, *, set_aside_unreadable: bool = False) -> list[dict[str, Any]]:
    """The records of a metrics.json so far ([] if there is none or it is not a list of records).
    `set_aside_unreadable`: a file that is not one is renamed `<path>.unreadable-<time>` (and said),
    so the history written next does not replace it without a word."""
    try:
        history = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    except (json.JSONDecodeError, UnicodeDecodeError):
        history = None
    if isinstance(history, list):
        return history
    if set_aside_unreadable:
        aside = f"{path}.unreadable-{int(time.time())}"
        Path(path).replace(aside)
        log.warning("%s is not a list of epoch records: kept as %s; the history starts anew", path, aside)
    return []


def write_history(path: str, history: list[dict[str, Any]]) -> None:
    """metrics.json replaced whole (written beside it, then renamed): a crash never leaves half of it."""
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(history, indent=2))
    partial.replace(path)


SHOWN_METRICS = ("loss", "evalLoss", "perplexity")


def epoch_line(record: dict[str, Any], epochs: int) -> str:
    """`epoch 3/5  step 48  loss 0.12345  evalLoss 0.13000` for one record."""
    metrics = record.get("metrics", {})
    shown = "".join(f"  {k} {metrics[k]:.5f}" for k in SHOWN_METRICS if metrics.get(k) is not None)
    stopped = "  stopped early (trainer.earlyStopping: no improvement)" if record.get("stoppedEarly") else ""
    return f"epoch {record['epoch']}/{epochs}  step {record['step']}{shown}{stopped}"


# Seconds to connect, then for the answer, of a status patch: a hung API server must not stall the
# training loop that reports (the patch is retried at the next report).
PATCH_TIMEOUT = (5.0, 15.0)


def _in_cluster_api() -> Any:
    """The Kubernetes client of a pod (its service account token)."""
    import kubernetes

    kubernetes.config.load_incluster_config()
    return kubernetes.client.CustomObjectsApi()


class TrainingJobStatus:
    """Merge-patches `status` of one TrainingJob from inside the cluster (service account token)."""

    def __init__(self, ref: str, make_api: Callable[[], Any] | None = None):
        """`make_api`: what makes the client in each process (default: the in-cluster one)."""
        self.namespace, _, self.name = ref.rpartition("/")
        self.make_api = make_api
        self._api: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the client: it holds locks (not picklable), and the driver's, made by a patch before
        training, goes to Ray Train's controller with the callback (each process makes its own)."""
        return {**self.__dict__, "_api": None}

    def patch(self, status: dict[str, Any]) -> bool:
        """Merge-patch `status` (non-finite numbers left out, see `finite`); False if it failed."""
        status, dropped = finite(status)
        new = [path for path in dropped if path not in _said_non_finite]
        if new:
            _said_non_finite.update(new)
            log.warning(
                "TrainingJob %s/%s: left out of the status patch, not finite (JSON has no NaN/Infinity): %s",
                self.namespace,
                self.name,
                ", ".join(new),
            )
        import kubernetes
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            if self._api is None:
                self._api = (self.make_api or _in_cluster_api)()
            group, version, plural = api.TRAININGJOBS
            self._api.patch_namespaced_custom_object_status(
                group, version, self.namespace, plural, self.name, {"status": status},
                _request_timeout=PATCH_TIMEOUT,
            )  # fmt: skip
            return True
        except (ApiException, HTTPError, OSError, kubernetes.config.ConfigException) as err:
            log.warning(
                "could not update TrainingJob %s/%s status (training goes on): %s",
                self.namespace,
                self.name,
                err,
            )
            return False


class ProgressCallback(UserCallback):
    """Each report: a `[rayship] epoch ...` line (`echo`), the history in `metrics_path`, and the
    TrainingJob's `status.progress` (`trainingjob`: `namespace/name`)."""

    def __init__(
        self,
        *,
        epochs: int,
        storage_root: str,
        metrics_path: str | None = None,
        trainingjob: str | None = None,
        echo: bool = True,
    ):
        self.epochs = epochs
        self.storage_root = storage_root
        self.metrics_path = metrics_path
        self.status = TrainingJobStatus(trainingjob) if trainingjob else None
        self.echo = echo
        # A resumed run goes on with the history it had (metrics.json and its plot cover every epoch).
        self.history: list[dict[str, Any]] = (
            read_history(metrics_path, set_aside_unreadable=True) if metrics_path else []
        )
        self._last_patch = 0.0
        self._last_checkpoint: str | None = None
        self._checkpoint_epoch: int | None = None
        # The attempt's Ray cluster (KubeRay sets it in every Ray container): the operator takes a
        # report into the attempt that ran on it only.
        self._ray_cluster = os.environ.get("RAY_CLUSTER_NAME")

    def recover(self, run: str) -> dict[str, Any] | None:
        """Before an attempt trains (in the driver): Ray Train's record of the run's newest checkpoint
        and its report (`registered_report`), put where the report should have gone. The history gets
        it when it stops short of that epoch (its report was lost: said once; a new history, empty,
        is not this run's); the TrainingJob's `status.progress.recovered` gets it, naming this
        attempt's Ray cluster, for the operator to give to the attempt before. Returns it (None: the
        run has no checkpoint yet)."""
        record = registered_report(self.storage_root, run)
        if record is None:
            return None
        if self.metrics_path:
            self.history = read_history(self.metrics_path)  # as the last attempt's controller left it
            # lost: this history is the run's (an earlier epoch is in it) and stops short of the record
            if self.history and max(int(h.get("epoch") or 0) for h in self.history) < record["epoch"]:
                lost = {**record, "time": time.time(), "recovered": True}
                self.history = sorted([*self.history, lost], key=lambda h: int(h.get("epoch") or 0))
                write_history(self.metrics_path, self.history)
                print(f"[rayship] epoch {record['epoch']}'s report was lost as the last attempt ended; read "
                      "back from Ray Train's record of its checkpoint", flush=True)  # fmt: skip
        if self.status is not None:
            recovered = {k: record[k] for k in ("epoch", "step", "metrics", "checkpoint")}
            if self._ray_cluster:
                recovered["rayCluster"] = self._ray_cluster
            self.status.patch({"progress": {"recovered": recovered}})
        return record

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: ray.train.Checkpoint | None
    ) -> None:
        record = summarize(metrics)
        if checkpoint is not None:
            self._last_checkpoint = checkpoint_uri(checkpoint, self.storage_root)
            self._checkpoint_epoch = record["epoch"]
        record["checkpoint"] = self._last_checkpoint
        record["time"] = time.time()
        # The status first: Ray Train has registered this checkpoint already, and the sooner its
        # report is out, the smaller the window in which a killed driver loses it (see `recover`).
        if self.status is not None:
            due = time.monotonic() - self._last_patch >= MIN_INTERVAL_S
            if due or checkpoint is not None or record["epoch"] >= self.epochs or "stoppedEarly" in record:
                progress = {"epoch": record["epoch"], "step": record["step"], "metrics": record["metrics"]}
                if self._last_checkpoint:
                    progress["lastCheckpoint"] = self._last_checkpoint
                    progress["checkpointEpoch"] = self._checkpoint_epoch
                if self._ray_cluster:
                    progress["rayCluster"] = self._ray_cluster
                for key in ("resumedFromEpoch", "stoppedEarly"):
                    if key in record:
                        progress[key] = record[key]
                if self.status.patch({"progress": progress}):
                    self._last_patch = time.monotonic()
        # epochs redone after a resume replace the records of the attempt that did not keep them
        self.history = [h for h in self.history if h.get("epoch", 0) < record["epoch"]] + [record]
        if self.echo:
            saved = f"  checkpoint {self._last_checkpoint}" if checkpoint is not None else ""
            print(f"[rayship] {epoch_line(record, self.epochs)}{saved}", flush=True)
        if self.metrics_path:
            write_history(self.metrics_path, self.history)
