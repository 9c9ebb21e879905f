"""Local mode: the same TrainingJob YAML on a laptop's Ray (`rayship run -f`), then serving and
querying the result (`rayship serve`, `make demo`).

Outputs go to `./rayship-runs/<name>/`: `checkpoints/`, `metrics.json`, `loss.png` and
`result.json` ({latest, best, model} URIs; `rayship serve` resolves TrainingJobs through it).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

RUNS_DIR = Path("rayship-runs")


def local_environment() -> None:
    """Ray settings for a single-machine cluster (Ray 2.60 turns token auth on by default)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def private_ray_environment(prefix: str) -> str:
    """A local Ray of one's own (tests, benchmarks): HOME and TMPDIR in a new short directory (Ray's
    socket paths are length-limited), per-process logs; returns that directory."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    local_environment()
    os.environ.update({"HOME": directory, "TMPDIR": directory, "RAY_DEDUP_LOGS": "0"})
    return directory


def localize(doc: dict[str, Any], *, cores: int, has_gpu: bool) -> tuple[dict[str, Any], str]:
    """The spec scaled to this machine, and one line saying what changed."""
    doc = copy.deepcopy(doc)
    workers = doc["spec"]["workers"]
    asked = f"{workers['replicas']} workers x {workers['gpusPerWorker']} GPU"
    changes = []
    if workers["gpusPerWorker"] and not has_gpu:
        workers["gpusPerWorker"] = 0
        changes.append("no GPU here: training on CPU")
    if workers["replicas"] > cores:
        workers["replicas"] = cores
        changes.append(f"capped to {cores} workers (local cores)")
    got = f"{workers['replicas']} {'GPU' if workers['gpusPerWorker'] else 'CPU'} workers"
    return doc, f"local run: {asked} requested -> {got}" + (f" ({'; '.join(changes)})" if changes else "")


def run_dir(doc: dict[str, Any], runs_dir: Path = RUNS_DIR) -> Path:
    return (runs_dir / doc["metadata"]["name"]).resolve()


def init_ray(workers: int) -> None:
    import ray

    local_environment()
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False  # our progress lines say enough
    if not ray.is_initialized():
        # Logical CPUs: one per training worker plus room for Ray Data and Serve tasks.
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, workers + 2),
            include_dashboard=True,  # Ray Train V2 frees stopped runs' workers through its State API
            object_store_memory=256 * 1024 * 1024,
            logging_level="WARNING",
            log_to_driver=False,  # Ray's own chatter; progress is followed from metrics.json instead
        )


def follow(metrics_path: Path, epochs: int, stop: threading.Event) -> None:
    """Print one line per reported epoch, as the progress callback appends to metrics.json."""
    shown = 0
    while not stop.wait(0.5) or shown == 0:
        try:
            history = json.loads(metrics_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or mid-write
            if stop.is_set():
                return
            continue
        for record in history[shown:]:
            loss = record["metrics"].get("loss")
            saved = f"  checkpoint {record['checkpoint']}" if record.get("checkpoint") else ""
            print(
                f"epoch {record['epoch']}/{epochs}  step {record['step']}  loss {loss:.5f}{saved}", flush=True
            )
        shown = len(history)
        if stop.is_set():
            return


def plot_loss(history: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(h["epoch"], h["metrics"]["loss"]) for h in history if "loss" in h.get("metrics", {})]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    ax.set(xlabel="epoch", ylabel="training loss (mean over workers)", title=title, yscale="log")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(doc: dict[str, Any], *, runs_dir: Path = RUNS_DIR) -> dict[str, Any]:
    """Train a resolved TrainingJob on local Ray; returns result.json's content."""
    import torch

    from rayship_workloads import train

    local, notice = localize(doc, cores=os.cpu_count() or 1, has_gpu=torch.cuda.is_available())
    print(notice, flush=True)
    out = run_dir(local, runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    init_ray(local["spec"]["workers"]["replicas"])
    metrics_path = out / "metrics.json"
    metrics_path.unlink(missing_ok=True)
    stop = threading.Event()
    follower = threading.Thread(
        target=follow, args=(metrics_path, local["spec"]["trainer"]["epochs"], stop), daemon=True
    )
    follower.start()
    try:
        outcome = train.train(
            local,
            storage_override=str(out / "checkpoints"),
            metrics_path=str(metrics_path),
            quiet=True,
            echo=False,
        )
    finally:
        stop.set()
        follower.join(timeout=5)
    history = json.loads((out / "metrics.json").read_text())
    plot_loss(history, out / "loss.png", local["metadata"]["name"])
    result = {
        "name": local["metadata"]["name"],
        "latest": outcome.latest,
        "best": outcome.best,
        "model": outcome.model_uri,
        "bestModel": outcome.best_model_uri,
        "metrics": outcome.metrics,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"metrics: {out / 'metrics.json'}  loss curve: {out / 'loss.png'}")
    print(f"model: {outcome.model_uri}", flush=True)
    return result


def post_json(url: str, payload: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def serve(model_uri: str, *, port: int, route_prefix: str = "/", block: bool = True) -> str:
    """Serve an exported model on local Ray; with `block`, until Ctrl-C. Returns the base URL."""
    from ray import serve as ray_serve

    from rayship_workloads import models, storage
    from rayship_workloads.serve import serve_locally

    models.read_manifest(storage.fetch_dir(model_uri))  # a wrong URI fails here, not inside a replica
    init_ray(1)
    url = serve_locally(model_uri, port=port, route_prefix=route_prefix)
    print(
        f"serving {model_uri} at {url}  (POST {url.rstrip('/')}/predict, GET {url.rstrip('/')}/healthz)",
        flush=True,
    )
    if block:
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopping", flush=True)
        finally:
            ray_serve.shutdown()
    return url


def demo(doc: dict[str, Any], *, runs_dir: Path = RUNS_DIR, port: int = 8000) -> dict[str, Any]:
    """The main job end to end: train on local Ray, serve the model, send one prediction, shut down."""
    import ray
    from ray import serve as ray_serve

    from rayship_workloads import data

    result = run(doc, runs_dir=runs_dir)
    try:
        url = serve(result["model"], port=port, route_prefix="/" + doc["metadata"]["name"], block=False)
        config = doc["spec"]["trainer"].get("config") or {}
        # A fresh draw from the function the synthetic training data came from (not a training row).
        x, y = data.synthetic_arrays(1, int(config.get("features", 8)), seed=int(config.get("seed", 0)))
        features, target = [float(v) for v in x[0]], float(y[0])
        answer = post_json(f"{url.rstrip('/')}/predict", {"instances": [features]})
        prediction = answer["predictions"][0][0]
        print(f"POST {url.rstrip('/')}/predict  instances=[[{', '.join(f'{v:.3f}' for v in features)}]]")
        print(f"prediction {prediction:.4f}  (true value {target:.4f})", flush=True)
        return {**result, "url": url, "prediction": prediction, "target": target}
    finally:
        ray_serve.shutdown()
        ray.shutdown()
        print("shut down: Serve and local Ray stopped", flush=True)


def resolve_model(ms: dict[str, Any], *, runs_dir: Path = RUNS_DIR) -> str:
    """A ModelService's model on this machine: `model.uri`, or the export of a local `rayship run`."""
    source = ms["spec"]["model"]
    if source.get("uri"):
        return source["uri"]
    ref = source["fromTrainingJob"]
    result_file = (runs_dir / ref["name"] / "result.json").resolve()
    if not result_file.is_file():
        raise FileNotFoundError(
            f"spec.model.fromTrainingJob: TrainingJob {ref['name']} has no local run ({result_file} is missing); "
            "train it first with `rayship run -f <its yaml>`"
        )
    key = "model" if ref.get("checkpoint", "latest") == "latest" else "bestModel"
    uri = json.loads(result_file.read_text()).get(key)
    if not uri:
        raise FileNotFoundError(
            f"spec.model.fromTrainingJob: the local run of {ref['name']} exported no {key}"
        )
    return uri
