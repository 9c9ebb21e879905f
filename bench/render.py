"""Validate + render: in-process rate, and `rayship render -f` wall time, each beside its baseline.

    .venv/bin/python bench/render.py [--file manifests/samples/trainingjob-ddp.yaml] [--seconds 2] [--runs 7]

Question (issue 14, P3): how many TrainingJobs per second does the operator validate and render, and
how long does `rayship render -f FILE` take from a shell?
Goals: >= 5000 validate+render per second in-process; <= 0.2 s wall for the CLI.

In-process (one process, one thread; each row is run for --seconds after a warm-up, best of 3):

  render only        baseline: `trainingjob.render_trainingjob(tj, config)` on an already validated
                     TrainingJob: the pure render, no validation.
  operator           render_per_s: what the operator does for each TrainingJob it reconciles:
                     `validation.parse(doc, admitted=True)` (pydantic + the CEL rules the API server
                     cannot enforce; the CRD's own rules were enforced by the API server when the object
                     was written) and the render.
  CLI / local        `validation.parse(doc)` (every CEL rule, with cel-expr-python) and the render, as
                     `rayship render` does; shown for comparison, not a figure of the issue.

CLI (separate processes, --runs runs each, interleaved so load changes hit every row alike; median,
min in brackets):

  python -c pass     the interpreter's own start-up (baseline)
  bare imports       `import yaml; from cel_expr_python import cel; from pydantic import BaseModel`:
                     the third-party libraries the render path cannot do without, nothing of
                     rayship's (baseline)
  rayship render     render_cli_s: `<venv>/bin/rayship render -f FILE > /dev/null`, after one warm-up
                     run; the first run is shown separately.
                     As on a laptop, no `RAYSHIP_*` setting is in the environment: with one, rayship.config
                     also imports pydantic-settings to read it (~50 ms more here).

Every CLI row runs with Python's bytecode cache as an installed package has it: PYTHONDONTWRITEBYTECODE
is removed from the children's environment, so the warm-up run leaves the editable checkout's
`__pycache__` behind as `pip install` would (with it set, every run compiles rayship's modules anew,
~35 ms here).

Prints a table and ends with `RESULT render_per_s=...` and `RESULT render_cli_s=...`; never fails on
the goals. Takes about 30 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "manifests/samples/trainingjob-ddp.yaml"


def rate(work: Callable[[], Any], seconds: float) -> float:
    """Calls per second of `work`: best of 3 windows of `seconds` / 3 each, after a warm-up."""
    for _ in range(20):
        work()
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while (now := time.perf_counter()) < deadline:
            for _ in range(10):
                work()
            calls += 10
        best = max(best, calls / (now - start))
    return best


def in_process(path: Path, seconds: float) -> dict[str, float]:
    from rayship.api import validation, yamlio
    from rayship.config import from_environment
    from rayship.controller import trainingjob

    doc = next(d for d in yamlio.load_all(path.read_text()) if d is not None)
    config = from_environment()
    tj = validation.parse_trainingjob(doc)

    def render_only() -> None:
        trainingjob.render_trainingjob(tj, config)

    def operator() -> None:
        trainingjob.render_trainingjob(validation.parse_trainingjob(doc, admitted=True), config)

    def cli() -> None:
        trainingjob.render_trainingjob(validation.parse_trainingjob(doc), config)

    return {
        "render only": rate(render_only, seconds),
        "operator": rate(operator, seconds),
        "CLI / local": rate(cli, seconds),
    }


def wall(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    return time.perf_counter() - start


def cli(path: Path, runs: int) -> dict[str, list[float]]:
    python = sys.executable
    rayship = str(Path(python).parent / "rayship")
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "bare imports": [
            python,
            "-c",
            "import yaml; from cel_expr_python import cel; from pydantic import BaseModel",
        ],
        "rayship render": [rayship, "render", "-f", str(path)],
    }
    times: dict[str, list[float]] = {"rayship render (first run)": [wall(commands["rayship render"])]}
    times.update({name: [] for name in commands})
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(wall(argv))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--file", type=lambda p: Path(p).resolve(), default=SAMPLE, help="a TrainingJob YAML file"
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per in-process row")
    parser.add_argument("--runs", type=int, default=7, help="CLI runs per row")
    args = parser.parse_args()

    rates = in_process(args.file, args.seconds)
    times = cli(args.file, args.runs)

    base = rates["render only"]
    print(f"validate + render, in-process ({args.file.name}; goal >= 5000/s for the operator row)")
    print(f"  {'row':<28} {'per s':>9} {'ms each':>9} {'÷ render only':>14}")
    for name, value in rates.items():
        print(f"  {name:<28} {value:9.0f} {1000 / value:9.3f} {value / base:14.2f}")
    print()
    print(f"rayship render -f {args.file.name}, wall seconds ({args.runs} runs; goal <= 0.2 s)")
    print(f"  {'row':<28} {'median':>9} {'min':>9}")
    for name, values in times.items():
        print(f"  {name:<28} {statistics.median(values):9.3f} {min(values):9.3f}")
    cli_s = statistics.median(times["rayship render"])
    print(
        f"  rayship render - python -c pass: {cli_s - statistics.median(times['python -c pass']):.3f} s; "
        f"- bare imports: {cli_s - statistics.median(times['bare imports']):.3f} s"
    )
    print(f"RESULT render_per_s={rates['operator']:.0f}")
    print(f"RESULT render_cli_s={cli_s:.3f}")


if __name__ == "__main__":
    main()
