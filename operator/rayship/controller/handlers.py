"""kopf wiring: the operator's start-up, liveness probe, signals and clean-up, around the per-kind
handlers (`trainingjob_handlers`, `modelservice_handlers`, `trainingschedule_handlers`, registered by
importing them here). All
the process's state is one `OperatorProcess` (`rayship.controller.process`), made by `run` and handed
to every handler in kopf's memo; the reconcile loop is `rayship.controller.reconcile`.

Run with `rayship operator`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import SecretStr

from rayship import metrics
from rayship.config import from_environment
from rayship.controller import k8s
from rayship.controller.modelservice_handlers import register_resync
from rayship.controller.process import OperatorProcess, of
from rayship.controller.trainingjob_handlers import TRAINING, queue_for, resync_trainingjobs
from rayship.controller.trainingschedule_handlers import schedule_daemon

# Registered with kopf by being imported (as the two kinds' handlers above are).
__all__ = ["schedule_daemon"]

log = logging.getLogger("rayship")


def run(**options: Any) -> None:
    """`kopf.run(**options)` with the process's state made here, from the `RAYSHIP_*` environment,
    and stopped by SIGTERM or SIGINT through a stop flag (`take_signals`), so that a stop first drops
    what waits in the work queue. kopf's cleanup handlers run only once its watchers have stopped: the
    thread pool would work through the queue meanwhile, a reconcile (a few API calls) per queued job,
    and a rollout under a backlog would end in SIGKILL."""
    process = OperatorProcess.start(from_environment())
    process.stop = asyncio.Event()
    register_resync(process.config.resync_seconds)
    if options.get("clusterwide"):
        # A watch of every namespace, which an operator confined to its namespaces (the chart's
        # watchNamespaces: Roles there, no ClusterRole) may not make: without it a reconcile in a
        # namespace being deleted is tried, and told so by the API server (k8s.Terminating).
        kopf.index("v1", "namespaces")(namespaces_terminating)
    kopf.run(stop_flag=process.stop, memo=kopf.Memo(process=process), **options)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    process = of(memo)
    # kopf's bookkeeping stays in memory: no writes to the objects for it (see MemoryProgress).
    settings.persistence.progress_storage = process.progress
    settings.persistence.diffbase_storage = process.diffbase
    settings.posting.level = logging.WARNING  # our own Events say what happened; no handler chatter
    settings.watching.server_timeout = 270
    # No CRD or namespace scanning: the resources are known (the chart installs our CRDs, KubeRay its),
    # so the operator needs no cluster-wide read access to CustomResourceDefinitions.
    settings.scanning.disabled = True
    # On SIGTERM, no waiting for kopf's per-object queues to drain: each queued event would start a
    # reconcile (see `in_thread`), and a restarted operator reconciles every object anyway.
    settings.queueing.exit_timeout = 0
    # kopf's worker of an object keeps its last event (the whole decoded object) until no new event
    # has come for this long (5 s by default): after a burst, hundreds of objects' events held at
    # once. Shorter, the operator's peak memory in a burst is lower (bench/operator_memory.py).
    settings.queueing.idle_timeout = 0.5
    config = process.config
    settings.execution.max_workers = config.workers
    process.executor = settings.execution.executor
    k8s.configure(connections=config.workers + 2)  # + two spare
    if config.ray_token_key is None:
        config = config.model_copy(update={"ray_token_key": SecretStr(k8s.token_key(config.namespace))})
        process.reconciler.config = config
    logging.getLogger("rayship").setLevel(config.log_level.upper())
    metrics.serve(config.metrics_port)
    queue = process.queue = queue_for(process)
    metrics.QUEUE_DEPTH.labels(TRAINING.kind).set_function(lambda: len(queue))
    process.stop_resync.clear()
    threading.Thread(target=resync_trainingjobs, args=(process,), name="rayship-resync", daemon=True).start()


@kopf.on.probe(id="reconciles")
def reconciles_not_wedged(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: fails (kopf answers 500) while one reconcile has run longer than `wedged_seconds`."""
    process = of(memo)
    now = time.monotonic()
    for what, started in list(process.reconciler.running.values()):
        if now - started > process.config.wedged_seconds:
            raise RuntimeError(f"reconcile of {what} has been running for {now - started:.0f} s")
    return len(process.reconciler.running)


# Namespaces being deleted, kept by kopf from a watch of namespaces: a reconcile there writes nothing.
# Deleting a namespace deletes its objects, children first as often as not; meanwhile the status of a
# job would say it is suspending or lost, and the API server refuses its Events (kopf retries each).
# An index of the operator that watches every namespace only (registered by `run`).
async def namespaces_terminating(*, name: str, status: Mapping[str, Any], **_: Any) -> dict[str, bool] | None:
    return {name: True} if status.get("phase") == "Terminating" else None


@kopf.on.cleanup()
def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    _stop_work(of(memo))


def _stop_work(process: OperatorProcess) -> None:
    """No more reconciles of TrainingJobs: the resync ends, what waits in the queue is dropped."""
    process.stop_resync.set()
    if process.queue is not None:
        process.queue.stop()


@kopf.on.startup()
async def take_signals(memo: kopf.Memo, **_: Any) -> None:
    """SIGTERM and SIGINT, taken over from kopf when started by `run`: `_stopping`."""
    process = of(memo)
    if process.stop is None or threading.current_thread() is not threading.main_thread():
        return  # not started by `run`: kopf keeps its own handlers
    # kopf installs its handlers as its startup tasks take their first step, before this one's
    # next: installed after that, these replace them.
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopping, process, sig)


def _stopping(process: OperatorProcess, sig: signal.Signals) -> None:
    dropped = len(process.queue) if process.queue is not None else 0
    _stop_work(process)
    log.info("%s: stopping; %d queued TrainingJob reconciles dropped", sig.name, dropped)
    if process.stop is not None:
        process.stop.set()
