"""The reconcile loop, one for every kind: read, plan (the kind's pure `plan`), act on the child, and
write the status the kind's pure `status` derives, only when it changed, one reconcile of an object at
a time. A kind is a `Controller` entry; all I/O goes through `rayship.controller.k8s`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from rayship import api, metrics
from rayship.config import OperatorConfig
from rayship.controller import k8s
from rayship.controller.conditions import Event, Plan, Probe, describe_foreign, owned_changes, ownership
from rayship.controller.kopf_storage import kept, unpacked

log = logging.getLogger("rayship")
CONFLICT_RETRIES = 5
# kopf's index of a kind's objects by (namespace, name) (what it holds of each is not read here).
NameIndex = kopf.Index[tuple[str | None, str], Any]


@dataclass(frozen=True)
class Controller:
    """Everything the reconcile loop needs to know about one kind."""

    kind: str
    resource: api.Resource
    child: api.Resource  # the KubeRay object it owns
    child_name: Callable[[str], str]
    # The other objects (same namespace) its plan depends on, e.g. a ModelService's TrainingJobs; the
    # plan gets those that exist.
    related: Callable[[Mapping[str, Any]], list[tuple[api.Resource, str]]]
    plan: Callable[
        [Mapping[str, Any], Mapping[str, Any] | None, Sequence[Mapping[str, Any]], OperatorConfig], Plan
    ]
    # The label selector of the child's Ray pods when they are worth a look now (e.g. not running yet),
    # from the resource, the child and the time.
    pods: Callable[[Mapping[str, Any], Mapping[str, Any] | None, datetime], str | None]
    # The status from the resource, the child, the plan, its Ray pods (None: not looked at) and the time.
    status: Callable[
        [Mapping[str, Any], Mapping[str, Any] | None, Plan, list[dict[str, Any]] | None, datetime],
        dict[str, Any],
    ]
    announce: Callable[[Mapping[str, Any], Mapping[str, Any]], list[Event]]
    # A GET through the API server's service proxy worth making before the status is derived
    # (pure: which, if any), and how its answer (HTTP code, body) goes into the plan.
    probe: Callable[[Plan, Mapping[str, Any] | None, OperatorConfig], Probe | None] = lambda *_: None
    heard: Callable[[Plan, int, str], Plan] = lambda plan, *_: plan
    # A plan waiting for an object it names that does not exist says which of that kind do (a
    # ModelService's TrainingJob: those of the namespace): the kind it misses, if any (pure), and how
    # their names go into the plan. Read from a watch's index where one is held (`Reconciler.listed`).
    missing: Callable[[Plan], api.Resource | None] = lambda _plan: None
    existing: Callable[[Plan, Sequence[str]], Plan] = lambda plan, _names: plan


@dataclass(frozen=True)
class Seen:
    """The resource and its child as kopf's watches last showed them (None: no child seen), and its
    related objects where a watch holds them too (None: GET each one `Controller.related` names)."""

    obj: dict[str, Any]
    child: dict[str, Any] | None
    related: list[dict[str, Any]] | None = None


class Reconciler:
    """The reconcile loop of one operator process, and what it remembers between reconciles: the
    reconciles running now (the liveness probe reads them), its own last status writes, kopf's live
    index of the namespaces being deleted (handed over by the first event), the object locks. Made
    once, at start-up (`rayship.controller.process`)."""

    def __init__(self, config: OperatorConfig, stripes: int = 256) -> None:
        self.config = config
        self.running: dict[int, tuple[str, float]] = {}  # thread -> (what, monotonic start)
        self.terminating: dict[str, kopf.Index[str, bool]] = {}  # "namespaces": kopf's live index
        # kopf's live indexes by (namespace, name) of the kinds a plan may miss (`Controller.missing`), by
        # plural (e.g. "trainingjobs"), handed over by the handlers: without one, a namespace is LISTed.
        self.listed: dict[str, NameIndex] = {}
        # A reconcile that works from the watches remembers its last status write, (kind, namespace, name) ->
        # (the resourceVersion it wrote over, the object the API server returned, `kept`), until a reconcile
        # sees a newer version (`with_own_write`; the resync reconciles every object, so an entry lasts at
        # most about two resync intervals). Under load the watch lags behind the operator's own writes: a
        # reconcile right after one (e.g. of the RayJob KubeRay just updated) would write at the older
        # version, get a 409 and read both objects again (a 100-job burst: 62 of 169 status writes). Not
        # forgotten when the watch shows the write: kopf stores an event in its index only after the index
        # handler returns, and a reconcile reading the index meanwhile still sees the older version.
        self.written: dict[tuple[str, str, str], tuple[str, bytes]] = {}
        # One reconcile of an object at a time, as a controller's work queue guarantees: otherwise a job's
        # create pass and its RayJob's first event, run at once, can both write its status at the same
        # resourceVersion, and one loses (409: both objects read again, the status written again). The one
        # that waited starts from the other's write (`with_own_write`). Locks by stripe: bounded memory;
        # with 32 workers, two objects seldom share one. (Reconciles never nest, so a stripe is never
        # taken twice by one thread.) TrainingJobs have their work queue, which guarantees this too; the
        # locks serve the ModelServices (their handlers, timers and RayService events run in kopf's pool).
        self._locks = tuple(threading.Lock() for _ in range(stripes))

    def object_lock(self, kind: str, namespace: str, name: str) -> threading.Lock:
        return self._locks[hash((kind, namespace, name)) % len(self._locks)]

    def with_own_write(self, kind: str, namespace: str, name: str, seen: Seen) -> Seen:
        """`seen`, its resource replaced by our own later write when the watch has not shown that yet.
        A write the watch has moved past is forgotten here too: its own event may have come before the
        write was remembered, and no later event may come (the resync still passes by)."""
        mine = self.written.get((kind, namespace, name))
        if mine is None:
            return seen
        if seen.obj["metadata"].get("resourceVersion") == mine[0]:
            return replace(seen, obj=unpacked(mine[1]))
        self.written.pop((kind, namespace, name), None)
        return seen

    def names_in(self, resource: api.Resource, namespace: str) -> list[str]:
        """The names of the objects of a kind in a namespace: from kopf's index where one is held, else
        from one LIST."""
        index = self.listed.get(resource[2])
        if index is not None:
            return sorted(name for ns, name in list(index) if ns == namespace)
        return sorted(o["metadata"]["name"] for o in k8s.list_objects(resource, namespace, ""))

    def reconcile(self, ctl: Controller, namespace: str, name: str, seen: Seen | None = None) -> None:
        """Bring the child in line with the resource, then mirror the child's state into the resource's
        status (written only when it changed, at the resourceVersion it was derived from); idempotent.
        Never runs twice at once for one object (`object_lock`).

        With `seen`, the first pass works from what the watches showed; a status write that finds the
        resource changed since (409) reads both from the API server and plans again."""
        metrics.RECONCILES.labels(ctl.kind).inc()
        with self.object_lock(ctl.kind, namespace, name):
            self.running[threading.get_ident()] = (f"{ctl.kind} {namespace}/{name}", time.monotonic())
            try:
                with metrics.RECONCILE_ERRORS.labels(ctl.kind).count_exceptions():
                    for attempt in range(CONFLICT_RETRIES):
                        first = seen if attempt == 0 else None
                        if self.reconcile_once(ctl, namespace, name, first, watched=seen is not None):
                            return
                    raise kopf.TemporaryError(
                        f"{ctl.kind} {namespace}/{name} kept changing; retrying", delay=2
                    )
            finally:
                self.running.pop(threading.get_ident(), None)

    def reconcile_once(
        self, ctl: Controller, namespace: str, name: str, seen: Seen | None = None, watched: bool = False
    ) -> bool:
        """One read-plan-act-write pass; False when the status write lost a race (read again).
        `watched`: the reconcile works from the watches, so its status write is remembered (`written`).
        Nothing at all in a namespace being deleted."""
        config = self.config
        if namespace in self.terminating.get("namespaces", {}):
            return True
        if seen is not None:
            seen = self.with_own_write(ctl.kind, namespace, name, seen)
        obj = seen.obj if seen else k8s.get(ctl.resource, namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return True  # gone or going: its children follow by garbage collection
        child = seen.child if seen else k8s.get(ctl.child, namespace, ctl.child_name(name))
        related = _related(ctl, obj, seen)
        todo = ctl.plan(obj, child, related, config)
        if seen and child is None and todo.create is None:
            # No child in memory, and the plan acts on its absence (e.g. a launched child gone): the
            # watch may lag behind a child just made, so ask the API server before acting on it.
            child = k8s.get(ctl.child, namespace, ctl.child_name(name))
            todo = ctl.plan(obj, child, related, config)
        if (kind := ctl.missing(todo)) is not None:
            todo = ctl.existing(todo, self.names_in(kind, namespace))
        owner = kopf.Body(cast(kopf.RawBody, obj))  # a raw object as read from the API
        try:
            child = _carry_out(ctl, owner, obj, child, todo)
        except k8s.Rejected as refused:
            todo = replace(todo, rejected=(refused.phase, refused.reason, refused.message))
        except k8s.Busy as busy:
            raise kopf.TemporaryError(str(busy), delay=5) from None
        except k8s.Terminating:
            return True  # the namespace is being deleted: nothing new can be made there, nor is needed
        if (probe := ctl.probe(todo, child, config)) is not None:
            todo = ctl.heard(todo, *k8s.proxy_get(namespace, probe))
        current = obj.get("status") or {}
        now = datetime.now(UTC)
        selector = ctl.pods(obj, child, now)
        pods = k8s.list_pods(namespace, selector) if selector else None
        desired = ctl.status(obj, child, todo, pods, now)
        changes = owned_changes(current, desired)
        if not changes:
            return True
        if _child_going(child, todo) and k8s.namespace_terminating(namespace):
            # The namespace watch has not told yet (or no event has handed its index over): asked, as
            # the status would say that a job or service failed moments before it goes too.
            return True
        written_over = obj["metadata"]["resourceVersion"]
        try:
            stored = k8s.patch_status(ctl.resource, namespace, name, changes, written_over)
        except k8s.Conflict:
            return False
        if watched:
            self.written[(ctl.kind, namespace, name)] = (written_over, kept(stored))
        if desired.get("phase") != current.get("phase"):
            metrics.PHASE_TRANSITIONS.labels(ctl.kind, str(desired.get("phase"))).inc()
        for event in ctl.announce(current, desired):
            post(owner, event)
        return True


def _related(ctl: Controller, obj: Mapping[str, Any], seen: Seen | None) -> list[dict[str, Any]]:
    """The related objects that exist: as a watch holds them when it holds each one named, else each
    one GET (one absent from a watch may be one just made that the watch has not shown yet)."""
    if seen is not None and seen.related is not None and len(seen.related) == len(ctl.related(obj)):
        return seen.related
    namespace = obj["metadata"]["namespace"]
    return [found for ref in ctl.related(obj) if (found := k8s.get(ref[0], namespace, ref[1])) is not None]


def _child_going(child: Mapping[str, Any] | None, todo: Plan) -> bool:
    """The status to write reacts to the child being deleted or gone (not to one about to be made)."""
    if child is None:
        return todo.create is None
    return bool(child["metadata"].get("deletionTimestamp"))


def _carry_out(
    ctl: Controller, owner: kopf.Body, obj: Mapping[str, Any], child: dict[str, Any] | None, todo: Plan
) -> dict[str, Any] | None:
    """Create (prerequisites first, each adopted) or patch the child; the child as stored after."""
    namespace = obj["metadata"]["namespace"]
    if todo.create is not None or todo.patch is not None:
        for prerequisite in todo.prerequisites:
            kopf.adopt(prerequisite, owner=owner)
            k8s.ensure(prerequisite, obj)
    if todo.create is not None:
        kopf.adopt(todo.create, owner=owner)
        child = k8s.create(ctl.child, todo.create)
        if (how := ownership(child, obj)) != "owned":  # created meanwhile by someone else: not ours
            if how == "previous":
                raise k8s.Busy(describe_foreign(child, ctl.child[2], how))
            raise k8s.Rejected("Failed", "NameTaken", describe_foreign(child, ctl.child[2], how))
        post(owner, todo.on_create)
        for warning in todo.warnings:
            post(owner, warning)
    if todo.patch is not None and child is not None:
        child = k8s.patch(ctl.child, namespace, todo.child_name, todo.patch)
        post(owner, todo.on_patch)
    return child


def post(owner: kopf.Body, event: Event | None) -> None:
    """Our own Events, posted explicitly (kopf.info() would obey posting.level and drop them). A
    reconcile that was running when the operator stopped may finish after kopf's event loop closed:
    its Event cannot be posted any more (the status it wrote stays), which is said in the log."""
    if event is None:
        return
    try:
        kopf.event(owner, type=event.type, reason=event.reason, message=event.message)
    except RuntimeError as err:
        if "closed" not in str(err):
            raise
        name = owner.get("metadata", {}).get("name")
        log.info("the operator is stopping: Event %s of %s not posted (%s)", event.reason, name, err)
