"""A controller's work queue, as client-go's: keys of objects to reconcile, each waiting at most once
and never reconciled by two workers at once. A key added while it waits is merged into the waiting
entry; added while its reconcile runs, it waits again and runs once more after.

The kopf handlers that feed it return at once: the event they were given (the whole decoded object)
is let go, and the reconcile reads the object from kopf's indexes when its turn comes. Awaiting the
reconcile instead, every event of a burst stayed in memory until a thread took it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """`add(key)` hands `work(key, fresh)` to `submit` (a thread pool's) unless the key already waits.
    `fresh`: some add of the key asked for it (ORed while it waits). After `stop()`, nothing more runs."""

    def __init__(self, work: Callable[[K, bool], None], submit: Callable[[Callable[[], None]], object]):
        self._work = work
        self._submit = submit
        self._lock = threading.Lock()
        self._order: deque[K] = deque()  # waiting keys not running, oldest first
        self._waiting: dict[K, bool] = {}  # every waiting key -> fresh
        self._running: set[K] = set()
        self._stopped = False
        # Keys to add later: each key's earliest due time (monotonic) and fresh, and a heap of
        # (due, tie-breaker, key) one timer thread works through (an entry whose due time is no longer
        # the key's is stale: skipped).
        self._due: dict[K, tuple[float, bool]] = {}
        self._later: list[tuple[float, int, K]] = []
        self._tie = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._timer: threading.Thread | None = None

    def add(self, key: K, fresh: bool = False) -> None:
        with self._lock:
            if self._stopped:
                return
            if key in self._waiting:
                self._waiting[key] = self._waiting[key] or fresh
                return
            self._waiting[key] = fresh
            if key in self._running:
                return  # queued again by `_done`
            self._order.append(key)
        self._submit(self._next)

    def add_after(self, key: K, delay: float, fresh: bool = False) -> None:
        """`add` in `delay` seconds (a retry, or a look again at a job that is starting). A key waits
        for one time at most: the sooner one, fresh ORed. One timer thread for every key, not one per
        call: at a thousand starting jobs, a thousand sleeping threads."""
        due = time.monotonic() + delay
        with self._lock:
            if self._stopped:
                return
            if key in self._due:
                when, was_fresh = self._due[key]
                if when <= due:
                    self._due[key] = (when, was_fresh or fresh)
                    return
                fresh = fresh or was_fresh
            self._due[key] = (due, fresh)
            heapq.heappush(self._later, (due, next(self._tie), key))
            if self._timer is None:
                self._timer = threading.Thread(target=self._add_when_due, name="workqueue-later", daemon=True)
                self._timer.start()
            self._wake.notify()

    def waiting_later(self) -> int:
        """How many keys wait to be added later."""
        with self._lock:
            return len(self._due)

    def _add_when_due(self) -> None:
        """The timer thread: adds each key at its due time, until `stop`."""
        while True:
            with self._lock:
                while not self._stopped:
                    now = time.monotonic()
                    if self._later and self._later[0][0] <= now:
                        due, _, key = heapq.heappop(self._later)
                        if self._due.get(key, (None, False))[0] == due:
                            break
                        continue  # stale: the key was moved sooner
                    self._wake.wait(self._later[0][0] - now if self._later else None)
                else:
                    return
                _, fresh = self._due.pop(key)
            self.add(key, fresh)

    def stop(self) -> None:
        """Nothing more is handed to `work`: what waits is dropped (a restarted operator lists every
        object, and reconciles each)."""
        with self._lock:
            self._stopped = True
            self._order.clear()
            self._waiting.clear()
            self._due.clear()
            self._later.clear()
            self._wake.notify()

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _next(self) -> None:
        """One submitted task: the oldest waiting key (one task was submitted per key queued)."""
        with self._lock:
            if self._stopped or not self._order:
                return
            key = self._order.popleft()
            fresh = self._waiting.pop(key)
            self._running.add(key)
        try:
            self._work(key, fresh)
        finally:
            self._done(key)

    def _done(self, key: K) -> None:
        with self._lock:
            self._running.discard(key)
            if self._stopped or key not in self._waiting:
                return
            self._order.append(key)
        self._submit(self._next)
