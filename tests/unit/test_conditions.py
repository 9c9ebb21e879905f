"""Shared status building blocks (`rayship.controller.conditions`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rayship.controller.conditions import MAX_MESSAGE, condition, find, owned_changes

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_transition_time_kept_while_status_unchanged() -> None:
    first = condition({}, "Ready", True, "Ready", "up", 3, NOW)
    stored = {"conditions": [first]}
    same = condition(stored, "Ready", True, "Ready", "still up", 4, NOW + timedelta(minutes=5))
    flipped = condition(stored, "Ready", False, "Down", "gone", 4, NOW + timedelta(minutes=9))
    assert same["lastTransitionTime"] == "2026-01-01T00:00:00Z" and same["observedGeneration"] == 4
    assert flipped["lastTransitionTime"] == "2026-01-01T00:09:00Z"


def test_long_messages_are_truncated_under_the_api_limit() -> None:
    cond = condition({}, "Failed", True, "AppFailed", "x" * 100_000, 1, NOW)
    assert len(cond["message"]) <= MAX_MESSAGE < 32768 and cond["message"].endswith("(truncated)")


def test_find_and_owned_changes() -> None:
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert (
        find(status, "Ready")["status"] == "True" and find(status, "Missing") == {} and find(None, "x") == {}
    )
    assert owned_changes(status, {"phase": "Running"}) == {}
    assert owned_changes(status, {"phase": "Failed", "conditions": []}) == {
        "phase": "Failed",
        "conditions": [],
    }


def _pod(name: str, **status) -> dict:
    return {"metadata": {"name": name}, "status": status}


def test_pod_problem_names_the_scheduler_reason_or_the_waiting_container() -> None:
    from rayship.controller.conditions import pod_problem

    unschedulable = _pod(
        "w-1",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    pulling = _pod(
        "h-0",
        containerStatuses=[
            {"name": "ray-head", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
        ],
    )
    starting = _pod(
        "ok", containerStatuses=[{"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    )
    assert pod_problem([starting]) is None
    assert pod_problem([starting, unschedulable]) == (
        "Unschedulable",
        "pod w-1 cannot be scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    assert pod_problem([pulling]) == (
        "ImagePullBackOff",
        "pod h-0, container ray-head: ImagePullBackOff: not found",
    )
    never = _pod("h-1", containerStatuses=[{"name": "ray-head", "state": {"waiting": {
        "reason": "ErrImageNeverPull", "message": 'image "rayship/x:1" is not present with pull policy of Never'}}}])  # fmt: skip
    assert pod_problem([never]) == (
        "ErrImageNeverPull",
        'pod h-1, container ray-head: ErrImageNeverPull: image "rayship/x:1" is not present with pull policy of Never',
    )


def test_pod_problem_names_a_container_the_oom_killer_ended_until_it_runs_again() -> None:
    from rayship.controller.conditions import pod_problem

    killed = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    restarting = _pod("w-0", containerStatuses=[
        {"name": "ray-worker", "lastState": killed, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])  # fmt: skip
    assert pod_problem([restarting]) == (
        "OOMKilled",
        "pod w-0, container ray-worker: OOMKilled (exit code 137): it needs more memory than its limit",
    )
    assert (
        pod_problem([_pod("w-0", containerStatuses=[{"name": "ray-worker", "state": killed}])])[0]
        == "OOMKilled"
    )
    running = _pod(
        "w-0", containerStatuses=[{"name": "ray-worker", "lastState": killed, "state": {"running": {}}}]
    )
    assert pod_problem([running]) is None  # it came back: no longer the reason it waits


def test_a_crash_loop_is_named_with_the_last_line_its_container_logged() -> None:
    """The Ray containers' termination message is their log's tail (FallbackToLogsOnError): a crash
    loop is named with its exit code and last line, not only "back-off 40s"."""
    from rayship.config import OperatorConfig
    from rayship.controller import pods
    from rayship.controller.conditions import pod_problem

    template = pods.pod_template(
        OperatorConfig(), image="i", container="ray-worker", cpus=1, memory="1Gi", gpus=0, labels={}, env=[]
    )
    assert template["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 3\nModuleNotFoundError: No module named 'mylib'\n\n"
    crashed = {"terminated": {"reason": "Error", "exitCode": 1, "message": tail}}
    looping = _pod("w-0", containerStatuses=[{"name": "ray-worker", "lastState": crashed, "state": {"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=ray-worker"}}}])  # fmt: skip
    assert pod_problem([looping]) == (
        "CrashLoopBackOff",
        "pod w-0, container ray-worker: CrashLoopBackOff: back-off 40s restarting failed container=ray-worker; "
        "it exited with code 1: ModuleNotFoundError: No module named 'mylib'",
    )
    crashed["terminated"]["message"] = ""  # a container that logged nothing
    assert pod_problem([looping])[1].endswith("; it exited with code 1")
    crashed["terminated"].update(exitCode=0, message="done")  # an earlier run that ended well says nothing
    assert pod_problem([looping])[1].endswith("container=ray-worker")
