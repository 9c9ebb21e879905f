"""Lines for the pod's own log (`kubectl logs`), from inside a Ray worker process.

Ray writes a worker's output to files under /tmp/ray/session_*/logs (and streams them to the driver),
so `kubectl logs` of a Ray worker pod shows only `ray start`. Ray's own switch (RAY_LOG_TO_STDERR)
would send all of it to the container instead, and take it from the driver and the dashboard. These
few lines (which rank runs in which pod, each epoch's loss) go to both: the worker's output as usual,
and the container's output stream, which is that of the pod's first process (KubeRay's `ray start`),
readable by the same non-root user.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("rayship.podlog")
CONTAINER_STDOUT = "/proc/1/fd/1"
_unwritable: list[str] = []  # why the container stream could not be written (said once per process)


def in_pod() -> bool:
    """In a Kubernetes container whose first process is not this one."""
    return "KUBERNETES_SERVICE_HOST" in os.environ and os.getpid() != 1


def say(line: str) -> None:
    """`line` to this process's output and, in a pod, to the container's log."""
    text = f"rayship: {line}"
    print(text, flush=True)
    if not in_pod() or _unwritable:
        return
    try:
        with open(CONTAINER_STDOUT, "a") as out:
            out.write(f"{text}\n")
    except OSError as err:
        _unwritable.append(str(err))
        log.warning("the pod's log cannot be written (%s): its lines stay in Ray's worker log", err)


def worker_started(rank: int, world_size: int, from_epoch: int) -> None:
    start = f"resuming after epoch {from_epoch}" if from_epoch else "from the start"
    say(f"training worker rank {rank} of {world_size} on {socket.gethostname()}, {start}")
