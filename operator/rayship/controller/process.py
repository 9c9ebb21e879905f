"""What one operator process holds between kopf's events, in one object made at start-up (`run`, or
kopf's start-up handler when kopf was started otherwise) and handed to every handler in kopf's memo:
the configuration, the reconcile loop, kopf's pool and context, the TrainingJob work queue, what the
watches hold, and the stop flags. No handler module keeps state of its own."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import kopf

from rayship.api import names
from rayship.config import OperatorConfig
from rayship.controller.kopf_storage import MemoryDiffBase, MemoryProgress
from rayship.controller.reconcile import Reconciler
from rayship.controller.workqueue import WorkQueue

log = logging.getLogger("rayship")
# kopf never retries an event handler: `retried` does, this many times, before the resync takes over.
EVENT_ATTEMPTS = 3

Key = tuple[str, str]  # (namespace, name)
Index = kopf.Index[tuple[str | None, str], bytes]


@dataclass
class OperatorProcess:
    reconciler: Reconciler  # holds the configuration (`config`)
    progress: MemoryProgress = field(
        default_factory=lambda: MemoryProgress(prefix=names.KOPF_ANNOTATION_PREFIX)
    )
    diffbase: MemoryDiffBase = field(
        default_factory=lambda: MemoryDiffBase(prefix=names.KOPF_ANNOTATION_PREFIX)
    )
    executor: Executor | None = None  # kopf's thread pool, set by the start-up handler
    # kopf posts Events (`kopf.event`) through a queue its handlers find in context variables: the work
    # queue's tasks run in a copy of the context of the first handler that queued a job. (Not each
    # handler's own: that holds its event, the whole object, for as long as the job waits.)
    kopf_context: contextvars.Context | None = None
    queue: WorkQueue[Key] | None = None  # the TrainingJob work queue (`trainingjob_handlers.queue_for`)
    # Every TrainingJob seen and not seen deleted; the resync thread reconciles each from what kopf's
    # watches hold (`watched`: its indexes, handed over by the first TrainingJob or RayJob event).
    trainingjobs: set[Key] = field(default_factory=set)
    watched: dict[str, Index] = field(default_factory=dict)
    # When each TrainingJob's last reconcile succeeded (monotonic seconds): the resync reconciles only
    # those no event reconciled within the interval.
    reconciled: dict[Key, float] = field(default_factory=dict)
    stop_resync: threading.Event = field(default_factory=threading.Event)
    stop: asyncio.Event | None = None  # the flag `run` hands kopf; set on SIGTERM or SIGINT
    # Each TrainingSchedule's daemon sleeps on its flag here, set by the events that concern it.
    schedule_wakers: dict[Key, asyncio.Event] = field(default_factory=dict)

    @classmethod
    def start(cls, config: OperatorConfig) -> OperatorProcess:
        return cls(reconciler=Reconciler(config))

    @property
    def config(self) -> OperatorConfig:
        return self.reconciler.config

    def forget(self, uid: str) -> None:
        """Drop kopf's in-memory bookkeeping of a deleted object."""
        self.progress.forget(uid)
        self.diffbase.forget(uid)

    def retried(self, what: str, reconcile_once: Callable[[], None]) -> None:
        """Run a reconcile an event triggered; a temporary failure (the API server busy, or its discovery
        still blind to a CRD installed moments ago: up to half a minute after `helm install`) is retried
        after its delay, up to EVENT_ATTEMPTS in all. Otherwise it would wait for the resync (minutes):
        kopf retries the handlers of changes, never those of events. The operator stopping ends it."""
        for attempt in range(1, EVENT_ATTEMPTS + 1):
            try:
                reconcile_once()
                return
            except kopf.TemporaryError as err:
                if attempt == EVENT_ATTEMPTS:
                    raise
                log.info(
                    "%s: %s; again in %s s (attempt %d of %d)",
                    what,
                    err,
                    err.delay,
                    attempt + 1,
                    EVENT_ATTEMPTS,
                )
                if self.stop_resync.wait(err.delay or 1):
                    raise


def of(memo: Any) -> OperatorProcess:
    """The process a handler's `memo` carries (set before any handler runs)."""
    process = getattr(memo, "process", None)
    if not isinstance(process, OperatorProcess):
        raise kopf.PermanentError("the operator process was not set up: start it with `rayship operator`")
    return process


def in_thread(handler: Callable[..., None]) -> Callable[..., Awaitable[None]]:
    """A blocking handler (its reconcile makes API calls) made one kopf awaits while it runs in
    kopf's thread pool, as kopf runs a sync handler, but dropped if cancelled before a thread took it.

    kopf runs a sync handler in its pool and shields it: cancelled (the operator stops), the handler
    still waits for its thread. So on SIGTERM under a backlog (a burst of jobs, or KubeRay's status
    updates for each of them), every queued reconcile still ran, a few API calls each, and the
    operator outlived the pod's grace period, to end in SIGKILL. Dropped instead, a stop waits only
    for the reconciles already running, one per thread; a restarted operator lists every object and
    reconciles each again (the events of its watches' first listing), so nothing dropped is lost.
    Not `functools.wraps`: kopf would see the sync function under `__wrapped__` and call it sync."""

    async def run(**kwargs: Any) -> None:
        call = functools.partial(contextvars.copy_context().run, handler, **kwargs)  # kopf.event needs it
        await asyncio.get_running_loop().run_in_executor(of(kwargs.get("memo")).executor, call)

    run.__name__, run.__qualname__, run.__doc__ = handler.__name__, handler.__qualname__, handler.__doc__
    return run


def namespaced(namespace: str | None) -> str:
    if namespace is None:  # every kind rayship watches is namespaced
        raise kopf.PermanentError("rayship resources are namespaced; got a cluster-scoped object")
    return namespace
