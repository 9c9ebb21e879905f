"""Serve throughput on loopback: batched Serve vs the raw forward pass vs unbatched Serve.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/serve_throughput.py [--requests 400] [--clients 32]

Starts its own local Ray (4 logical CPUs, token auth off, no dashboard), serves an MLP exported as
`rayship train` exports one (by default issue 14's: in_features=256, hidden=[2048] x 6, 21.5M
parameters, a forward of one row ~6 ms on one core; `--in-features`/`--hidden` for others, e.g. the
demo's 8 and 64,64) with `rayship_workloads.serve.serve_locally`, and drives it with
`--clients` closed-loop HTTP clients (threads, keep-alive connections) until `--requests` requests are
answered. Prints req/s, rows/s and p50/p99 latency for:

    (a) Serve with batching (max_batch_size = --clients)
    (b) the raw model forward in this process at batch size --clients x --rows: the limit (rows/s)
    (c) Serve with max_batch_size=1 (no batching), as `app_builder` configures it
    (c') the same with (a)'s max_ongoing_requests, so that batching is the only difference

and the ratios against the goals (a >= 0.5x the limit in rows/s, a >= 2x unbatched in req/s). It reports
whether the goals are met; it never fails on them. Nothing is downloaded; Ray is stopped on exit.

The model matters: the ratio (a)/(b) compares Serve's per-request cost (HTTP, proxy, replica, JSON)
with the forward pass. With the demo MLP a forward of 32 rows takes ~20 us, so (a)/(b) measures
nothing but that per-request cost (it printed 0.0004); the issue's figure is for a model whose forward
is a real share of the work.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shutil
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rayship_workloads.local import private_ray_environment

_TMP = private_ray_environment("rs-bench-")

import psutil  # noqa: E402
import ray  # noqa: E402  (after the environment above)
import torch  # noqa: E402
from ray import serve  # noqa: E402

from rayship.api import ServeArgs  # noqa: E402
from rayship_workloads import models, recipes  # noqa: E402
from rayship_workloads.serve import APP_NAME, model_deployment, serve_locally  # noqa: E402

ISSUE_MODEL = (256, [2048] * 6)  # issue 14's MLP: 21.5M parameters


@dataclass
class Result:
    name: str
    requests_per_s: float
    rows_per_s: float
    p50_ms: float
    p99_ms: float
    note: str = ""
    cpu_ms_per_request: dict[str, float] | None = None  # process group -> CPU ms per request


def process_group(proc: psutil.Process) -> str:
    """Which part of the serving path a process is: Serve's proxy, the replica, the clients, Ray's own."""
    if proc.pid == os.getpid():
        return "clients (this process)"
    title = " ".join(proc.cmdline()) or proc.name()
    for needle, group in (
        ("ProxyActor", "proxy"),
        ("ServeReplica", "replica"),
        ("ServeController", "serve controller"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs"),
    ):
        if needle in title:
            return group
    return "other Ray processes"


def cpu_by_group() -> dict[str, float]:
    """User + system CPU seconds of this process and each live descendant, summed per process_group."""
    me = psutil.Process()
    totals: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            group = process_group(proc)
        except psutil.Error:  # exited meanwhile
            continue
        totals[group] = totals.get(group, 0.0) + times.user + times.system
    return totals


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load(base_url: str, total: int, clients: int, rows: int, features: int) -> tuple[float, list[float]]:
    """Closed loop: `clients` threads send /predict until `total` requests are answered.
    Returns (elapsed seconds, per-request latencies in seconds)."""
    host_port = base_url.removeprefix("http://").split("/", 1)[0]
    path = base_url.removeprefix(f"http://{host_port}") + "/predict"
    body = json.dumps({"instances": [[0.25] * features] * rows}).encode()
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    remaining = [total]
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        connection = http.client.HTTPConnection(host_port, timeout=60)
        try:
            while True:
                with lock:
                    if remaining[0] == 0:
                        return
                    remaining[0] -= 1
                start = time.perf_counter()
                connection.request("POST", path, body, headers)
                response = connection.getresponse()
                payload = response.read()
                elapsed = time.perf_counter() - start
                if response.status != 200:
                    errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                    return
                with lock:
                    latencies.append(elapsed)
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed; first: {errors[0]}")
    return elapsed, latencies


def deploy(
    model_dir: Path, port: int, args: argparse.Namespace, max_batch_size: int, max_ongoing: int | None
) -> str:
    """Deploy the app; `max_ongoing` overrides the per-replica concurrency `app_builder` derives."""
    if max_ongoing is None:
        return serve_locally(
            str(model_dir),
            port=port,
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=args.batch_wait_timeout_s,
        )
    config = ServeArgs(
        model_uri=str(model_dir),
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=args.batch_wait_timeout_s,
    )
    app = model_deployment.options(max_ongoing_requests=max_ongoing, ray_actor_options={"num_cpus": 1}).bind(
        config
    )
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://127.0.0.1:{port}"


def bench_serve(
    name: str,
    model_dir: Path,
    port: int,
    args: argparse.Namespace,
    max_batch_size: int,
    max_ongoing: int | None = None,
) -> Result:
    url = deploy(model_dir, port, args, max_batch_size, max_ongoing)
    try:
        load(url, 4 * args.clients, args.clients, args.rows, args.in_features)  # warm-up
        before = batch_sizes(url)
        cpu_before = cpu_by_group()
        elapsed, latencies = load(url, args.requests, args.clients, args.rows, args.in_features)
        cpu_after = cpu_by_group()
        after = batch_sizes(url)
    finally:
        serve.delete(APP_NAME)
    batches = after[len(before) :]
    concurrency = max_ongoing or ServeArgs(model_uri="-", max_batch_size=max_batch_size).max_ongoing_requests
    note = f"max_ongoing_requests {concurrency}"
    if batches:
        note += f"; batches: mean {statistics.mean(batches):.1f} / max {max(batches)} requests"
    return Result(
        name,
        args.requests / elapsed,
        args.requests * args.rows / elapsed,
        1000 * percentile(latencies, 0.5),
        1000 * percentile(latencies, 0.99),
        note,
        {g: 1000 * (cpu_after[g] - cpu_before.get(g, 0.0)) / args.requests for g in cpu_after},
    )


def batch_sizes(base_url: str) -> list[int]:
    """The replica's recent batch sizes (GET /stats)."""
    host_port = base_url.removeprefix("http://").split("/", 1)[0]
    connection = http.client.HTTPConnection(host_port, timeout=30)
    try:
        connection.request("GET", base_url.removeprefix(f"http://{host_port}") + "/stats")
        return list(json.loads(connection.getresponse().read())["batch_sizes"])
    finally:
        connection.close()


def bench_forward(model: torch.nn.Module, args: argparse.Namespace) -> Result:
    """The limit: forward passes over batches of clients x rows rows, in process, one thread."""
    batch = torch.full((args.clients * args.rows, args.in_features), 0.25)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a replica has num_cpus=1
    try:
        times: list[float] = []
        with torch.no_grad():
            for _ in range(5):
                model(batch)
            deadline = time.perf_counter() + 5  # at least 20 passes, at most ~5 s of them
            while len(times) < 20 or (len(times) < 1000 and time.perf_counter() < deadline):
                start = time.perf_counter()
                model(batch)
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    per_forward = statistics.mean(times)
    return Result(
        f"(b) raw forward, batch {len(batch)}",
        1 / per_forward,
        len(batch) / per_forward,
        1000 * percentile(times, 0.5),
        1000 * percentile(times, 0.99),
        "req/s column: forward passes/s",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400, help="requests per Serve variant")
    parser.add_argument(
        "--clients", type=int, default=32, help="concurrent HTTP clients (the issue's figures: 32)"
    )
    parser.add_argument("--rows", type=int, default=1, help="rows per request")
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    parser.add_argument("--in-features", type=int, default=ISSUE_MODEL[0])
    parser.add_argument(
        "--hidden",
        type=lambda text: [int(size) for size in text.split(",")],
        default=ISSUE_MODEL[1],
        help="hidden layer sizes, comma-separated (default: 2048 x 6)",
    )
    args = parser.parse_args()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    torch.manual_seed(0)
    model = recipes.MLP(args.in_features, args.hidden).eval()
    parameters = sum(p.numel() for p in model.parameters())
    setup = recipes.ModelSetup({"in_features": args.in_features, "hidden": args.hidden})
    model_dir = models.export(Path(_TMP) / "model", "mlp", setup, model.state_dict())
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        log_to_driver=False,
    )
    try:
        port = free_port()
        batched = bench_serve(
            f"(a) serve, max_batch_size={args.clients}", model_dir, port, args, args.clients
        )
        unbatched = bench_serve("(c) serve, max_batch_size=1", model_dir, port, args, 1)
        same_concurrency = ServeArgs(model_uri="-", max_batch_size=args.clients).max_ongoing_requests
        unbatched_fair = bench_serve(
            "(c') serve, max_batch_size=1, = (a) conc.",
            model_dir,
            port,
            args,
            1,
            max_ongoing=same_concurrency,
        )
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(_TMP, ignore_errors=True)
    limit = bench_forward(model, args)
    serves = (batched, unbatched, unbatched_fair)

    print(
        f"\nMLP in={args.in_features} hidden={args.hidden} ({parameters / 1e6:.1f}M parameters); {args.clients} clients, {args.requests} requests/variant, "
        f"{args.rows} row(s)/request, batch_wait_timeout_s={args.batch_wait_timeout_s}, loopback, "
        f"{os.cpu_count()} cores"
    )
    print(f"{'variant':42} {'req/s':>10} {'rows/s':>12} {'p50 ms':>8} {'p99 ms':>8}  notes")
    for r in (batched, limit, unbatched, unbatched_fair):
        print(
            f"{r.name:42} {r.requests_per_s:10.1f} {r.rows_per_s:12.1f} {r.p50_ms:8.2f} {r.p99_ms:8.2f}  {r.note}"
        )
    groups = sorted({g for r in serves for g in r.cpu_ms_per_request or {}})
    print("\nCPU ms per request, by process, while each variant ran (psutil; 2 cores = 2000 ms per s):")
    print(f"{'variant':42} " + " ".join(f"{g[:12]:>12}" for g in groups) + f" {'total':>8}")
    for r in serves:
        used = r.cpu_ms_per_request or {}
        print(
            f"{r.name:42} "
            + " ".join(f"{used.get(g, 0.0):12.2f}" for g in groups)
            + f" {sum(used.values()):8.2f}"
        )
    of_limit = batched.rows_per_s / limit.rows_per_s
    print(f"(a)/(b)  rows/s: {of_limit:8.4f}x  goal >= 0.5x: {'met' if of_limit >= 0.5 else 'NOT met'}")
    for label, other in (("(a)/(c) ", unbatched), ("(a)/(c')", unbatched_fair)):
        ratio = batched.requests_per_s / other.requests_per_s
        print(f"{label} req/s:  {ratio:8.2f}x  goal >= 2x:   {'met' if ratio >= 2 else 'NOT met'}")
    # One line per figure; against the fair unbatched variant (c'), same max_ongoing_requests as (a).
    fair = batched.requests_per_s / unbatched_fair.requests_per_s
    print(f"RESULT serve_batched_over_raw_rows_{args.clients}={of_limit:.4f}")
    print(f"RESULT serve_batched_over_unbatched_{args.clients}={fair:.4f}")


if __name__ == "__main__":
    main()
