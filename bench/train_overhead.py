"""Training overhead (issue 14, P4): rayship's training path vs a hand-written Ray Train TorchTrainer
on the same model and data, and vs a plain PyTorch loop per core.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/train_overhead.py [--epochs 5] [--samples 8192]
        [--batch 64] [--features 256] [--hidden 2048 1408] [--workers 1 2]
        [--bound-batch 1024] [--bound-samples 32768] [--bound-epochs 5] [--repeats 3]

Questions: how much does the built-in `mlp` recipe (the product: Ray Data shards, DDP, a report and a
signed checkpoint every epoch, the export) cost against the TorchTrainer a user would write by hand
for the same model and rows (goal >= 0.95 steady, >= 0.9 end-to-end), and what does Ray Train DDP give
per core against plain PyTorch (reported; goal >= 0.8 with a compute-bound model)?

Every side trains the same thing: an MLP --features -> --hidden -> 1 (default 256 -> [2048, 1408] -> 1,
3.4M parameters) on `synthetic_tabular(--samples, --features, seed=0)`, batch size --batch per worker,
--epochs epochs, AdamW lr 0.01, float32, CPU. At the default batch of 64 DDP is not compute-bound here:
a step computes for ~28 ms and all-reduces 13.6 MB of gradients between processes that share the same
2 cores, so PyTorch's own DDP (the plain DDP row) gets ~0.5-0.65 per core before any Ray is involved.

Compute-bound configuration (--bound-batch 1024 --bound-samples 32768 --bound-epochs 5; --bound-batch 0
skips it): the baseline, plain DDP, rayship and the hand-written TorchTrainer at the most workers again,
with a batch per worker large enough that a step's compute (~0.2 s) dwarfs its all-reduce: where the
per-core goal (>= 0.8) applies. Five epochs: the steady window (epochs 2..5, ~15 s) is long against the
0.2 s poll its Ray figures are quantized to (+-1.3%; +-2.6% with the three epochs it had). Its table also
splits the CPU used into the training processes' and the rest's (Ray's own processes): on 2 cores every
0.1 core Ray's processes use is 5% less for the workers.

  TorchTrainer  hand-written, as Ray's docs write it: the same Ray Dataset; a train_loop_per_worker
            with prepare_model, the shard's iter_torch_batches (a collate_fn stacking the feature
            columns), and every epoch ray.train.report with a checkpoint (rank 0's torch.save of
            the state_dict); a minimal callback stamps the reports for the clock.

  baseline  One process, torch.set_num_threads(1), no Ray. The same rows (materialized once from the same
            Ray Dataset with `to_pandas()`, before Ray is shut down) as one float32 tensor, sliced into
            batches in order: forward, MSE, backward, AdamW step, loss.item(). Every epoch is timed.
  plain DDP Diagnostic, for every worker count > 1: PyTorch's own DistributedDataParallel without Ray
            or Ray Data, as many processes (spawned, torch.set_num_threads(1)) on loopback gloo, each
            on its contiguous share of the baseline's rows, the same batch size and steps. What DDP
            itself gets per core here: the ceiling any Ray Train run is measured against.
  rayship   The product path unchanged: the sample TrainingJob (manifests/samples/trainingjob-ddp.yaml,
            gpusPerWorker 0) with workers.replicas = 1, then 2, through
            `rayship_workloads.train.train(tj, storage_root=<fresh dir>, callbacks=[ProgressCallback(metrics_path=...)])`
            (what local mode's reporter does, without its terminal lines)
            on a local Ray started once (4 logical CPUs; each worker reserves 1 CPU, Ray runs it with
            one torch thread). Every run gets its own storage directory, so nothing is resumed.

Repeats (--repeats 3): at the most workers (default and compute-bound), rayship and the hand-written
TorchTrainer run --repeats times each, in ABBA order (rayship, hand-written, hand-written, rayship, ...),
each run's figures printed as it ends; their rows take the median of each duration. Runs of the same
configuration here took from 2.9 to 3.55 s per steady epoch (on either side, in 18 runs): with one
run each, the ratio moved by up to 15% between benchmark runs; the order spreads a drift of the
machine's speed over both sides. (A py-spy profile of both sides' workers: the same forward,
backward and optimizer shares; rayship's one systematic extra is its checkpoint, model and optimizer
state saved and signed on rank 0 while rank 1 waits in the report, ~2.5% of the steady time.)

Two figures per configuration (samples = rows processed by all workers together):

  end-to-end  epochs x samples / wall time. Ray: the whole `train.train()` call (dataset creation,
              controller + worker group startup, DDP process group, every epoch with its report and
              checkpoint, and the model export); `ray.init` is excluded (a cluster is already up in
              production). Baseline: all epochs.
  steady      Ray: the product records nothing but epoch/step/loss, and this benchmark changes nothing in
              the product; so a thread in the driver polls metrics.json (every 10 ms) and stamps each new
              record on arrival. steady = (epochs - 1) x samples / (time of last record - time of first
              record): the epochs after the first, with their reports and checkpoints, without startup.
              Baseline: the same epochs (all but the first, the warm-up).

Diagnostic rows (off by default; --diagnostic-poll 0.05): the same Ray runs again in a second Ray
session started with RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05. Ray Train's controller collects reports by
polling the workers every 2 s by default and `ray.train.report` blocks while the previous report is
uncollected, so with short epochs the default rows measure that poll; the diagnostic rows show the cost
of the rest of the path (Ray Data batches, DDP, per-epoch report + checkpoint). Not the product's default.

ratio per core = (samples/s steady / cores used) / (baseline samples/s steady / 1), cores used = the CPUs
the workers reserve (1 per worker). "cores busy" is measured: CPU seconds used by this process and every
process Ray started (psutil over the process tree: GCS, raylet, controller, workers, Ray Data) during the
steady window, divided by its wall time; it shows what the reserved-cores figure leaves out.

Prints tables, then `RESULT train_rayship_over_raytrain_steady=`, `..._e2e=` (rayship / hand-written
TorchTrainer at the most workers), `RESULT train_ddp_over_plain_per_core=` (rayship's steady samples/s
per reserved core / plain PyTorch's, default configuration) and
`RESULT train_ddp_over_plain_per_core_compute_bound=` (the same in the compute-bound configuration);
never fails on a goal. Ray is stopped and the temporary directory
removed on exit.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayship_workloads.local import private_ray_environment

# Not in plain_ddp's ranks: multiprocessing's spawn imports this file in each of them as __mp_main__.
_TMP = private_ray_environment("rb-") if __name__ == "__main__" else ""
if _TMP:  # removed however the run ends (an argument error included), after Ray's own exit hooks
    atexit.register(shutil.rmtree, _TMP, ignore_errors=True)

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402
import ray.train  # noqa: E402
import ray.train.torch  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812
import yaml  # noqa: E402
from ray.train.v2.api.callback import UserCallback  # noqa: E402

from rayship import api  # noqa: E402
from rayship_workloads import data, job, progress, recipes, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "manifests" / "samples" / "trainingjob-ddp.yaml"
SEED, LR = 0, 0.01
GOAL = 0.8  # Ray Train DDP per core / plain PyTorch
GOAL_STEADY, GOAL_E2E = 0.95, 0.9  # rayship / hand-written TorchTrainer
POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
PRODUCT = "rayship (train.train)"  # read by the Ray Train controller actor at startup
HANDWRITTEN = "hand-written TorchTrainer"


@dataclass
class Measurement:
    name: str
    workers: int
    cores: int
    steady: float  # samples/s over the epochs after the first
    end_to_end: float  # samples/s over the whole run
    wall_s: float
    first_epoch_s: float  # from the start to the end of epoch 1 (Ray: arrival of its record)
    epoch_s: float  # mean seconds per epoch in the steady window
    busy_cores: float
    # of busy_cores, what the training processes used (Ray: the train workers; plain: every process);
    # the rest is Ray's own processes (GCS, raylet, controller, Ray Data's actors) and the driver
    worker_cores: float
    loss: float | None


class ReportClock(threading.Thread):
    """Stamps every record the progress callback appends to metrics.json with its arrival time and the
    CPU seconds used so far by this process and all its descendants (the local Ray cluster)."""

    def __init__(self, path: Path, interval_s: float = 0.01):
        super().__init__(daemon=True)
        self.path, self.interval_s = path, interval_s
        # (perf_counter, CPU seconds of the tree, of the train workers in it), one per record
        self.stamps: list[tuple[float, float, float]] = []
        self._done = threading.Event()
        self._seen: tuple[int, int] | None = None

    def run(self) -> None:
        while not self._done.is_set():
            self.poll()
            time.sleep(self.interval_s)
        self.poll()

    def poll(self) -> None:
        try:
            stat = self.path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            if key == self._seen:
                return
            records = json.loads(self.path.read_text())
        except (OSError, ValueError):  # not written yet, or caught mid-write: next poll
            return
        now, (cpu, workers) = time.perf_counter(), tree_cpu_seconds()
        self._seen = key
        while len(self.stamps) < len(records):
            self.stamps.append((now, cpu, workers))

    def stop(self) -> None:
        self._done.set()
        self.join()


def tree_cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process and every live descendant, and of the Ray Train
    workers among them (Ray titles a worker's process `ray::RayTrainWorker...`)."""
    me = psutil.Process()
    total = workers = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times, title = proc.cpu_times(), proc.cmdline()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system
        if title and title[0].startswith("ray::RayTrainWorker"):
            workers += times.user + times.system
    return total, workers


def trainingjob(workers: int, args: argparse.Namespace) -> api.TrainingJob:
    """The sample TrainingJob on CPU with this benchmark's sizes; validated and resolved."""
    doc = yaml.safe_load(SAMPLE.read_text())
    spec = doc["spec"]
    spec["trainer"].update(
        epochs=args.epochs,
        batchSizePerWorker=args.batch,
        learningRate=LR,
        config={"seed": SEED, "features": args.features, "hidden": args.hidden},
    )
    spec["data"] = {"source": "synthetic", "samples": args.samples}
    spec["workers"].update(replicas=workers, gpusPerWorker=0, cpusPerWorker=1)
    return job.load_trainingjob(json.dumps(doc))


def materialize(samples: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows the Ray runs train on, from the same Ray Dataset, as (x [n, features], y [n, 1])."""
    frame = data.synthetic_tabular(samples, features, SEED).to_pandas()
    columns = [f"x{j}" for j in range(features)]
    x = torch.from_numpy(frame[columns].to_numpy(dtype="float32"))
    y = torch.from_numpy(frame[data.LABEL].to_numpy(dtype="float32")).unsqueeze(1)
    return x, y


def timed_epochs(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace
) -> tuple[float, list[float], list[float], float]:
    """The plain loop (baseline and plain DDP): every epoch over (x, y) in order, batches of --batch:
    forward, MSE, backward, AdamW step, loss.item(). Returns (start, each epoch's end, CPU seconds at
    the start and after each epoch, the last epoch's mean loss)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    ends: list[float] = []
    cpu = [time.process_time()]
    start, loss_mean = time.perf_counter(), 0.0
    for _ in range(args.epochs):
        total, batches = 0.0, 0
        for i in range(0, x.shape[0], args.batch):
            loss = F.mse_loss(model(x[i : i + args.batch]), y[i : i + args.batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        loss_mean = total / max(batches, 1)
        ends.append(time.perf_counter())
        cpu.append(time.process_time())
    return start, ends, cpu, loss_mean


def baseline(x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace) -> Measurement:
    """Plain PyTorch, one process, one thread: the same model, optimizer, batches and epochs."""
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = recipes.build_mlp(recipes.mlp_config(args.features, {"hidden": args.hidden}))
    start, ends, cpu, loss_mean = timed_epochs(model, x, y, args)
    n = x.shape[0]
    wall = ends[-1] - start
    window = ends[-1] - ends[0]
    steady = (args.epochs - 1) * n / window if args.epochs > 1 else n / wall
    return Measurement(
        name="plain PyTorch (baseline)",
        workers=1,
        cores=1,
        steady=steady,
        end_to_end=args.epochs * n / wall,
        wall_s=wall,
        first_epoch_s=ends[0] - start,
        epoch_s=window / max(args.epochs - 1, 1),
        busy_cores=(busy := (cpu[-1] - cpu[1]) / window if args.epochs > 1 else (cpu[-1] - cpu[0]) / wall),
        worker_cores=busy,
        loss=loss_mean,
    )


def _ddp_rank(
    rank: int, world: int, port: int, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, out: Any
) -> None:
    """One rank of `plain_ddp` (a spawned process): its contiguous share of the rows, one torch thread."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(SEED)
        model = DistributedDataParallel(
            recipes.build_mlp(recipes.mlp_config(args.features, {"hidden": args.hidden}))
        )
        share = x.shape[0] // world
        dist.barrier()
        start, ends, cpu, loss_mean = timed_epochs(
            model, x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share], args
        )
        out.put((rank, start, ends, cpu[1], cpu[-1], loss_mean))
    finally:
        dist.destroy_process_group()


def plain_ddp(x: torch.Tensor, y: torch.Tensor, workers: int, args: argparse.Namespace) -> Measurement:
    """Diagnostic: PyTorch's own DDP without Ray or Ray Data: `workers` processes (spawned, one torch
    thread each) on loopback gloo, each on its contiguous share of the same rows, the same batches and
    steps as the baseline. It shows what DDP itself gets per core on this machine."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    procs = [
        context.Process(target=_ddp_rank, args=(rank, workers, port, x, y, args, out))
        for rank in range(workers)
    ]
    for proc in procs:
        proc.start()
    reports = sorted(out.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a plain DDP rank exited with {proc.exitcode}")
    _, start, ends, _, _, loss = reports[0]
    window = ends[-1] - ends[0]
    cpu = sum(r[4] - r[3] for r in reports)  # every rank's CPU in the epochs after the first
    rows = x.shape[0] // workers * workers  # the rows the ranks' shares cover together
    return Measurement(
        name="plain PyTorch DDP, no Ray (diagnostic)",
        workers=workers,
        cores=workers,
        steady=(args.epochs - 1) * rows / window,
        end_to_end=args.epochs * rows / (ends[-1] - start),
        wall_s=ends[-1] - start,
        first_epoch_s=ends[0] - start,
        epoch_s=window / max(args.epochs - 1, 1),
        busy_cores=cpu / window,
        worker_cores=cpu / window,
        loss=loss,
    )


def measured(
    name: str, workers: int, args: argparse.Namespace, fit: Callable[[Path, Path], float | None]
) -> Measurement:
    """Time `fit(run_dir, metrics_path)` (a training run that appends a record per report to
    metrics_path; it returns the final loss) from outside, each record stamped on arrival."""
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=_TMP or None))  # imported: the system's
    metrics = run_dir / "metrics.json"
    clock = ReportClock(metrics)
    clock.start()
    start = time.perf_counter()
    try:
        loss = fit(run_dir, metrics)
    finally:
        wall = time.perf_counter() - start
        clock.stop()
    stamps = clock.stamps
    if len(stamps) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} records in {metrics}, saw {len(stamps)}")
    (t_first, cpu_first, workers_first), (t_last, cpu_last, workers_last) = stamps[0], stamps[-1]
    window = t_last - t_first
    return Measurement(
        name=name,
        workers=workers,
        cores=workers,
        steady=(args.epochs - 1) * args.samples / window if window > 0 else float("nan"),
        end_to_end=args.epochs * args.samples / wall,
        wall_s=wall,
        first_epoch_s=t_first - start,
        epoch_s=window / max(args.epochs - 1, 1),
        busy_cores=(cpu_last - cpu_first) / window if window > 0 else float("nan"),
        worker_cores=(workers_last - workers_first) / window if window > 0 else float("nan"),
        loss=loss,
    )


def pooled(runs: list[Measurement], args: argparse.Namespace) -> Measurement:
    """Runs of one configuration as one row: the median of each duration (the rates are the median
    run's: one run in a slow spell of the machine moves it little) and of each core count."""

    def median(field: Callable[[Measurement], float]) -> float:
        return statistics.median(field(m) for m in runs)

    epoch_s, wall = median(lambda m: m.epoch_s), median(lambda m: m.wall_s)
    first = runs[0]
    return Measurement(
        name=first.name,
        workers=first.workers,
        cores=first.cores,
        steady=args.samples / epoch_s,
        end_to_end=args.epochs * args.samples / wall,
        wall_s=wall,
        first_epoch_s=median(lambda m: m.first_epoch_s),
        epoch_s=epoch_s,
        busy_cores=median(lambda m: m.busy_cores),
        worker_cores=median(lambda m: m.worker_cores),
        loss=first.loss,
    )


def paired(workers: int, args: argparse.Namespace, label: str = "") -> list[Measurement]:
    """rayship and the hand-written TorchTrainer, `args.repeats` runs each in ABBA order (a drift of
    the machine's speed during the runs falls on both alike): each configuration's pooled row."""
    runs: dict[str, list[Measurement]] = {PRODUCT: [], HANDWRITTEN: []}
    order = [PRODUCT, HANDWRITTEN]
    for i in range(args.repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            print(
                f"{label}{name}: {workers} worker(s), {args.epochs} epochs, run {len(runs[name]) + 1} ...",
                flush=True,
            )
            m = ray_train(workers, args, name) if name == PRODUCT else handwritten(workers, args)
            runs[name].append(m)
            print(
                f"  steady {m.steady:,.0f} samples/s ({m.epoch_s:.3f} s/epoch), end-to-end {m.end_to_end:,.0f}",
                flush=True,
            )
    return [pooled(runs[name], args) for name in order]


def final_loss(metrics: dict[str, Any] | None) -> float | None:
    loss = (metrics or {}).get("loss")
    return float(loss) if isinstance(loss, int | float) else None


def ray_train(workers: int, args: argparse.Namespace, name: str) -> Measurement:
    """One run of the product path (what local mode's reporter does, without its terminal lines)."""
    doc = trainingjob(workers, args)

    def fit(run_dir: Path, metrics: Path) -> float | None:
        root = str(run_dir / "store")
        callback = progress.ProgressCallback(
            epochs=args.epochs, storage_root=root, metrics_path=str(metrics), echo=False
        )
        return final_loss(train.train(doc, storage_root=root, callbacks=[callback], quiet=True).metrics)

    return measured(name, workers, args, fit)


class Stamp(UserCallback):
    """The hand-written run's only extra: each report's metrics appended to a metrics.json-like list,
    so the same `ReportClock` stamps its arrival."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.records.append(dict(metrics[0]))
        Path(self.path).write_text(json.dumps(self.records))


def handwritten_loop(config: dict[str, Any]) -> None:
    """A user's own train_loop_per_worker for the same MLP and rows (Ray's docs' shape)."""
    features, batch_size = [f"x{j}" for j in range(config["features"])], config["batch"]

    def collate(batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        x = np.stack([batch[c] for c in features], axis=1).astype(np.float32, copy=False)
        return torch.from_numpy(x), torch.from_numpy(batch[data.LABEL].astype(np.float32)).unsqueeze(1)

    torch.manual_seed(SEED)
    model = ray.train.torch.prepare_model(recipes.MLP(config["features"], config["hidden"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    shard = ray.train.get_dataset_shard("train")
    for epoch in range(1, config["epochs"] + 1):
        total, batches = 0.0, 0
        for x, y in shard.iter_torch_batches(batch_size=batch_size, collate_fn=collate):
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save(getattr(model, "module", model).state_dict(), Path(tmp) / "model.pt")
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": epoch, "loss": total / max(batches, 1)}, checkpoint=checkpoint)


def handwritten(workers: int, args: argparse.Namespace) -> Measurement:
    """The hand-written TorchTrainer on the same data, timed like `ray_train` (dataset creation
    included in end-to-end, as rayship's is)."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def fit(run_dir: Path, metrics: Path) -> float | None:
        trainer = TorchTrainer(
            handwritten_loop,
            train_loop_config={
                "features": args.features,
                "hidden": args.hidden,
                "batch": args.batch,
                "epochs": args.epochs,
            },
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(
                name="handwritten",
                storage_path=str(run_dir / "store"),
                checkpoint_config=CheckpointConfig(num_to_keep=3),
                callbacks=[Stamp(str(metrics))],
            ),
            datasets={"train": data.synthetic_tabular(args.samples, args.features, SEED)},
        )
        return final_loss(trainer.fit().metrics)

    return measured(HANDWRITTEN, workers, args, fit)


def start_ray() -> None:
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        log_to_driver=False,
    )
    for name in ("ray", "ray.data", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False


def health_check_interval_s() -> float:
    """How often the Ray Train controller polls the workers (and so collects reports), in seconds."""
    try:
        from ray.train.v2._internal.constants import DEFAULT_HEALTH_CHECK_INTERVAL_S
    except ImportError:  # a Ray without this private module: its documented default
        return 2.0
    return float(os.environ.get(POLL_ENV, DEFAULT_HEALTH_CHECK_INTERVAL_S))


def per_core(m: Measurement, base: Measurement) -> float:
    """Steady samples/s per reserved core, over the baseline's (one core)."""
    return m.steady / m.cores / base.steady


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "-+-".join("-" * w for w in widths)
    body = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, rule, *body])


def parameters(args: argparse.Namespace) -> int:
    return sum(p.numel() for p in recipes.MLP(args.features, args.hidden).parameters())


def results_lines(results: list[Measurement], args: argparse.Namespace) -> list[str]:
    """The RESULT lines: rayship / hand-written TorchTrainer at the most workers of the default
    session, and rayship's steady samples/s per core / plain PyTorch's."""
    base = results[0]
    most = max(args.workers)
    ours = next(m for m in results if m.name == PRODUCT and m.workers == most)
    theirs = next(m for m in results if m.name == HANDWRITTEN and m.workers == most)
    return [
        f"RESULT train_rayship_over_raytrain_steady={ours.steady / theirs.steady:.3f}",
        f"RESULT train_rayship_over_raytrain_e2e={ours.end_to_end / theirs.end_to_end:.3f}",
        f"RESULT train_ddp_over_plain_per_core={per_core(ours, base):.3f}",
    ]


def report(results: list[Measurement], args: argparse.Namespace, poll_s: float) -> None:
    base = results[0]
    ratios = [per_core(m, base) for m in results]
    print(
        f"\nsamples={args.samples}  epochs={args.epochs}  batch/worker={args.batch}  "
        f"MLP {args.features}->{args.hidden}->1 ({parameters(args):,} parameters)  AdamW lr={LR}  seed={SEED}  "
        f"host: {os.cpu_count()} cores, torch {torch.__version__}, ray {ray.__version__}\n"
    )
    print(
        table(
            [
                "config",
                "workers",
                "cores used",
                "samples/s (steady)",
                "samples/s (end-to-end)",
                "ratio vs baseline per core",
                f"goal met? (>= {GOAL})",
            ],
            [
                [
                    m.name,
                    str(m.workers),
                    str(m.cores),
                    f"{m.steady:,.0f}",
                    f"{m.end_to_end:,.0f}",
                    f"{r:.2f}" + (" (ref)" if i == 0 else ""),
                    "-" if i == 0 else ("yes" if r >= GOAL else "no"),
                ]
                for i, (m, r) in enumerate(zip(results, ratios, strict=True))
            ],
        )
    )
    print("\nBreakdown")
    print(
        table(
            [
                "config",
                "workers",
                "wall s",
                "start -> epoch 1 s",
                "s/epoch (steady)",
                "cores busy (measured)",
                "ratio per busy core",
                "ratio per core (end-to-end)",
                "final loss",
            ],
            [
                [
                    m.name,
                    str(m.workers),
                    f"{m.wall_s:.2f}",
                    f"{m.first_epoch_s:.2f}",
                    f"{m.epoch_s:.3f}",
                    f"{m.busy_cores:.2f}",
                    f"{m.steady / m.busy_cores / (base.steady / base.busy_cores):.2f}",
                    f"{m.end_to_end / m.cores / base.end_to_end:.2f}",
                    "-" if m.loss is None else f"{m.loss:.4f}",
                ]
                for m in results
            ],
        )
    )
    print(
        "\nMethod: steady = epochs 2..E (Ray: between the arrivals of the first and last metrics.json "
        "records,\n  polled every 10 ms; baseline: after the warm-up epoch). end-to-end = all epochs over "
        "the wall time\n  (Ray: the whole train.train() call incl. worker-group startup and export; "
        "ray.init excluded).\n  cores used = CPUs reserved by the workers; cores busy = CPU seconds of the "
        "whole Ray process tree\n  (or the baseline process) in the steady window / its wall time."
    )
    print(
        f"Note: Ray Train's controller collects reports by polling the workers every {poll_s:g} s "
        f"({POLL_ENV})\n  and a worker holds at most one unconsumed report (ray.train.report blocks "
        f"until it is taken), so\n  reporting every epoch caps a run near one epoch per {poll_s:g} s: "
        f"here about {args.samples / poll_s:,.0f} samples/s in total,\n  whatever the compute speed. "
        "Longer epochs (more --samples) amortize it.\n  Record arrival times are quantized to that poll, "
        f"so a Ray steady figure is uncertain by up to {poll_s:g} s over its {args.epochs - 1}-epoch window."
    )
    if args.diagnostic_poll > 0:
        print(
            f"  The 'poll {args.diagnostic_poll:g} s' rows are a diagnostic, not the product's default: "
            f"the same runs in a\n  second Ray session started with {POLL_ENV}={args.diagnostic_poll:g}, "
            "to show the cost of the rest\n  of the path (Ray Data batches, DDP all-reduce, per-epoch "
            "report + checkpoint) without the cap."
        )


def report_bound(rows: list[Measurement], bound: argparse.Namespace) -> None:
    """The compute-bound configuration: baseline, plain DDP, rayship and TorchTrainer at the most workers."""
    base = rows[0]
    print(
        f"\nCompute-bound configuration: batch/worker={bound.batch}  samples={bound.samples}  "
        f"epochs={bound.epochs} (steady: epochs 2..{bound.epochs})"
    )
    print(
        table(
            [
                "config",
                "workers",
                "samples/s (steady)",
                "s/epoch",
                "cores busy",
                "training processes",
                "the rest",
                "ratio per core",
                "ratio per training core busy",
                f"goal (>= {GOAL})",
            ],
            [
                [
                    m.name,
                    str(m.workers),
                    f"{m.steady:,.0f}",
                    f"{m.epoch_s:.2f}",
                    f"{m.busy_cores:.2f}",
                    f"{m.worker_cores:.2f}",
                    f"{m.busy_cores - m.worker_cores:.2f}",
                    f"{r:.2f}" + (" (ref)" if i == 0 else ""),
                    f"{m.steady / m.worker_cores / (base.steady / base.worker_cores):.2f}",
                    "-" if i == 0 else ("yes" if r >= GOAL else "no"),
                ]
                for i, (m, r) in enumerate((m, per_core(m, base)) for m in rows)
            ],
        )
    )
    print(
        "  cores busy = CPU seconds / wall seconds in the steady window; training processes = the baseline's\n"
        "  process, plain DDP's ranks, Ray's train workers; the rest = every other process of the tree (Ray:\n"
        "  GCS, raylet, the train controller, Ray Data's actors, this driver). On 2 cores the rest is taken\n"
        "  from the workers: 'ratio per training core busy' is the training processes' own efficiency."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs per run (>= 2; default 5)")
    parser.add_argument("--samples", type=int, default=8192, help="rows of synthetic data (default 8192)")
    parser.add_argument("--batch", type=int, default=64, help="batch size per worker (default 64)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="Ray Train worker counts (default 1 2)"
    )
    parser.add_argument("--features", type=int, default=256, help="input features (default 256)")
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=[2048, 1408], help="hidden layer sizes (default 2048 1408)"
    )
    parser.add_argument(
        "--bound-batch", type=int, default=1024, help="batch per worker, compute-bound rows (0: skip them)"
    )
    parser.add_argument("--bound-samples", type=int, default=32768, help="rows, compute-bound rows")
    parser.add_argument("--bound-epochs", type=int, default=5, help="epochs, compute-bound rows (>= 2)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs each of rayship and the hand-written TorchTrainer at the most workers, in ABBA order "
        "(default 3; their rows take the median run)",
    )
    parser.add_argument(
        "--diagnostic-poll",
        type=float,
        default=0.0,
        help=f"rerun the Ray configurations with {POLL_ENV} set to this (seconds; default 0: skip)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.epochs < 2 or (args.bound_batch and args.bound_epochs < 2):
        parser.error(
            "--epochs and --bound-epochs must be >= 2 (the steady figure leaves the first epoch out)"
        )
    bound = argparse.Namespace(
        **{
            **vars(args),
            "batch": args.bound_batch,
            "samples": args.bound_samples,
            "epochs": args.bound_epochs,
        }
    )
    most = max(args.workers)
    if args.bound_batch < 0 or (args.bound_batch and args.bound_samples < args.bound_batch * most):
        parser.error(
            f"--bound-samples must give each of the {most} workers at least one --bound-batch "
            "(and --bound-batch must be >= 0; 0 skips the compute-bound rows)"
        )
    began = time.perf_counter()
    poll_s = health_check_interval_s()
    sessions = [(None, PRODUCT)]
    if args.diagnostic_poll > 0:
        sessions.append((args.diagnostic_poll, f"Ray Train DDP, poll {args.diagnostic_poll:g} s"))
    try:
        start_ray()
        x, y = materialize(args.samples, args.features)
        if args.bound_batch:
            bx, by = materialize(args.bound_samples, args.features)
        ray.shutdown()  # the baselines run with no Ray processes around
        print(f"baseline: plain PyTorch, {args.epochs} epochs ...", flush=True)
        results = [baseline(x, y, args)]
        for workers in (w for w in args.workers if w > 1):
            print(f"plain PyTorch DDP (no Ray): {workers} processes ...", flush=True)
            results.append(plain_ddp(x, y, workers, args))
        bound_rows: list[Measurement] = []
        if args.bound_batch:
            print(f"compute-bound (batch {args.bound_batch}): plain PyTorch, plain DDP ...", flush=True)
            bound_rows = [baseline(bx, by, bound), plain_ddp(bx, by, most, bound)]
            del bx, by
        for poll, name in sessions:
            if poll is not None:
                ray.shutdown()
                os.environ[POLL_ENV] = f"{poll:g}"  # inherited by the raylet and the controller actor
            start_ray()
            for workers in args.workers:
                if poll is None and workers == most:
                    results.extend(paired(workers, args))
                    continue
                print(f"{name}: {workers} worker(s), {args.epochs} epochs ...", flush=True)
                results.append(ray_train(workers, args, name))
                if poll is None:
                    print(f"{HANDWRITTEN}: {workers} worker(s) ...", flush=True)
                    results.append(handwritten(workers, args))
            if poll is None and args.bound_batch:
                bound_rows.extend(paired(most, bound, f"compute-bound (batch {args.bound_batch}): "))
        report(results, args, poll_s)
        if bound_rows:
            report_bound(bound_rows, bound)
        print(f"\n(benchmark took {time.perf_counter() - began:.0f} s)")
        print("\n".join(results_lines(results, args)))
        if bound_rows:
            ours = next(m for m in bound_rows if m.name == PRODUCT)
            print(f"RESULT train_ddp_over_plain_per_core_compute_bound={per_core(ours, bound_rows[0]):.3f}")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
