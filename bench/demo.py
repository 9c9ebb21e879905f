"""`rayship demo` wall time, and nothing left behind.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/demo.py [--runs 1] [--file manifests/samples/trainingjob-ddp.yaml]

Runs `rayship demo -f FILE` (`python -m rayship.cli demo`, what `make demo` runs after its render check) as a
user does, `--runs` times, each in a fresh HOME and TMPDIR (so Ray's session directory, sockets and
caches are new, as on a fresh machine) with its own runs directory and a free port. Each run is timed
from the start of the command to its exit; every line of its output is stamped on arrival, so the table
splits the wall time into phases (start -> the `local run:` line -> each epoch -> `model:` -> `serving`
-> `prediction` -> `shut down` -> exit).

Afterwards it checks that no process the demo started is still alive: every process started for the run
inherits a marker environment variable (RAYSHIP_BENCH_DEMO=<random>), found again in /proc/<pid>/environ
whatever became of its parent or session; also counted are processes still in the command's own session
(it is started with a new one). Leftovers are listed, then stopped (SIGKILL, by pid: they are this run's).

Beside it, in the same way (fresh HOME, timed from start to exit), Ray's own floor for the same shape
of work with nothing of rayship's: local Ray started, a Ray Train run of 2 CPU workers that report 5
times and train nothing, Serve started with a one-line deployment, one request, Ray stopped (`FLOOR`).

Prints a table per run, then `RESULT demo_s=<median wall seconds>`, `RESULT ray_floor_s=<median>` and
`RESULT demo_over_floor=<their ratio>`; exits 1 if a run fails or leaves processes behind. The goal
(issue 56): the demo <= 30 s after setup, and nothing left.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 30.0
# Ray's floor: the demo's shape (local Ray, 2 training workers reporting 5 epochs, Serve, one request,
# shut down) with no data, model, checkpoint or rayship code.
FLOOR = """
import json, socket, urllib.request
import ray, ray.train
from ray import serve
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

ray.init(address="local", include_dashboard=True, log_to_driver=False)

def loop(config):
    for epoch in range(5):
        ray.train.report({"epoch": epoch + 1})

TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()

@serve.deployment
class Echo:
    async def __call__(self, request):
        return {"predictions": [[0.0]]}

with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
serve.start(http_options={"host": "127.0.0.1", "port": port})
serve.run(Echo.bind(), route_prefix="/floor")
body = json.dumps({"instances": [[0.0]]}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{port}/floor", data=body, method="POST")
print(urllib.request.urlopen(request, timeout=60).read().decode())
ray.shutdown()
"""
MARKER = "RAYSHIP_BENCH_DEMO"
LINGER_S = 5.0  # how long processes may take to exit after the command has returned
# (phase label, prefix of the output line that ends it)
MILESTONES = (
    ("startup until training starts", "local run:"),
    ("epoch 1 (data, workers, DDP)", "epoch 1/"),
    ("epoch 2", "epoch 2/"),
    ("epoch 3", "epoch 3/"),
    ("epoch 4", "epoch 4/"),
    ("epoch 5", "epoch 5/"),
    ("run end, export, plot", "model:"),
    ("serve start + deploy", "serving "),
    ("one prediction", "prediction "),
    ("Serve + Ray shutdown", "shut down:"),
)


@dataclass
class Run:
    wall_s: float
    returncode: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def marked_processes(token: str, session: int) -> dict[int, str]:
    """pid -> command line of every live process with our marker in its environment or in `session`."""
    needle = f"{MARKER}={token}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            marked = needle in (entry / "environ").read_bytes().split(b"\0")
            in_session = os.getsid(pid) == session
            if marked or in_session:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie holds nothing but its pid
                    continue
                found[pid] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
                )
        except (FileNotFoundError, ProcessLookupError, PermissionError):  # gone meanwhile, or not ours
            continue
    return found


def run_floor(timeout_s: float) -> Run:
    """Ray's floor (`FLOOR`), run as the demo is: its own HOME, timed from start to exit."""
    return run_command([sys.executable, "-c", FLOOR], timeout_s, port=None)


def run_demo(sample: Path, timeout_s: float) -> Run:
    return run_command(
        [sys.executable, "-m", "rayship.cli", "demo", "-f", str(sample), "--runs-dir", "runs"],
        timeout_s,
        port=free_port(),
    )


def run_command(command: list[str], timeout_s: float, port: int | None) -> Run:
    home = Path(tempfile.mkdtemp(prefix="rs-demo-", dir="/tmp"))  # short: Ray's socket paths are limited
    token = secrets.token_hex(8)
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(home),
        "RAY_ADDRESS": "",
        MARKER: token,
        "PYTHONUNBUFFERED": "1",
    }
    if port is not None:
        command = [*command, "--port", str(port)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=home,
        start_new_session=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the demo's own session
        returncode = proc.wait()
    wall = time.perf_counter() - start
    reader.join(timeout=10)
    run = Run(wall, returncode, lines)
    run.leftovers = reap_leftovers(token, proc.pid)
    shutil.rmtree(home, ignore_errors=True)
    return run


def reap_leftovers(token: str, session: int) -> list[str]:
    """The processes of a run (`MARKER`=token in their environment, or in `session`) still alive
    LINGER_S after it returned, as `pid command` lines; each is then stopped by its pid."""
    deadline = time.monotonic() + LINGER_S
    left = marked_processes(token, session)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = marked_processes(token, session)
    for pid in left:  # this run's processes, by pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"{pid} {cmd}" for pid, cmd in sorted(left.items())]


def phases(run: Run) -> list[tuple[str, float, float]]:
    """(phase, seconds it took, seconds since start at its end), in order; a missing line is skipped."""
    rows: list[tuple[str, float, float]] = []
    previous = 0.0
    for label, prefix in MILESTONES:
        stamp = next((t for t, line in run.lines if line.startswith(prefix)), None)
        if stamp is None:
            continue
        rows.append((label, stamp - previous, stamp))
        previous = stamp
    rows.append(("exit (interpreter, Ray's atexit)", run.wall_s - previous, run.wall_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1, help="demo runs (the RESULT is their median)")
    parser.add_argument("--file", type=Path, default=ROOT / "manifests/samples/trainingjob-ddp.yaml")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()

    runs: list[Run] = []
    floors: list[Run] = []
    failed = False
    for i in range(args.runs):
        floor = run_floor(args.timeout_s)
        floors.append(floor)
        print(f"\nrun {i + 1}/{args.runs}: Ray's floor: exit {floor.returncode}, {floor.wall_s:.1f} s")
        if floor.returncode != 0 or floor.leftovers:
            failed = True
            print(
                "  FAILED or LEFT BEHIND; its last output:",
                *(line for _, line in floor.lines[-25:]),
                sep="\n    ",
            )
        run = run_demo(args.file, args.timeout_s)
        runs.append(run)
        print(
            f"\nrun {i + 1}/{args.runs}: rayship demo -f {args.file.name}: exit {run.returncode}, {run.wall_s:.1f} s"
        )
        print(f"  {'phase':36} {'s':>7} {'at s':>7}")
        for label, took, at in phases(run):
            print(f"  {label:36} {took:7.2f} {at:7.2f}")
        if run.returncode != 0:
            failed = True
            print("  FAILED; its last output:")
            for _, line in run.lines[-25:]:
                print(f"    {line}")
        if run.leftovers:
            failed = True
            print(f"  LEFT BEHIND ({len(run.leftovers)} processes, now killed):")
            for leftover in run.leftovers:
                print(f"    {leftover}")
        else:
            print("  left behind: nothing")
    walls = [r.wall_s for r in runs]
    floor_walls = [r.wall_s for r in floors]
    demo_s, floor_s = statistics.median(walls), statistics.median(floor_walls)
    print(
        f"\n{'':20} {'min':>6} {'median':>7} {'max':>6}  (s, {len(walls)} run(s), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f})"
    )
    for label, values in (("rayship demo", walls), ("Ray's floor", floor_walls)):
        print(f"{label:20} {min(values):6.1f} {statistics.median(values):7.1f} {max(values):6.1f}")
    print(f"goal: the demo <= {GOAL_S:.0f} s: {'met' if demo_s <= GOAL_S else 'NOT met'}")
    print(f"RESULT demo_s={demo_s:.1f}")
    print(f"RESULT ray_floor_s={floor_s:.1f}")
    print(f"RESULT demo_over_floor={demo_s / floor_s:.2f}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
