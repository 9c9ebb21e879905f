"""A controller's work queue, as client-go's: keys of objects to reconcile, each waiting at most once
and never reconciled by two workers at once. A key added while it waits is merged into the waiting
entry; added while its reconcile runs, it waits again and runs once more after.

The kopf handlers that feed it return at once: the event they were given (the whole decoded object)
is let go, and the reconcile reads the object from kopf's indexes when its turn comes. Awaiting the
reconcile instead, every event of a burst stayed in memory until a thread took it.
"""

from __future__ import annotations

import threading
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
        """`add` in `delay` seconds (a retry); a timer thread, so nothing is held while it waits."""
        timer = threading.Timer(delay, self.add, (key, fresh))
        timer.daemon = True
        timer.start()

    def stop(self) -> None:
        """Nothing more is handed to `work`: what waits is dropped (a restarted operator lists every
        object, and reconciles each)."""
        with self._lock:
            self._stopped = True
            self._order.clear()
            self._waiting.clear()

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
