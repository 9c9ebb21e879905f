"""Local mode: the same TrainingJob YAML on a laptop's Ray (`rayship run -f`), then serving and
querying the result (`rayship serve`, `make demo`).

`run` scales the spec to this machine and calls the same driver as the cluster (`job.run`: train, or
tune with `spec.tuning`) with a `LocalReporter`. Outputs go to `./rayship-runs/<name>/`:
`checkpoints/`, `metrics.json`, `loss.png` (of a training run) and `result.json` ({latest, best, model,
bestModel} URIs, metrics, and `tuning` for a search; `rayship serve` resolves TrainingJobs through it).
`spec.checkpoint.storage` is not used here.

Honest about what it changes and what happens: GPU requests scaled to CPU (and DeepSpeed fp16, which
CPUs do not run, to fp32) are said in one line; the loop's `print()` output is shown; a resumed run
appends to metrics.json and loss.png; a finished run is not retrained without `restart`;
`spec.runtimeEnv` is honoured (workingDir a local folder, relative to the YAML file).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayship import api
from rayship.api.validation import parse_trainingjob
from rayship_workloads.raylog import RayOutput
from rayship_workloads.serve_ingress import (
    haproxy_folder,
    serve_ingress_environment,
    serve_ingress_note,
    stop_haproxy_left_behind,
)

if TYPE_CHECKING:  # at run time, imported where used: `rayship serve` needs no Ray Train or Tune
    from ray.train.v2.api.callback import UserCallback

    from rayship_workloads.job import JobResult

logger = logging.getLogger(__name__)
RUNS_DIR = Path("rayship-runs")
RAY_OUTPUT_FILE = "ray-output.log"  # Ray's own lines of a local run, in its run directory (raylog)
HELD_OUT_ROWS = 256  # the demo's fresh rows, to say the served model's error on data it never saw
DEMO_HOST = "127.0.0.1"  # the demo serves on loopback only
# How often local mode's Ray Train controller polls its workers, which is also how often it collects
# their reports (each `ray.train.report` waits until the previous one is collected). Ray's default,
# 2 s, is meant for a cluster; with the short epochs of a laptop run it was most of each epoch. The
# poll is one small actor call per worker; a value set in the environment wins.
LOCAL_TRAIN_POLL_S = "0.2"
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # Ray Train V2's; on by default
TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # Ray Train V2's; the driver passes it on


def local_environment() -> None:
    """Ray settings for a single-machine cluster (Ray 2.60 turns token auth on by default)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(TRAIN_POLL_ENV, LOCAL_TRAIN_POLL_S)  # read when a run starts, in this process
    # One machine has no node that a drain or a spot reclaim takes away: Ray Train's preemption watcher
    # (an actor process of its own, started as the first epoch starts) has nothing to watch here.
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    # the train loop's print() lines as written: each one (not "[repeated 8x]"), without color codes
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    serve_ingress_environment()


def private_ray_environment(prefix: str) -> str:
    """A local Ray of one's own (tests, benchmarks): HOME and TMPDIR in a new short directory (Ray's
    socket paths are length-limited), per-process logs; returns that directory."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.environ.update({"HOME": directory, "TMPDIR": directory, "RAY_DEDUP_LOGS": "0"})
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    local_environment()
    return directory


def as_trainingjob(tj: api.TrainingJob | Mapping[str, Any]) -> api.TrainingJob:
    """A TrainingJob model as it is, or a document validated into one for local Ray (without the
    rules only a cluster needs, such as `checkpoint.storage`)."""
    return tj if isinstance(tj, api.TrainingJob) else parse_trainingjob(tj, local=True)


def localize(tj: api.TrainingJob, *, cores: int, has_gpu: bool) -> tuple[api.TrainingJob, str]:
    """The TrainingJob scaled to this machine (a copy), and one line saying what changed."""
    local = tj.model_copy(deep=True)
    workers = local.spec.workers
    asked = f"{workers.replicas} workers x {workers.gpus_per_worker} GPU"
    changes = []
    if workers.gpus_per_worker and not has_gpu:
        workers.gpus_per_worker = 0
        changes.append("no GPU here: training on CPU")
    if workers.replicas > cores:
        workers.replicas = cores
        changes.append(f"capped to {cores} workers (local cores)")
        if workers.min_replicas is not None and workers.min_replicas > cores:
            workers.min_replicas = cores  # elastic down to the machine's size
    from rayship_workloads import strategies  # torch: only once a run is being prepared

    if not has_gpu and (said := strategies.fp32_on_cpu(local)):
        changes.append(said)
    got = f"{workers.replicas} {'GPU' if workers.gpus_per_worker else 'CPU'} workers"
    return local, f"local run: {asked} requested -> {got}" + (f" ({'; '.join(changes)})" if changes else "")


def run_dir(tj: api.TrainingJob, runs_dir: Path = RUNS_DIR) -> Path:
    return (runs_dir / tj.metadata.name).resolve()


def init_ray(
    workers: int, runtime_env: dict[str, Any] | None = None, output: RayOutput | None = None
) -> dict[str, Any]:
    """Start local Ray (if this process has none yet) with `runtime_env` as the job's: every Ray
    process of the run gets it, a local working_dir included (Ray uploads it). Returns what the
    training workers still need (Ray running already: their runtime env; it cannot take a local
    working_dir, which Ray uploads only for a job). `output`: where Ray's own lines go instead of
    the terminal (None: Ray prints them, as with --verbose); a Ray that ran already is left as it is."""
    import ray

    local_environment()
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False  # our progress lines say enough
    if ray.is_initialized():
        folder = (runtime_env or {}).get("working_dir")
        if folder and "://" not in folder:
            raise RunRefused(
                "spec.runtimeEnv.workingDir: a local folder is shipped by the Ray that `rayship run` starts; "
                "this process already runs Ray (use `rayship run`, or a zip URI)"
            )
        return dict(runtime_env or {})
    # Logical CPUs: one per training worker plus room for Ray Data and Serve tasks.
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, workers + 2),
        include_dashboard=True,  # Ray Train V2 frees stopped runs' workers through its State API
        object_store_memory=256 * 1024 * 1024,
        logging_level=logging.WARNING,
        log_to_driver=True,  # the train loop's print() output (progress lines follow metrics.json)
        runtime_env=runtime_env or None,
    )
    atexit.unregister(stop_ray)  # registered once, after Ray's own atexit shutdown: it runs first
    atexit.register(stop_ray)
    if output is not None:
        output.attach()
    return {}


def stop_ray() -> None:
    """`ray.shutdown()` of the local Ray this process started, less the second it spent on the
    autoscaler's monitor: Ray stops the GCS before the monitor, whose SIGTERM handler then reports
    its end to the stopped GCS until Ray kills it after its 1 s grace (ray/_private/node.py
    kill_all_processes, autoscaler/_private/monitor.py). A local Ray's monitor has no nodes to look
    after: it is killed first, at once. Ray not running: nothing to do."""
    import ray

    node = ray._private.worker._global_node
    if node is not None and node.head:
        node.kill_monitor(check_alive=False)
    ray.shutdown()


def follow(metrics_path: Path, epochs: int, stop: threading.Event, since: float) -> None:
    """Print one line per epoch reported after `since` (a time), as the progress callback writes
    metrics.json (a resumed run's earlier records stay in it, and are not printed again). On a
    terminal, a progress bar over the epochs stays below the lines."""
    import sys

    from tqdm import tqdm

    from rayship_workloads.progress import epoch_line, read_history

    bar = tqdm(total=epochs, unit="epoch", leave=False, dynamic_ncols=True) if sys.stdout.isatty() else None
    last = since
    try:
        while True:
            stopping = stop.wait(0.5)
            for record in read_history(str(metrics_path)):  # [] until the first epoch is written
                if float(record.get("time", 0)) > last:
                    saved = f"  checkpoint {record['checkpoint']}" if record.get("checkpoint") else ""
                    line = f"{epoch_line(record, epochs)}{saved}"
                    if bar is None:
                        print(line, flush=True)
                    else:
                        bar.write(line)
                        bar.update(max(0, int(record["epoch"]) - bar.n))
                    last = float(record["time"])
            if stopping:
                return
    finally:
        if bar is not None:
            bar.close()


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(history: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("loss", "training loss"), ("evalLoss", "validation loss")):
        points = [(h["epoch"], h["metrics"][key]) for h in history if key in h.get("metrics", {})]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.legend()
    ax.set(xlabel="epoch", ylabel="loss (mean over workers)", title=title, yscale="log")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


class LocalReporter:
    """Local mode's `job.Reporter`: epoch lines on the terminal (followed from metrics.json while a
    run trains), then loss.png, result.json and a summary under the run directory `out`."""

    quiet = True
    prefix = ""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.metrics_path = out / "metrics.json"
        self.summary: dict[str, Any] = {}  # result.json's content, once finished
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    def progress(self, *, epochs: int, storage_root: str) -> UserCallback:
        from rayship_workloads.progress import ProgressCallback

        self._follower = threading.Thread(
            target=follow, args=(self.metrics_path, epochs, self._stop, time.time()), daemon=True
        )
        self._follower.start()
        return ProgressCallback(
            epochs=epochs, storage_root=storage_root, metrics_path=str(self.metrics_path), echo=False
        )

    def close(self) -> None:
        """Stop following metrics.json (after printing what it holds)."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=5)
            self._follower = None

    def _print_trials(self, metric: str, tuning: api.TuningStatus, result: JobResult) -> None:
        """One line per trial, then the best one."""
        for trial in result.trials:
            if trial.error:
                outcome = f"failed: {trial.error.splitlines()[0]}"
            elif trial.metric is None:
                outcome = f"reported no {metric}"
            else:
                outcome = f"{metric} {trial.metric:.5f} (epoch {trial.epoch})"
            config = "  ".join(f"{k}={_short(v)}" for k, v in sorted(trial.config.items()))
            print(f"trial {trial.trial_id}  {outcome}  {config}", flush=True)
        print(
            f"best trial {tuning.best_trial}: {metric} {tuning.best_metric:.5f}  "
            f"config {json.dumps(tuning.best_config, sort_keys=True)}",
            flush=True,
        )
        print(f"trial results: {result.tune_results}", flush=True)

    def finished(self, tj: api.TrainingJob, result: JobResult) -> None:
        self.close()
        name = tj.metadata.name
        self.summary = {"name": name, **result.checkpoint.model_dump(mode="json", by_alias=True)}
        self.summary["metrics"] = result.metrics
        if result.tuning is not None and tj.spec.tuning is not None:
            self.summary["tuning"] = result.tuning.wire()
            self._print_trials(tj.spec.tuning.metric, result.tuning, result)
        (self.out / "result.json").write_text(json.dumps(self.summary, indent=2))
        if self.metrics_path.is_file():
            plot_loss(json.loads(self.metrics_path.read_text()), self.out / "loss.png", name)
            print(f"metrics: {self.metrics_path}  loss curve: {self.out / 'loss.png'}")
        print(f"model: {result.checkpoint.model}", flush=True)


class RunRefused(ValueError):
    """`rayship run` will not start: the message says why and what to do."""


def runtime_env(tj: api.TrainingJob, base_dir: Path) -> dict[str, Any]:
    """Ray's runtime env for `spec.runtimeEnv` on this machine: a local workingDir (relative to
    `base_dir`, the YAML file's folder) must be a folder; a URI is left to Ray."""
    spec = tj.spec.runtime_env
    if spec is None:
        return {}
    working_dir = spec.working_dir
    if working_dir is not None and "://" not in working_dir:
        folder = (base_dir / working_dir).resolve()
        if not folder.is_dir():
            raise RunRefused(f"spec.runtimeEnv.workingDir: {folder} is not a folder")
        working_dir = str(folder)
    return spec.as_ray(working_dir)


def _relative_to(base_dir: Path, uri: str | None) -> str | None:
    """A relative local path as a path from `base_dir`; URIs and absolute paths as they are."""
    if uri is None or "://" in uri or Path(uri).is_absolute():
        return uri
    return str((base_dir / uri).resolve())


def resolve_paths(tj: api.TrainingJob, base_dir: Path) -> None:
    """data.uri and data.validation.uri, when relative, are relative to the YAML file's folder."""
    spec = tj.spec.data
    spec.uri = _relative_to(base_dir, spec.uri)
    if spec.validation is not None:
        spec.validation.uri = _relative_to(base_dir, spec.validation.uri)


def _importable(ray_env: dict[str, Any]) -> None:
    """The driver imports the loop (to check it) from workingDir, as Ray's workers will."""
    import sys

    folder = ray_env.get("working_dir")
    if folder and "://" not in folder and folder not in sys.path:
        sys.path.insert(0, folder)


def run(
    tj: api.TrainingJob | Mapping[str, Any],
    *,
    runs_dir: Path = RUNS_DIR,
    restart: bool = False,
    base_dir: Path | None = None,
    ray_started: Callable[[], None] | None = None,
    verbose: bool = False,
    ray_output: RayOutput | None = None,
) -> dict[str, Any]:
    """Train (or tune, with `spec.tuning`) a TrainingJob on local Ray; returns result.json's content.

    A run that finished before (its result.json is there) is refused unless `restart`, which starts
    it from scratch; an unfinished one resumes from its latest checkpoint. `base_dir`: where a
    relative runtimeEnv.workingDir is (the YAML file's folder; default the current one).
    `ray_started` is called once Ray runs, before training starts (it must not block). Ray's own
    lines go to the run directory's ray-output.log (`ray_output`, else one of the run's own), or to the
    terminal with `verbose`."""

    import torch

    from rayship_workloads import job

    local, notice = localize(as_trainingjob(tj), cores=os.cpu_count() or 1, has_gpu=torch.cuda.is_available())
    ray_env = runtime_env(local, base_dir or Path.cwd())
    resolve_paths(local, base_dir or Path.cwd())
    out = run_dir(local, runs_dir)
    if (out / "result.json").is_file() and not restart:
        raise RunRefused(
            f"{local.metadata.name} already finished ({out / 'result.json'}); run with --restart to "
            "train it again from scratch (its checkpoints, metrics and model are replaced)"
        )
    if restart and out.exists():
        shutil.rmtree(out)
        print(f"restart: removed {out}", flush=True)
    print(notice, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    output = ray_output or (None if verbose else RayOutput(out / RAY_OUTPUT_FILE))
    if output is not None:
        print(f"Ray's own output: {output.path}  (--verbose shows it here)", flush=True)
    if local.spec.tuning is not None:  # a search writes no metrics.json or plot of its own
        for stale in ("metrics.json", "loss.png"):
            (out / stale).unlink(missing_ok=True)
    _importable(ray_env)
    try:
        worker_env = init_ray(local.spec.workers.replicas, ray_env, output)
        if ray_started is not None:
            ray_started()
        if local.spec.tuning is None:  # a search draws no loss curve
            _import_pyplot_ahead()
        reporter = LocalReporter(out)
        try:
            job.run(local, storage_root=str(out / "checkpoints"), reporter=reporter, runtime_env=worker_env)
        finally:
            reporter.close()
    finally:
        if output is not None and ray_output is None:
            output.detach()
    return reporter.summary


def _import_pyplot_ahead() -> None:
    """pyplot, for the loss curve drawn when the run ends, imported in a thread while the job trains
    (the driver mostly waits then): imported at the end, it was 0.9 s between the last epoch and
    `model:` (bench/demo.py's "run end" phase). An import error is raised again by `plot_loss`."""

    def load() -> None:
        try:
            pyplot()
        except ImportError as err:  # raised again where the loss curve is drawn (plot_loss)
            logger.debug("pyplot not imported ahead: %s", err)

    threading.Thread(target=load, name="rayship-pyplot", daemon=True).start()


def post_json(url: str, payload: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def serve(model_uri: str, *, port: int, route_prefix: str = "/", output: RayOutput | None = None) -> str:
    """Serve an exported model on local Ray for the demo (it shuts Serve down itself); the base URL.
    `rayship serve -f` goes through `serve_local.serve`."""
    from rayship_workloads import models, storage
    from rayship_workloads.serve import serve_locally

    models.read_manifest(storage.fetch_dir(model_uri))  # a wrong URI fails here, not inside a replica
    init_ray(1)
    if output is not None:
        output.attach()  # Serve's driver-side logger, set up when Serve was imported
    elif note := serve_ingress_note():
        print(f"local serve: {note}", flush=True)
    url = serve_locally(model_uri, host=DEMO_HOST, port=port, route_prefix=route_prefix)
    print(
        f"serving {model_uri} at {url}  (POST {url.rstrip('/')}/predict, GET {url.rstrip('/')}/healthz)",
        flush=True,
    )
    return url


def demo(
    tj: api.TrainingJob | Mapping[str, Any],
    *,
    runs_dir: Path = RUNS_DIR,
    port: int = 8000,
    base_dir: Path | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """The main job end to end: train on local Ray, serve the model, send one prediction, shut down.
    `base_dir`, `verbose`: as for `run` (the YAML file's folder; Ray's own lines on the terminal).

    The served model is then asked for rows it never saw (`ask`).

    Serve's controller and HTTP proxy (the part of serving that does not need the model) start in a
    background thread as soon as Ray runs, while the job trains: on 2 cores that hides about 5 s of
    process start-up, for which the training left a core idle. The model's replica starts after."""
    import ray
    from ray import serve as ray_serve

    from rayship_workloads.serve import start_http

    tj = as_trainingjob(tj)
    own_ray = not ray.is_initialized()  # the local Ray `run` starts is this process's to stop
    output = None if verbose else RayOutput(run_dir(tj, runs_dir) / RAY_OUTPUT_FILE)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayship-serve-start")
    serve_started: list[Future[None]] = []

    def start_serving() -> None:
        serve_started.append(pool.submit(start_http, DEMO_HOST, port))

    try:
        # the demo trains afresh every time
        result = run(
            tj,
            runs_dir=runs_dir,
            restart=True,
            base_dir=base_dir,
            ray_started=start_serving,
            ray_output=output,
        )
        for started in serve_started:
            started.result()  # Serve's own error, if it could not start
        url = serve(result["model"], port=port, route_prefix="/" + tj.metadata.name, output=output)
        asked = ask(url, tj.spec.trainer.config)
    finally:
        # Stopping the local Ray this demo started stops Serve with it, replicas and all: the one request
        # is answered, nothing is left to drain. On a Ray that was already running, Serve is shut down
        # and Ray left as it was. After a failure too (a job refused before Ray started leaves nothing
        # to stop), said by the error alone.
        pool.shutdown(wait=True)  # Serve's start finishes before Ray stops
        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
            if not own_ray:
                ray_serve.shutdown()
            stop_ray()
            stop_haproxy_left_behind(haproxy_folder(node_id))
        if output is not None:
            output.detach()
    print("shut down: Serve and local Ray stopped", flush=True)
    return {**result, "url": url, **asked}


def ask(url: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The demo's questions to the served model: one fresh row, shown with its error, then the error
    over `HELD_OUT_ROWS` of them. Fresh: draws from the function the synthetic training data came
    from, none of them a training row (the training set's draw has its own sample count in the seed)."""
    from rayship_workloads import data

    x, y = data.synthetic_arrays(HELD_OUT_ROWS, data.synthetic_features(config), seed=data.seed(config))
    features, target = [float(v) for v in x[0]], float(y[0])
    prediction = post_json(f"{url.rstrip('/')}/predict", {"instances": [features]})["predictions"][0][0]
    print(f"POST {url.rstrip('/')}/predict  instances=[[{', '.join(f'{v:.3f}' for v in features)}]]")
    print(f"prediction {prediction:.4f}  (true value {target:.4f}, error {prediction - target:+.4f})")
    held_out = held_out_error(url, x.tolist(), y.tolist())
    print(
        f"held-out error over {len(x)} rows the model never saw: RMSE {held_out['rmse']:.4f} "
        f"(always answering their mean: RMSE {held_out['baseline_rmse']:.4f})",
        flush=True,
    )
    return {"prediction": prediction, "target": target, "held_out": held_out}


def held_out_error(url: str, rows: list[list[float]], targets: list[float]) -> dict[str, float]:
    """The served model's root-mean-square error on `rows` (one request), and that of answering the
    targets' mean whatever the row: a model that learned nothing does no better than the second."""
    import math

    predictions = post_json(f"{url.rstrip('/')}/predict", {"instances": rows})["predictions"]
    mean = sum(targets) / len(targets)
    return {
        "rmse": math.sqrt(
            sum((p[0] - t) ** 2 for p, t in zip(predictions, targets, strict=True)) / len(targets)
        ),
        "baseline_rmse": math.sqrt(sum((t - mean) ** 2 for t in targets) / len(targets)),
    }


def resolve_source(source: api.ModelSource, field: str, *, runs_dir: Path = RUNS_DIR) -> str:
    """One model on this machine: its `uri`, or the export of a local `rayship run`; `field` names it
    in errors (spec.model, spec.models.<name>)."""
    if source.uri:
        return source.uri
    if source.from_training_schedule is not None:
        raise FileNotFoundError(
            f"{field}.fromTrainingSchedule: a TrainingSchedule's promoted run exists only in a cluster; on this "
            "machine serve a run's model with fromTrainingJob (after `rayship run`) or uri"
        )
    ref = source.from_training_job
    if ref is None:  # the API requires exactly one of uri, fromTrainingJob and fromTrainingSchedule
        raise FileNotFoundError(f"{field}: set uri or fromTrainingJob")
    result_file = (runs_dir / ref.name / "result.json").resolve()
    if not result_file.is_file():
        raise FileNotFoundError(
            f"{field}.fromTrainingJob: TrainingJob {ref.name} has no local run ({result_file} is missing); "
            "train it first with `rayship run -f <its yaml>`"
        )
    key = "model" if ref.checkpoint == "latest" else "bestModel"
    uri = json.loads(result_file.read_text()).get(key)
    if not uri:
        raise FileNotFoundError(f"{field}.fromTrainingJob: the local run of {ref.name} exported no {key}")
    return str(uri)


def resolve_model(ms: api.ModelService | Mapping[str, Any], *, runs_dir: Path = RUNS_DIR) -> str:
    """A ModelService's model on this machine: `model.uri`, or the export of a local `rayship run`.
    `ms` is the model, or a document with at least `spec.model`."""
    source = (
        ms.spec.model
        if isinstance(ms, api.ModelService)
        else api.ModelSource.model_validate(ms["spec"]["model"])
    )
    if source is None:
        raise FileNotFoundError("spec.model: not set (this service serves spec.models)")
    return resolve_source(source, "spec.model", runs_dir=runs_dir)


def resolve_models(ms: api.ModelService, *, runs_dir: Path = RUNS_DIR) -> str | dict[str, str]:
    """What a ModelService serves on this machine: spec.model's URI, or spec.models' (name -> URI)."""
    if ms.spec.models is None:
        return resolve_model(ms, runs_dir=runs_dir)
    return {
        name: resolve_source(source, f"spec.models.{name}", runs_dir=runs_dir)
        for name, source in sorted(ms.spec.models.items())
    }
