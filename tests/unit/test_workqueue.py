"""`rayship.controller.workqueue.WorkQueue`: a key waits at most once, never runs twice at once, runs once more
when added while it runs; `stop` drops what waits."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from rayship.controller.workqueue import WorkQueue


class Pool:
    """A thread pool stand-in: submitted tasks run when the test says."""

    def __init__(self) -> None:
        self.tasks: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> None:
        self.tasks.append(task)

    def run_one(self) -> None:
        self.tasks.pop(0)()


def test_a_burst_of_adds_is_one_reconcile_per_key_in_order_with_fresh_merged() -> None:
    pool, done = Pool(), []
    queue: WorkQueue[str] = WorkQueue(lambda key, fresh: done.append((key, fresh)), pool.submit)
    queue.add("a")
    queue.add("b", fresh=True)
    queue.add("a", fresh=True)
    queue.add("b")
    assert len(queue) == 2 and len(pool.tasks) == 2
    while pool.tasks:
        pool.run_one()
    assert done == [("a", True), ("b", True)] and len(queue) == 0


def test_a_key_added_while_it_runs_runs_again_after_never_beside_itself() -> None:
    pool, done = Pool(), []

    def work(key: str, fresh: bool) -> None:
        if not done:
            queue.add(key, fresh=True)  # an event for the same object while it is reconciled
            assert pool.tasks == [], "queued beside the running reconcile"
        done.append((key, fresh))

    queue: WorkQueue[str] = WorkQueue(work, pool.submit)
    queue.add("a")
    pool.run_one()
    assert done == [("a", False)] and len(pool.tasks) == 1
    pool.run_one()
    assert done == [("a", False), ("a", True)] and pool.tasks == []


def test_a_failing_reconcile_frees_its_key() -> None:
    pool, calls = Pool(), []

    def work(key: str, fresh: bool) -> None:
        calls.append(key)
        raise RuntimeError("API server down")

    queue: WorkQueue[str] = WorkQueue(work, pool.submit)
    for _ in range(2):
        queue.add("a")
        with pytest.raises(RuntimeError):  # not swallowed: the pool's future holds it
            pool.run_one()
    assert calls == ["a", "a"] and len(queue) == 0


def test_stop_drops_what_waits_and_takes_no_more() -> None:
    pool, done = Pool(), []
    queue: WorkQueue[str] = WorkQueue(lambda key, fresh: done.append(key), pool.submit)
    queue.add("a")
    queue.add("b")
    queue.stop()
    queue.add("c")
    while pool.tasks:
        pool.run_one()
    assert done == [] and len(queue) == 0


def test_add_after_adds_later() -> None:
    ran = threading.Event()
    queue: WorkQueue[str] = WorkQueue(lambda key, fresh: ran.set(), lambda task: task())
    queue.add_after("a", 0.05)
    assert not ran.is_set()
    assert ran.wait(5)
