"""The driver of a TrainingJob: `python -m rayship_workloads.job --spec <json|file>`.

The RayJob's entrypoint in the cluster, and what `rayship run` calls on a laptop (`local.run`): both
go through `run`, which trains (`train`) or, with `spec.tuning`, tunes (`tune`), and reports through
a `Reporter`: `ClusterReporter` here (the terminal and the TrainingJob's status), `local.LocalReporter`
in local mode (the terminal, metrics.json, loss.png, result.json).

In the cluster, checkpoints and models go to `spec.checkpoint.storage` (the PVC's mount path or the
object-store URI); local mode picks its own directory.

Secrets: in a cluster the spec is a file of the operator's spec Secret, mounted on the head (the
entrypoint only names it, with the digest of the Secret's files: `check_spec_files`); it may hold
private values, so nothing here prints the spec, and every
error message about it goes through `redact.scrub` (`env[].value` -> `***`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from ray.train.v2.api.callback import UserCallback

from rayship import api
from rayship.api import names, yamlio
from rayship.api.validation import SpecError, parse_trainingjob
from rayship_workloads import data, joblog, progress, redact, strategies, tracking, train, tune


class JobError(ValueError):
    """The TrainingJob cannot run here: the message starts with the field to fix."""


@dataclass(frozen=True)
class JobResult:
    """What a run leaves, in the TrainingJob status' terms."""

    checkpoint: api.CheckpointStatus  # latest/best checkpoint, exported model(s)
    metrics: dict[str, Any] = field(default_factory=dict)  # the last report (the best trial's, tuning)
    tuning: api.TuningStatus | None = None
    trials: tuple[tune.Trial, ...] = ()
    tune_results: str | None = None  # where Tune keeps each trial's results

    def status(self) -> dict[str, Any]:
        """The TrainingJob `status` fields it sets (wire form)."""
        status: dict[str, Any] = {"checkpoint": self.checkpoint.wire()}
        if self.tuning is not None:
            status["tuning"] = self.tuning.wire()
        return status


class Reporter(Protocol):
    """Where a run's progress and result go."""

    quiet: bool  # Ray Train's own logging at WARNING
    prefix: str  # before each progress line (a tuning trial's too)

    def progress(self, *, epochs: int, storage_root: str) -> UserCallback:
        """The callback that reports each epoch of a training run (not called for tuning trials)."""
        ...

    def finished(self, tj: api.TrainingJob, result: JobResult) -> None: ...


class ClusterReporter:
    """Inside the RayJob: `[rayship]` lines in the job log, and the TrainingJob's status
    (`progress` while training, then `checkpoint` and `tuning`) when `trainingjob` (`namespace/name`,
    from the environment variable `names.ENV_TRAININGJOB`, which the operator sets) is given."""

    quiet = False
    prefix = "[rayship] "

    def __init__(self, trainingjob: str | None) -> None:
        self.trainingjob = trainingjob

    def progress(self, *, epochs: int, storage_root: str) -> UserCallback:
        return progress.ProgressCallback(
            epochs=epochs, storage_root=storage_root, trainingjob=self.trainingjob, echo=True
        )

    def finished(self, tj: api.TrainingJob, result: JobResult) -> None:
        summary = result.checkpoint.model_dump(mode="json", by_alias=True)
        if result.tuning is not None:
            summary["tuning"] = result.tuning.wire()
        summary, _ = progress.finite(summary)  # strict JSON: the patch below says what it leaves out
        print(f"[rayship] done: {json.dumps(summary, allow_nan=False)}", flush=True)
        if self.trainingjob:
            progress.TrainingJobStatus(self.trainingjob).patch(result.status())


def read_document(value: str) -> Any:
    """The document of a JSON string (the RayJob entrypoint) or a YAML/JSON file, not validated."""
    return json.loads(value) if value.lstrip().startswith("{") else yamlio.load(Path(value).read_text())


def load_trainingjob(value: str) -> api.TrainingJob:
    """A TrainingJob from a JSON string (the RayJob entrypoint) or a YAML/JSON file, validated."""
    return parse_trainingjob(read_document(value))


def cluster_storage_root(spec: api.TrainingJobSpec) -> str:
    """Where checkpoints and models go in the cluster: the PVC's mount path or the object-store URI."""
    store = spec.checkpoint.storage
    if store is None:
        raise JobError(
            "spec.checkpoint.storage: required to run in a cluster (a pvc or an object-store uri "
            "for the checkpoints and the model); only `rayship run` works without it"
        )
    if store.pvc is not None:
        return store.pvc.mount_path
    if store.uri is None:  # the API requires exactly one of pvc and uri
        raise JobError("spec.checkpoint.storage: set pvc or uri")
    return store.uri


def run(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    reporter: Reporter,
    runtime_env: dict[str, Any] | None = None,
) -> JobResult:
    """Train `tj` (or tune it, with `spec.tuning`) with checkpoints and models under `storage_root`;
    report progress and the result through `reporter`. `runtime_env`: Ray's runtime env for the
    training workers (local mode; in a cluster `spec.runtimeEnv` is the whole job's, from the RayJob)."""
    if tj.spec.tuning is None:
        result = _train(tj, storage_root, reporter, runtime_env)
    else:
        result = _tune(tj, storage_root, reporter, runtime_env)
    reporter.finished(tj, result)
    return result


def _train(
    tj: api.TrainingJob, storage_root: str, reporter: Reporter, runtime_env: dict[str, Any] | None
) -> JobResult:
    """One Train run (tracked in MLflow with spec.tracking)."""
    tracked = tracking.job_run(tj, storage_root, train.run_name(tj))
    callbacks = [reporter.progress(epochs=tj.spec.trainer.epochs, storage_root=storage_root)]
    try:
        outcome = train.train(
            tj,
            storage_root=storage_root,
            callbacks=callbacks + ([tracking.MlflowCallback(tracked)] if tracked else []),
            quiet=reporter.quiet,
            runtime_env=runtime_env,
        )
    except BaseException:
        if tracked is not None:
            tracked.finish(tags={}, failed=True)
        raise
    if tracked is not None:
        uris = {
            "checkpoint": outcome.latest,
            "model": outcome.model_uri,
            "bestModel": outcome.best_model_uri,
        }
        tracked.finish(tags={f"rayship.{k}": v for k, v in uris.items() if v}, failed=False)
    checkpoint = {
        "latest": outcome.latest,
        "best": outcome.best,
        "model": outcome.model_uri,
        "bestModel": outcome.best_model_uri,
    }
    return JobResult(api.CheckpointStatus.model_validate(checkpoint), metrics=outcome.metrics)


def _tune(
    tj: api.TrainingJob, storage_root: str, reporter: Reporter, runtime_env: dict[str, Any] | None
) -> JobResult:
    """A Tune search (spec.tuning); the best trial's model is the job's."""
    prefix = reporter.prefix  # the trials' lines: Tune pickles the callback, not the reporter
    found = tune.search(
        tj,
        storage_root=storage_root,
        runtime_env=runtime_env,
        say=lambda line: print(f"{prefix}{line}", flush=True),
    )
    checkpoint = {"best": found.best_checkpoint, "model": found.model_uri, "bestModel": found.model_uri}
    return JobResult(
        api.CheckpointStatus.model_validate(checkpoint),
        metrics=found.metrics,
        tuning=api.TuningStatus.model_validate(
            {
                "trials": len(found.trials),
                "bestTrial": found.best_trial,
                "bestMetric": found.best_metric,
                "bestConfig": found.best_config,
            }
        ),
        trials=found.trials,
        tune_results=found.results,
    )


def check_spec_files(spec_file: str, digest: str) -> None:
    """The files of the Secret mounted where `spec_file` is are the ones the operator wrote (their
    `files_digest` is the entrypoint's): a Secret planted under the same name has other content, and
    nothing of it is read. Raises OSError naming what differs."""
    folder = Path(spec_file).parent
    # A Secret volume holds each key as a file, through `..data/` links that start with two dots.
    # Read as bytes: a planted file that is not UTF-8 gives another digest, not a traceback.
    files = {
        p.name: p.read_bytes().decode(errors="replace")
        for p in folder.iterdir()
        if not p.name.startswith("..") and p.is_file()
    }
    found = yamlio.files_digest(files)
    if found != digest:
        raise OSError(
            f"the Secret mounted at {folder} is not the one the operator made for this job (its files' "
            f"digest is {found}, the entrypoint's {digest}): it was replaced after the operator made it; "
            "nothing of it is run. Delete it and the TrainingJob, and look at who may write Secrets here"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rayship_workloads.job",
        description="Run a TrainingJob on the Ray cluster this process is a job of: train, or tune with "
        "spec.tuning; checkpoints and models go to spec.checkpoint.storage.",
    )
    parser.add_argument("--spec", required=True, help="TrainingJob as JSON, or a YAML/JSON file")
    parser.add_argument(
        "--spec-digest",
        help="files_digest of the folder of --spec (a Secret's mount): checked before reading",
    )
    args = parser.parse_args(argv)
    doc: Any = None
    try:
        if args.spec_digest:
            check_spec_files(args.spec, args.spec_digest)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        doc = read_document(args.spec)
        tj = parse_trainingjob(doc)
    except (SpecError, OSError, ValueError, yaml.YAMLError) as err:
        message = " ".join(str(err).split("\n")) if isinstance(err, yaml.YAMLError) else str(err)
        print(f"error: invalid TrainingJob: {redact.scrub(message, doc)}", file=sys.stderr)
        return 1
    try:
        storage_root = cluster_storage_root(tj.spec)
        # Everything this driver prints from here on (the workers' output too, as Ray forwards it) is
        # also kept next to the checkpoints, for `rayship logs` once the Ray cluster is gone.
        joblog.capture(storage_root, train.run_name(tj), names.DRIVER_LOG, new_attempt=True)
        if said := strategies.fp32_on_cpu(tj):  # CPU worker pods (gpusPerWorker 0), as `rayship run` does
            print(f"[rayship] {said}", flush=True)
        run(tj, storage_root=storage_root, reporter=ClusterReporter(os.environ.get(names.ENV_TRAININGJOB)))
    except (JobError, data.DataError, train.TrainingFailed) as err:
        print(f"error: {redact.scrub(str(err), doc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
