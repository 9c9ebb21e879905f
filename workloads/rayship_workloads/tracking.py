"""Experiment tracking with MLflow (`spec.tracking.mlflow`), from the driver's side only: the workers
never import mlflow.

- Training: one MLflow run per TrainingJob, found again by its `rayship.uid` tag (the TrainingJob's
  uid in a cluster; `rayship run` has no uid and uses the run name), so a retried, resumed or
  resubmitted job goes on logging to the same run. `MlflowCallback` (a Ray Train callback, in the
  Train controller) logs each report's metrics at step = epoch; `finish` tags the checkpoint and
  model URIs and ends the run (FINISHED or FAILED).
- Tuning: Ray Tune's own `MLflowLoggerCallback`, one MLflow run per trial, tagged alike.

MLflow assigns run ids itself (a client cannot choose one), hence the tag.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray.train
from ray.train.v2.api.callback import UserCallback

from rayship import api
from rayship_workloads import progress

log = logging.getLogger("rayship.tracking")
UID_TAG = "rayship.uid"
TRAININGJOB_TAG = "rayship.trainingjob"


def settings(tj: api.TrainingJob, storage_root: str) -> tuple[str, str] | None:
    """(tracking URI, experiment) of `tj`, None without spec.tracking.mlflow. Without a tracking URI
    (only `rayship run`: a cluster requires one) a SQLite store beside the run's checkpoints
    (`mlflow ui --backend-store-uri sqlite:///rayship-runs/mlflow.db` shows it)."""
    tracking = tj.spec.tracking
    if tracking is None or tracking.mlflow is None:
        return None
    mlflow = tracking.mlflow
    uri = mlflow.tracking_uri or f"sqlite:///{Path(storage_root).resolve() / 'mlflow.db'}"
    return uri, mlflow.experiment or f"rayship-{tj.metadata.namespace or 'default'}"


def identity(tj: api.TrainingJob, run_name: str) -> str:
    """The value of the `rayship.uid` tag: the TrainingJob's uid, or the local run's name."""
    return str((tj.metadata.model_extra or {}).get("uid") or run_name)


def params(tj: api.TrainingJob) -> dict[str, str]:
    """The settings worth comparing runs by, as MLflow params (strings)."""
    trainer, workers = tj.spec.trainer, tj.spec.workers
    found: dict[str, Any] = {
        "recipe": trainer.recipe or trainer.entrypoint,
        "strategy": trainer.strategy,
        "epochs": trainer.epochs,
        "learningRate": trainer.learning_rate,
        "batchSizePerWorker": trainer.batch_size_per_worker,
        "workers": workers.replicas,
        "gpusPerWorker": workers.gpus_per_worker,
        "data.source": tj.spec.data.source,
    }
    found.update({f"config.{k}": v for k, v in sorted(trainer.config.items())})
    return {k: str(v)[:6000] for k, v in found.items() if v is not None}


class Run:
    """The job's MLflow run: found by its tag, or created (with `params`) on first use."""

    def __init__(self, uri: str, experiment: str, uid: str, name: str, tj_params: dict[str, str]):
        self.uri, self.experiment, self.uid, self.name, self.params = uri, experiment, uid, name, tj_params
        self._run_id: str | None = None

    def client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def run_id(self) -> str:
        if self._run_id is not None:
            return self._run_id
        client = self.client()
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = (
            experiment.experiment_id if experiment is not None else client.create_experiment(self.experiment)
        )
        found = client.search_runs([experiment_id], filter_string=f"tags.`{UID_TAG}` = '{self.uid}'")
        if found:
            self._run_id = str(found[0].info.run_id)
            if found[0].info.status != "RUNNING":
                client.update_run(self._run_id, status="RUNNING")
        else:
            run = client.create_run(
                experiment_id, run_name=self.name, tags={UID_TAG: self.uid, TRAININGJOB_TAG: self.name}
            )
            self._run_id = str(run.info.run_id)
            from mlflow.entities import Param

            client.log_batch(self._run_id, params=[Param(k, v) for k, v in self.params.items()])
        return self._run_id

    def log_epoch(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["epoch"]), int(record.get("time", 0) * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in record["metrics"].items()]
        self.client().log_batch(self.run_id(), metrics=metrics)

    def finish(self, *, tags: dict[str, str], failed: bool) -> None:
        """Tag the run and end it FINISHED or FAILED; a tracking error is said, never raised (the job's
        own outcome stands)."""
        try:
            client, run_id = self.client(), self.run_id()
            for key, value in tags.items():
                client.set_tag(run_id, key, value)
            client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
        except Exception as err:  # noqa: BLE001 - any client error: said, the job's outcome stands
            log.warning("MLflow (%s): the run's end was not logged: %s", self.uri, err)


def job_run(tj: api.TrainingJob, storage_root: str, run_name: str) -> Run | None:
    """The TrainingJob's MLflow run (not yet contacted), None without spec.tracking.mlflow."""
    found = settings(tj, storage_root)
    if found is None:
        return None
    return Run(*found, identity(tj, run_name), tj.metadata.name, params(tj))


class MlflowCallback(UserCallback):
    """Each report's metrics (averaged over the ranks, as `status.progress` shows them) to the run,
    at step = epoch. A tracking server that does not answer costs the metric, not the training: it is
    said in the log and training goes on."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: ray.train.Checkpoint | None
    ) -> None:
        record = progress.summarize(metrics)
        try:
            self.run.log_epoch({**record, "time": time.time()})
        except Exception as err:  # noqa: BLE001 - any client error: said, training goes on
            log.warning("MLflow (%s): epoch %s not logged: %s", self.run.uri, record["epoch"], err)


def tune_callback(tj: api.TrainingJob, storage_root: str, run_name: str) -> Any:
    """Ray Tune's MLflow logger (one run per trial, tagged with the job), None without tracking."""
    found = settings(tj, storage_root)
    if found is None:
        return None
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    uri, experiment = found
    return MLflowLoggerCallback(
        tracking_uri=uri,
        experiment_name=experiment,
        tags={UID_TAG: identity(tj, run_name), TRAININGJOB_TAG: tj.metadata.name},
        save_artifact=False,
    )
