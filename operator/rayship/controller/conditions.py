"""Status building blocks shared by both kinds, all pure: metav1.Condition, "write only what changed",
the Events a reconcile announces, and the `Plan` both planners return to the reconcile loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

# The API server rejects a condition message over 32 KiB (metav1.Condition); keep well under it.
MAX_MESSAGE = 4096


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event the reconcile loop posts on the resource."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


Ownership = Literal["owned", "previous", "foreign"]


def ownership(child: Mapping[str, Any], owner: Mapping[str, Any]) -> Ownership:
    """Whose child this is: `owned` (its controller is `owner`, by UID), `previous` (an earlier
    object of the same kind and name, deleted and re-created: the child waits for garbage
    collection) or `foreign` (anything else: never adopted, never overwritten)."""
    refs = child.get("metadata", {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), None)
    meta = owner.get("metadata", {})
    if ref is None:
        return "foreign"
    if ref.get("uid") == meta.get("uid"):
        return "owned"
    if ref.get("kind") == owner.get("kind") and ref.get("name") == meta.get("name"):
        return "previous"
    return "foreign"


def describe_foreign(child: Mapping[str, Any], kind: str, how: Ownership) -> str:
    meta = child.get("metadata", {})
    name = meta.get("name")
    if how == "previous":
        return (
            f"{kind} {name} belongs to an earlier object of the same name and is still being deleted; "
            "it starts once that is gone"
        )
    return (
        f"{kind} {name} already exists and is not owned by this object; rayship never adopts or "
        "overwrites it: delete it, or rename this object"
    )


@dataclass(frozen=True)
class Plan:
    """What one reconcile should do to the child (RayJob / RayService); pure data, no I/O.

    `create` is created (after `prerequisites`, each adopted by the resource) when there is no
    child; `patch` is merge-patched onto the existing child. `on_create`/`on_patch` are announced
    once that happened. `context` is kind-specific and handed to the kind's `derive`.
    """

    child_name: str
    create: dict[str, Any] | None = None
    patch: dict[str, Any] | None = None
    prerequisites: tuple[dict[str, Any], ...] = ()
    on_create: Event | None = None
    on_patch: Event | None = None
    warnings: tuple[Event, ...] = ()  # posted along with on_create
    context: Any = None
    # Set by the reconcile loop when the API server refused the plan for good (a 400/422, or an
    # object of the same name it does not own): (phase, reason, message).
    rejected: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class Probe:
    """A GET the reconcile loop makes through the API server's service proxy before deriving the
    status (e.g. Serve's own application state from the Ray dashboard): pure data, no I/O.
    `token` goes in the `x-ray-authorization` header (the API server proxy keeps that one)."""

    service: str  # `<service>:<port name>`
    path: str
    token: str = field(default="", repr=False)  # never logged


# Container waiting reasons that mean the pod will not start by itself.
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",  # imagePullPolicy Never and the node does not have the image
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def pod_problem(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) for the first pod that cannot start: the scheduler's own reason (e.g.
    `0/3 nodes are available: 2 Insufficient nvidia.com/gpu ...`) or a container's waiting reason
    (e.g. ImagePullBackOff); None when every pod is scheduled and starting normally."""
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name"))):
        name = pod.get("metadata", {}).get("name")
        status = pod.get("status") or {}
        scheduled = find(status, "PodScheduled")
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            return "Unschedulable", f"pod {name} cannot be scheduled: {scheduled.get('message', '')}"
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            state = container.get("state") or {}
            waiting = state.get("waiting") or {}
            killed = _oom_killed(container)
            if killed and "running" not in state:
                return "OOMKilled", f"pod {name}, container {container.get('name')}: {killed}"
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                said = f"pod {name}, container {container.get('name')}: {waiting['reason']}{detail}"
                return str(waiting["reason"]), said + last_words(container)
    return None


def last_words(container: Mapping[str, Any]) -> str:
    """ "; it exited with code N: <its last log line>" for a container that ended in error (its
    termination message: the log's tail, by FallbackToLogsOnError), or ""."""
    ended = (container.get("lastState") or {}).get("terminated") or {}
    if not ended or ended.get("exitCode") == 0:
        return ""
    said = f"; it exited with code {ended.get('exitCode')}"
    line = error_line(str(ended.get("message") or ""))
    return f"{said}: {truncate(line, 300)}" if line else said


# A line of a log worth naming: an exception, a kill, a timeout.
_ERROR_LINE = re.compile(r"(Error|Exception|Killed|killed|Timeout|timed out|OOM|out of memory|NCCL)")


def error_line(log: str) -> str:
    """The line of a log tail that names the error: the last one that looks like one (a traceback
    ends with its exception), else the last line ("" for an empty log)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in reversed(lines) if _ERROR_LINE.search(line)), lines[-1] if lines else "")


def _oom_killed(container: Mapping[str, Any]) -> str | None:
    """What the kernel's OOM killer did to the container (now or at its last run), or None."""
    for when in ("state", "lastState"):
        terminated = (container.get(when) or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return f"OOMKilled (exit code {terminated.get('exitCode')}): it needs more memory than its limit"
    return None


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def truncate(message: str, limit: int = MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 15] + " ...(truncated)"


def find(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    """The condition of `type_` in a status (ours or KubeRay's), or `{}`."""
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), {})


def condition(
    current: Mapping[str, Any],
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """A metav1.Condition; its lastTransitionTime is kept from `current` while its status is unchanged."""
    previous = find(current, type_)
    value = "True" if ok else "False"
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": truncate(message),
        "lastTransitionTime": previous["lastTransitionTime"]
        if previous.get("status") == value and previous.get("lastTransitionTime")
        else rfc3339(now),
        "observedGeneration": generation,
    }


def owned_changes(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `current` into `desired` for the operator-owned keys only
    (empty when nothing changed: the status is written only when it changes)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}
