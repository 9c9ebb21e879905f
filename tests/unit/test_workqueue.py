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


def test_a_key_waits_for_its_soonest_time_only_with_fresh_merged() -> None:
    import time

    added: list[tuple[str, bool]] = []
    queue: WorkQueue[str] = WorkQueue(lambda key, fresh: None, lambda task: None)
    queue.add = lambda key, fresh=False: added.append((key, fresh))  # type: ignore[method-assign]
    queue.add_after("a", 60)  # a retry after a failure
    queue.add_after("a", 0.2, fresh=True)  # a look again, sooner: replaces it
    queue.add_after("a", 30)  # later than the one waiting: merged into it
    queue.add_after("b", 0.1)
    assert queue.waiting_later() == 2
    deadline = time.monotonic() + 5
    while len(added) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # nothing more comes: the 60 s and 30 s times were dropped
    assert added == [("b", False), ("a", True)] and queue.waiting_later() == 0


def test_stop_drops_what_waits_for_later_and_ends_the_timer_thread() -> None:
    ran = threading.Event()
    queue: WorkQueue[str] = WorkQueue(lambda key, fresh: ran.set(), lambda task: task())
    queue.add_after("a", 0.2)
    timer = queue._timer
    assert timer is not None and timer.is_alive()
    queue.stop()
    timer.join(5)
    assert not timer.is_alive() and queue.waiting_later() == 0
    assert not ran.wait(0.4)
