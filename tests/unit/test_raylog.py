"""Ray's own output in a local run (rayship_workloads.raylog): into a file, the user's lines and Ray's
warnings and errors (one line each) on the terminal. No Ray runs: batches are handed as Ray's
driver-side dispatcher hands them."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from rayship_workloads import raylog


def batch(lines: list[str], *, err: bool, actor: str | None = "RayTrainWorker", pid: object = 4242) -> dict:
    return {"lines": lines, "is_err": err, "pid": pid, "actor_name": actor, "ip": "127.0.0.1"}


@pytest.fixture
def output(tmp_path: Path) -> tuple[raylog.RayOutput, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return raylog.RayOutput(tmp_path / "ray-output.log", out=out, err=err), out, err


def test_ray_bookkeeping_goes_to_the_file_only(output) -> None:
    sink, out, err = output
    sink.handle(
        batch(
            ["Starting execution of Dataset train_0. Full logs are in /tmp/x"],
            err=True,
            actor="SplitCoordinator",
        )
    )
    sink.handle(batch(["Reporting training result 1: TrainingReport(checkpoint=...)"], err=True))
    sink.handle(batch(["rayship: rank 0 epoch 1/5 loss 1.08742"], err=False))  # podlog's, for pods
    sink.handle(
        batch(["======== Autoscaler status ========", "Active:"], err=False, actor=None, pid="autoscaler")
    )
    assert out.getvalue() == "" and err.getvalue() == ""
    kept = sink.path.read_text().splitlines()
    assert (
        kept[0]
        == "(SplitCoordinator pid=4242) Starting execution of Dataset train_0. Full logs are in /tmp/x"
    )
    assert "(RayTrainWorker pid=4242) rayship: rank 0 epoch 1/5 loss 1.08742" in kept
    assert "(pid=autoscaler) Active:" in kept


def test_what_a_program_prints_in_a_ray_process_reaches_the_terminal_without_the_prefix(output) -> None:
    sink, out, _ = output
    sink.handle(batch(["my loop: batch 3 done", "trial 0001  epoch 1/2  loss 0.5"], err=False))
    assert out.getvalue().splitlines() == ["my loop: batch 3 done", "trial 0001  epoch 1/2  loss 0.5"]
    assert "(RayTrainWorker pid=4242) my loop: batch 3 done" in sink.path.read_text()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[2026-12-06 03:59:17,992 E 12629 12727] core_worker.cc:2465: The worker died",
            ("error", "The worker died"),
        ),
        ("[2026-12-06 03:59:17,992 W 12629 12727] raylet.cc:1: slow node", ("warning", "slow node")),
        (
            "2026-12-06 04:01:39,194\tWARNING worker.py:12 -- object store is full",
            ("warning", "object store is full"),
        ),
        ("ERROR 2026-12-06 03:58:48,166 serve 12536 -- replica crashed", ("error", "replica crashed")),
        (
            "/x/opts.py:436: RayDeprecationWarning: `a` is deprecated",
            ("warning", "RayDeprecationWarning: `a` is deprecated"),
        ),
        ("ValueError: bad shape", ("error", "ValueError: bad shape")),
        ("INFO 2026-12-06 03:58:48,166 serve 12536 -- Started Serve", None),
        ("Starting execution of Dataset train_0", None),
    ],
)
def test_severity(line: str, expected) -> None:
    assert raylog.severity(line) == expected


def test_a_warning_or_error_is_one_line_once_and_known_benign_ones_are_not_shown(output) -> None:
    sink, out, err = output
    glog = "[2026-12-06 03:59:17,992 E 1 2] core_worker.cc:1: The worker died unexpectedly"
    sink.handle(batch([glog, "  with more detail on a second line"], err=True, actor="TrainController"))
    sink.handle(batch([glog], err=True, actor="TrainController"))  # said once
    preemption = (
        "[2026-12-06 03:59:17,992 E 12629 12727] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' "
        "and ID: '58' has constructor arguments in the object store and max_restarts > 0."
    )
    deprecation = "/r/opts.py:436: RayDeprecationWarning: `ExecutionOptions.exclude_resources` is deprecated"
    sink.handle(batch([preemption], err=True, actor="TrainController"))
    sink.handle(batch([deprecation], err=True, actor="DatasetManager"))
    assert err.getvalue().splitlines() == [
        f"ray error from TrainController: The worker died unexpectedly  (all of Ray's output: {sink.path})"
    ]
    assert out.getvalue() == ""
    assert (sink.errors, sink.warnings) == (3, 1)  # counted all the same, and all in the file
    assert sink.path.read_text().count("(TrainController pid=4242)") == 4


def test_a_long_message_is_cut_to_one_short_line(output) -> None:
    sink, _, err = output
    sink.handle(batch(["ValueError: " + "x" * 1000], err=True))
    (line,) = err.getvalue().splitlines()
    assert "x" * (raylog.SURFACED_CHARS - 20) in line and len(line) < raylog.SURFACED_CHARS + 200


def test_attach_takes_over_rays_printing_and_the_ray_loggers_and_detach_gives_them_back(output) -> None:
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    sink, _, err = output
    printed: list[dict] = []
    dispatcher.add_handler(raylog.RAY_PRINT_HANDLER, printed.append)  # as ray.init adds Ray's own
    logger = logging.getLogger("ray.rayship_test")
    terminal = logging.StreamHandler(sys.stderr)
    logger.addHandler(terminal)
    logger.propagate = False
    try:
        sink.attach()
        sink.attach()  # again (after Serve's import): still one handler of ours, Ray's still gone
        names = [name for name, _ in dispatcher.handlers]
        assert raylog.RAY_PRINT_HANDLER not in names and names.count("rayship_ray_output") == 1
        dispatcher.emit(batch(["Starting execution of Dataset"], err=True, actor="SplitCoordinator"))
        logger.info("Started Serve in namespace serve")
        logger.warning("the HTTP proxy is not ready")
        assert printed == []
        assert terminal not in logger.handlers
        kept = sink.path.read_text()
        assert "Starting execution of Dataset" in kept and "Started Serve in namespace serve" in kept
        assert err.getvalue().splitlines() == [
            f"ray warning from ray.rayship_test: the HTTP proxy is not ready  (all of Ray's output: {sink.path})"
        ]
        sink.detach()
        assert logger.handlers == [terminal]
    finally:
        dispatcher.remove_handler("rayship_ray_output")
        dispatcher.remove_handler(raylog.RAY_PRINT_HANDLER)
        logger.handlers.clear()
