"""`rayship status NAME` (or `describe`): one screen on a TrainingJob, ModelService or TrainingSchedule:
its phase, conditions with their reasons and messages, attempts, workers, its child (RayJob,
RayService or the schedule's runs), its last Events and the next step to take (`nextstep`).

NAME is `tj/NAME`, `ms/NAME`, `ts/NAME` (any word `rayship get` takes for a kind) or a bare name, looked
up among the three kinds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import urllib3

from rayship import api
from rayship.cli import kube, nextstep
from rayship.cli.get import split_ref
from rayship.cli.output import age, align

EVENTS = 8  # the last Events shown, newest last
MESSAGE = 300  # characters of a condition's or Event's message shown in its row


def find_object(
    conn: kube.Connection, namespace: str, kind: api.Kind | None, name: str
) -> tuple[api.Kind, dict[str, Any]]:
    """The object `name` of `kind`, or (no kind) of the one kind that has an object of that name."""
    import kubernetes
    from kubernetes.client import ApiException

    custom = kubernetes.client.CustomObjectsApi(conn.client)
    found: list[tuple[api.Kind, dict[str, Any]]] = []
    served = False  # a kind's 404 named the object: the kind is served there
    for each in [kind] if kind else api.KINDS:
        group, version, plural = each.resource
        what = f"{each.singular} {name} in namespace {namespace}"
        try:
            obj = custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=kube.TIMEOUT
            )
        except ApiException as err:
            if kind is None and err.status == 404:
                served = served or bool(kube.status_body(err.body)[1].get("name"))
                continue
            raise kube.api_error(err, conn, what, each.crd_name) from None
        except urllib3.exceptions.HTTPError as err:
            raise kube.unreachable(conn, err) from None
        found.append((each, cast(dict[str, Any], obj)))
    if not found and not served:
        raise kube.not_served(conn, ", ".join(k.crd_name for k in api.KINDS))
    if not found:
        kinds = ", ".join(k.kind for k in api.KINDS[:-1]) + f" or {api.KINDS[-1].kind}"
        raise kube.ClusterError(f"no {kinds} named {name} in namespace {namespace}")
    if len(found) > 1:
        which = " and ".join(f"a {k.kind} ({k.short_names[0]}/{name})" for k, _ in found)
        raise kube.ClusterError(f"{name} in namespace {namespace} is {which}: say which")
    return found[0]


def events_of(conn: kube.Connection, obj: Mapping[str, Any]) -> list[dict[str, Any]] | str:
    """The object's Events (core/v1, involvedObject = it), oldest first; a line saying why not when
    they cannot be read (the status is worth showing without them)."""
    import kubernetes

    meta = obj["metadata"]
    core = kubernetes.client.CoreV1Api(conn.client)
    selector = f"involvedObject.kind={obj['kind']},involvedObject.name={meta['name']}"
    try:
        with kube.talking(conn, f"events of {obj['kind']} {meta['name']}"):
            listed = core.list_namespaced_event(
                meta["namespace"], field_selector=selector, _request_timeout=kube.TIMEOUT
            )
    except kube.ClusterError as err:
        return f"(cannot read its events: {err})"
    events = [conn.client.sanitize_for_serialization(e) for e in listed.items]
    uid = meta.get("uid")
    events = [e for e in events if (e.get("involvedObject") or {}).get("uid") in (None, "", uid)]
    return sorted(events, key=_when)


def _when(event: Mapping[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
               or meta.get("creationTimestamp") or "")  # fmt: skip


def _short(message: Any) -> str:
    text = " ".join(str(message or "").split())
    return text if len(text) <= MESSAGE else text[: MESSAGE - 3] + "..."


def summary(kind: str, obj: Mapping[str, Any], now: datetime) -> list[tuple[str, str]]:
    """(label, value) lines at the top of the screen, the kind's own."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    created = meta.get("creationTimestamp")
    lines = [
        (kind, f"{meta.get('namespace')}/{meta.get('name')}"),
        ("Created", f"{created} ({age(created, now)} ago)" if created else ""),
        ("Phase", str(status.get("phase") or "(none yet)")),
    ]
    lines += {"TrainingJob": _trainingjob, "ModelService": _modelservice}.get(kind, _schedule)(spec, status)
    return [(label, value) for label, value in lines if value]


def _trainingjob(spec: Mapping[str, Any], status: Mapping[str, Any]) -> list[tuple[str, str]]:
    workers = spec.get("workers") or {}
    ready = status.get("readyWorkers") or 0
    said = [f"{workers.get('replicas', 1)} wanted"]
    if workers.get("minReplicas"):
        said.append(f"at least {workers['minReplicas']}")
    said.append(f"{ready} ready")
    if workers.get("gpusPerWorker"):
        said.append(f"{workers['gpusPerWorker']} GPU each")
    child = str(status.get("rayJobName") or "")
    if status.get("rayClusterName"):
        child += f" (RayCluster {status['rayClusterName']})"
    error = status.get("lastError") or {}
    where = f" (attempt {error['attempt']}, {error.get('source')})" if error.get("attempt") else ""
    return [
        ("Workers", ", ".join(said)),
        ("Attempt", str(status.get("attempt") or "")),
        ("RayJob", child),
        ("Progress", _progress(spec, status.get("progress") or {})),
        ("Model", str((status.get("checkpoint") or {}).get("model") or "")),
        ("Last error", _short(error.get("message")) + where if error else ""),
    ]


def _progress(spec: Mapping[str, Any], progress: Mapping[str, Any]) -> str:
    """ "epoch 3/10, loss 0.1235" as the workload last reported it."""
    said = []
    if progress.get("epoch") is not None:
        epochs = (spec.get("trainer") or {}).get("epochs")
        said.append(f"epoch {progress['epoch']}" + (f"/{epochs}" if epochs else ""))
    for key, value in (progress.get("metrics") or {}).items():
        said.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(said)


def _modelservice(spec: Mapping[str, Any], status: Mapping[str, Any]) -> list[tuple[str, str]]:
    replicas = spec.get("replicas") or {}
    count = status.get("modelCount")
    return [
        ("Model", str(status.get("modelURI") or (f"{count} models" if count else ""))),
        ("Replicas", f"{replicas.get('min', 1)}..{replicas.get('max', 1)}" if replicas else ""),
        ("Endpoints", f"{status.get('serveEndpoints') or 0} Ray pods serving"),
        ("URL", str(status.get("url") or "")),
        ("RayService", str(status.get("rayServiceName") or "")),
    ]


def _schedule(spec: Mapping[str, Any], status: Mapping[str, Any]) -> list[tuple[str, str]]:
    promoted = status.get("promoted") or {}
    schedule = f"{spec.get('schedule')} ({spec.get('timeZone') or 'UTC'})"
    return [
        ("Schedule", schedule + (", suspended" if spec.get("suspend") else "")),
        ("Last run", str(status.get("lastScheduleTime") or "")),
        ("Next run", str(status.get("nextScheduleTime") or "")),
        ("Active runs", ", ".join(status.get("active") or []) or "none"),
        ("Latest good", str(status.get("latestSucceeded") or "")),
        ("Promoted", str(promoted.get("job") or "")),
    ]


def conditions_table(status: Mapping[str, Any], now: datetime) -> str:
    """TYPE STATUS REASON AGE MESSAGE; a message the row above said already is not said again."""
    rows = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]]
    said = None
    for c in status.get("conditions") or []:
        message = _short(c.get("message"))
        when = age(c.get("lastTransitionTime"), now)
        shown = "(as above)" if message and message == said else message
        rows.append([str(c.get("type")), str(c.get("status")), str(c.get("reason") or ""), when, shown])
        said = message
    return align(rows, "  ") if len(rows) > 1 else "  none\n"


def attempts_table(status: Mapping[str, Any], now: datetime) -> str:
    rows = [["#", "STARTED", "ENDED", "OUTCOME", "REASON", "EPOCHS", "WORKERS", "GPU-SECONDS"]]
    for a in status.get("attempts") or []:
        changes = [str(w.get("readyWorkers")) for w in a.get("workerChanges") or []]
        epochs = (
            f"{a.get('resumedFromEpoch') or 0}->{a['reachedEpoch']}"
            if a.get("reachedEpoch") is not None
            else ""
        )
        left = a.get("checkpointEpoch")
        if isinstance(left, int) and left > (a.get("reachedEpoch") or 0):
            epochs += f" (checkpoint {left}: its report lost)"
        elif a.get("reportRecovered"):
            epochs += " (last report recovered)"
        gpu = a.get("gpuSeconds")
        started = age(a.get("startTime"), now) + " ago"
        ended = age(a.get("endTime"), now) + " ago" if a.get("endTime") else "running"
        rows.append([
            str(a.get("attempt")), started, ended, str(a.get("outcome") or ""), str(a.get("reason") or ""),
            epochs, ">".join(changes[-5:]), f"{gpu:.0f}" if isinstance(gpu, int | float) else "",
        ])  # fmt: skip
    return align(rows, "  ")


def events_table(events: list[dict[str, Any]] | str, now: datetime) -> tuple[str, str]:
    """(heading, table) of the last EVENTS Events."""
    if isinstance(events, str):
        return "Events:", f"  {events}\n"
    if not events:
        return "Events:", "  none\n"
    shown = events[-EVENTS:]
    rows = [["AGE", "TYPE", "REASON", "COUNT", "MESSAGE"]]
    for e in shown:
        said = [str(e.get("type") or ""), str(e.get("reason") or ""), str(e.get("count") or 1)]
        rows.append([age(_when(e), now), *said, _short(e.get("message"))])
    heading = (
        f"Events (the last {len(shown)} of {len(events)}, newest last):"
        if len(events) > len(shown)
        else "Events (newest last):"
    )
    return heading, align(rows, "  ")


def screen(obj: Mapping[str, Any], events: list[dict[str, Any]] | str, now: datetime) -> str:
    """Everything `rayship status` prints about `obj`."""
    kind = str(obj.get("kind"))
    status = obj.get("status") or {}
    top = summary(kind, obj, now)
    width = max(len(label) for label, _ in top) + 2
    parts = ["".join(f"{label + ':':<{width}}{value}\n" for label, value in top)]
    parts += ["\nConditions:\n", conditions_table(status, now)]
    if kind == "TrainingJob" and status.get("attempts"):
        parts += ["\nAttempts:\n", attempts_table(status, now)]
    heading, table = events_table(events, now)
    parts += [f"\n{heading}\n", table]
    parts += [f"\nNext step: {nextstep.next_step(obj)}\n"]
    return "".join(parts)


def cmd_status(args: argparse.Namespace) -> int:
    kind, name = split_ref(args.ref)
    conn = kube.connect(args.kubeconfig, args.context)
    namespace = conn.namespace_or_default(args.namespace)
    found_kind, obj = find_object(conn, namespace, kind, name)
    obj.setdefault("kind", found_kind.kind)
    sys.stdout.write(screen(obj, events_of(conn, obj), datetime.now(UTC)))
    return kube.EXIT_OK


def add_parser(sub: Any, cluster: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "status",
        aliases=["describe"],
        parents=[cluster],
        help="one object's phase, conditions, attempts, workers, events and the next step",
        description="One screen on a TrainingJob, ModelService or TrainingSchedule (as `kubectl describe`).",
    )
    p.add_argument(
        "ref", metavar="NAME", help="tj/NAME, ms/NAME, ts/NAME, or a bare NAME (looked up in all three)"
    )
    p.set_defaults(func=cmd_status)
