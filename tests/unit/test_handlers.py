"""The kopf wiring's own logic (no cluster): liveness of the reconcile loop."""

from __future__ import annotations

from typing import cast

import pytest

from rayship.config import OperatorConfig
from rayship.controller.process import OperatorProcess


def a_process(**config: object) -> OperatorProcess:
    """The operator process's state, as `run` makes it (no kopf, no cluster)."""
    return OperatorProcess.start(OperatorConfig.model_validate(config))


def test_liveness_fails_while_a_reconcile_is_wedged() -> None:
    import time
    from types import SimpleNamespace

    import pytest

    from rayship.controller import handlers

    process = a_process(wedgedSeconds=300)
    memo = SimpleNamespace(process=process)
    assert handlers.reconciles_not_wedged(memo=memo) == 0
    process.reconciler.running[-1] = ("TrainingJob ns/stuck", time.monotonic() - 301)
    with pytest.raises(RuntimeError, match="TrainingJob ns/stuck has been running for 30"):
        handlers.reconciles_not_wedged(memo=memo)


def test_a_reconcile_still_queued_for_a_thread_is_dropped_when_the_operator_stops() -> None:
    """`in_thread`: a cancelled handler (the operator stopping) that no thread has taken never runs;
    the one running finishes in its thread; kopf sees an async handler (else it would call it sync)."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    import kopf._core.actions.invocation as invocation

    from rayship.controller import process as operator_process
    from rayship.controller import trainingjob_handlers

    ran: list[str] = []
    release = threading.Event()

    def reconcile(*, name: str, **_: object) -> None:
        ran.append(name)
        release.wait(5)

    handler = operator_process.in_thread(reconcile)
    assert invocation.is_async_fn(handler) and handler.__name__ == "reconcile"
    assert invocation.is_async_fn(trainingjob_handlers.trainingjob_event)
    process = a_process()
    memo = SimpleNamespace(process=process)

    async def stop_with_a_backlog() -> None:
        running = asyncio.create_task(handler(name="running", memo=memo))
        queued = [asyncio.create_task(handler(name=f"queued-{i}", memo=memo)) for i in range(3)]
        while not ran:
            await asyncio.sleep(0.01)
        for task in [running, *queued]:
            task.cancel()
        results = await asyncio.gather(running, *queued, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        release.set()

    pool = ThreadPoolExecutor(max_workers=1)
    process.executor = pool
    asyncio.run(stop_with_a_backlog())
    pool.shutdown(wait=True)
    assert ran == ["running"]


def test_a_reconcile_an_event_triggered_is_retried_after_a_temporary_failure() -> None:
    """kopf never retries an event handler: `retried` does, after the error's delay, a few times."""
    import kopf
    import pytest

    from rayship.controller.process import EVENT_ATTEMPTS

    process = a_process()
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < EVENT_ATTEMPTS:
            raise kopf.TemporaryError("the API server does not know the owner's kind yet", delay=0.01)

    process.retried("ModelService ns/m", flaky)
    assert len(calls) == EVENT_ATTEMPTS

    calls.clear()

    def always() -> None:
        calls.append(1)
        raise kopf.TemporaryError("busy", delay=0.01)

    with pytest.raises(kopf.TemporaryError, match="busy"):
        process.retried("ModelService ns/m", always)
    assert len(calls) == EVENT_ATTEMPTS  # then the resync takes over

    calls.clear()
    process.stop_resync.set()  # the operator stops: no more waiting
    with pytest.raises(kopf.TemporaryError):
        process.retried("ModelService ns/m", always)
    assert len(calls) == 1


def test_a_reconcile_starts_from_its_own_status_write_until_a_reconcile_sees_a_newer_version() -> None:
    """Under load the watch lags behind the operator's own status writes: a reconcile from the watch
    starts from the remembered write (not a 409 and two GETs), until a reconcile sees a newer version."""
    from rayship.controller import kopf_storage
    from rayship.controller import reconcile as loop

    reconciler = a_process().reconciler
    key = ("TrainingJob", "ns", "tj")
    old = {"metadata": {"name": "tj", "resourceVersion": "10"}, "status": {}}
    written = {"metadata": {"name": "tj", "resourceVersion": "11"}, "status": {"phase": "Pending"}}
    reconciler.written[key] = ("10", kopf_storage.kept(written))
    seen = loop.Seen(old, None)
    assert reconciler.with_own_write(*key, seen).obj == written
    # Another reconcile still reading 10 from the index (kopf stores the watch's 11 there only
    # after its index handler returns) also starts from our write: it is still remembered.
    assert reconciler.with_own_write(*key, seen).obj == written
    # A reconcile that sees 11 works from the watch, and the write is forgotten.
    assert reconciler.with_own_write(*key, loop.Seen(written, None)).obj is written
    assert key not in reconciler.written
    assert reconciler.with_own_write(*key, seen).obj is old
    # A reconcile from a watch already past the write (its event came before it was remembered):
    # works from the watch, and the write is forgotten.
    reconciler.written[key] = ("10", kopf_storage.kept(written))
    newer = {"metadata": {"name": "tj", "resourceVersion": "12"}}
    assert reconciler.with_own_write(*key, loop.Seen(newer, None)).obj is newer
    assert key not in reconciler.written


def test_reconciles_of_one_object_never_overlap_those_of_two_objects_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's create pass and its RayJob's event must not write its status at once (one would get a
    409 and redo its reads): one object's reconciles wait for each other; other objects' do not."""
    import threading
    import time

    from rayship.controller.trainingjob_handlers import TRAINING

    reconciler = a_process().reconciler
    running, peak = [0], [0]  # reconciles running now, and the most at once in this run
    guard = threading.Lock()

    def once(*_: object, **__: object) -> bool:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with guard:
            running[0] -= 1
        return True

    monkeypatch.setattr(reconciler, "reconcile_once", once)

    def run_at_once(names: list[str]) -> int:
        peak[0] = 0
        threads = [threading.Thread(target=reconciler.reconcile, args=(TRAINING, "ns", n)) for n in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return peak[0]

    assert run_at_once(["same", "same", "same"]) == 1
    other = next(
        f"pair-{i}"
        for i in range(1000)
        if reconciler.object_lock("TrainingJob", "ns", f"pair-{i}")
        is not reconciler.object_lock("TrainingJob", "ns", "pair")
    )
    assert run_at_once(["pair", other]) == 2


def test_a_kept_object_is_trimmed_packed_and_read_back_as_a_fresh_copy() -> None:
    """What the indexes and the own-write memory hold for every object: no managedFields, no kopf
    diffbase annotation, none of `drop_spec`; one bytes object; each read is the caller's own copy."""
    import kopf

    from rayship.api import names
    from rayship.controller import kopf_storage

    raw = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "tj",
            "resourceVersion": "7",
            "managedFields": [{"manager": "kopf"}],
            "annotations": {names.KOPF_DIFFBASE_ANNOTATION: "{}", "team": "ml"},
        },
        "spec": {"rayClusterSpec": {"headGroupSpec": {}}, "suspend": True},
        "status": {"jobDeploymentStatus": "Suspended"},
    }
    kept = kopf_storage.kept(kopf.Body(raw), drop_spec=("rayClusterSpec",))
    assert isinstance(kept, bytes)
    expected = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "tj", "resourceVersion": "7", "annotations": {"team": "ml"}},
        "spec": {"suspend": True},
        "status": {"jobDeploymentStatus": "Suspended"},
    }
    first = kopf_storage.unpacked(kept)
    assert first == expected
    first["status"]["jobDeploymentStatus"] = "Running"  # a reconcile's own copy
    assert kopf_storage.unpacked(kept) == expected
    assert raw["metadata"]["managedFields"] and raw["spec"]["rayClusterSpec"] == {"headGroupSpec": {}}


def test_kopfs_diffbase_is_kept_packed_in_memory_and_forgotten_with_the_object() -> None:
    import kopf

    from rayship import api
    from rayship.controller import kopf_storage

    store = kopf_storage.MemoryDiffBase(prefix="test.rayship.dev")
    ms = {"apiVersion": api.API_VERSION, "kind": "ModelService", "metadata": {"uid": "u1", "name": "ms"}}
    body = kopf.Body({**ms, "spec": {"routePrefix": "/a"}, "status": {"phase": "Ready"}})
    essence = cast(kopf.BodyEssence, {"spec": {"routePrefix": "/a"}, "metadata": {"labels": {"a": "b"}}})
    assert store.build(body=body) == {"spec": {"routePrefix": "/a"}}  # kopf's essence: no status
    store.store(body=body, patch=kopf.Patch(), essence=essence)
    assert isinstance(store.essences["u1"], bytes)
    assert store.fetch(body=body) == essence
    store.forget("u1")
    assert store.fetch(body=body) is None  # and no annotation on the object: nothing to diff against


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("rayship.dev/v1alpha1", "TrainingJob"), ("ray.io/v1", "RayJob"), ("v1", "Namespace"),
     ("example.com/v1", "ModelService")],
)  # fmt: skip
def test_kopf_builds_no_essence_of_a_kind_without_change_handlers(api_version: str, kind: str) -> None:
    """kopf diffs every event's essence; only ModelServices have change handlers to give it to."""
    import kopf

    from rayship.controller import kopf_storage

    store = kopf_storage.MemoryDiffBase(prefix="test.rayship.dev")
    body = kopf.Body({"apiVersion": api_version, "kind": kind, "metadata": {"uid": "u2"}, "spec": {"a": 1}})
    store.store(body=body, patch=kopf.Patch(), essence=cast(kopf.BodyEssence, {"spec": {"a": 1}}))
    assert store.build(body=body) is None and store.fetch(body=body) is None


@pytest.mark.parametrize(
    ("raised", "again_in"),
    [
        (None, None),
        ("temporary", 7.0),  # the error's delay
        ("permanent", None),  # logged, never retried
        ("other", 60.0),  # kopf's default backoff
    ],
)
def test_a_queued_reconcile_is_queued_again_after_a_failure_as_kopf_would_retry_it(
    monkeypatch, raised: str | None, again_in: float | None
) -> None:
    import kopf

    from rayship.controller import trainingjob_handlers as handlers

    process = a_process()
    process.queue = handlers.queue_for(process)
    errors = {
        "temporary": kopf.TemporaryError("API server busy", delay=7),
        "permanent": kopf.PermanentError("cluster-scoped"),
        "other": RuntimeError("connection reset"),
    }
    calls: list[tuple[str, str]] = []
    again: list[tuple[tuple[str, str], float, bool]] = []

    def reconcile(process: OperatorProcess, namespace: str, name: str, seen: object) -> None:
        calls.append((namespace, name))
        if raised:
            raise errors[raised]

    # nothing watched yet (process.watched is empty): the reconcile reads
    monkeypatch.setattr(handlers, "reconcile_trainingjob", reconcile)
    monkeypatch.setattr(process.queue, "add_after", lambda *a: again.append(a))
    handlers._reconcile_queued(process, ("ns", "job"), True)
    assert calls == [("ns", "job")]
    assert again == ([] if again_in is None else [(("ns", "job"), again_in, True)])


@pytest.mark.parametrize(
    ("deployment", "suspended", "jobs", "again_in"),
    [
        ("Initializing", False, 1, 15.0),  # its pods are starting: looked at again
        ("Initializing", False, 1000, 50.0),  # spread out: at most 20 looks a second in all
        ("Initializing", True, 1, None),  # being suspended: its pods are going, not starting
        ("Running", False, 1, None),  # KubeRay's own updates say the rest
        (None, False, 1, None),  # no RayJob seen yet: its first event comes
    ],
)
def test_a_job_whose_pods_are_starting_is_looked_at_again_until_they_run(
    monkeypatch, deployment: str | None, suspended: bool, jobs: int, again_in: float | None
) -> None:
    """A worker that cannot pull its image or is OOMKilled over and over changes nothing in its
    RayJob, so no event would come before the resync: the queue looks at the job again."""
    from rayship.controller import trainingjob_handlers as handlers
    from rayship.controller.kopf_storage import kept

    process = a_process()
    process.queue = handlers.queue_for(process)
    process.trainingjobs.update(("ns", f"job-{i}") for i in range(jobs - 1))
    process.trainingjobs.add(("ns", "job"))
    trainingjob = {
        "apiVersion": "rayship.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "job", "namespace": "ns"},
    }
    rayjobs = {}
    if deployment is not None:
        rayjob = {
            "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "job", "namespace": "ns"},
            "spec": {"suspend": suspended},
            "status": {"jobDeploymentStatus": deployment, "rayClusterName": "job-raycluster-x"},
        }  # fmt: skip
        rayjobs = {("ns", handlers.names.rayjob_name("job")): [kept(rayjob)]}
    process.watched.update(trainingjobs={("ns", "job"): [kept(trainingjob)]}, rayjobs=rayjobs)
    again: list[tuple[object, ...]] = []
    monkeypatch.setattr(handlers, "reconcile_trainingjob", lambda *a: None)
    monkeypatch.setattr(process.queue, "add_after", lambda *a: again.append(a))
    handlers._reconcile_queued(process, ("ns", "job"), False)
    assert again == ([] if again_in is None else [(("ns", "job"), again_in)])


def test_a_trainingjob_is_queued_while_its_status_does_not_reflect_its_spec(monkeypatch) -> None:
    """The TrainingJob event handler's filter: a job whose status.observedGeneration is not its
    metadata.generation (new: no status yet; or its spec changed) is queued with its RayJob read
    afresh; an event of a status write that reflects the spec (the operator's own, the workload's
    progress) queues nothing; a deleted job is forgotten."""
    import asyncio
    from types import SimpleNamespace

    from rayship.controller import trainingjob_handlers as handlers

    process = a_process()
    process.queue = handlers.queue_for(process)
    queued: list[tuple[tuple[str, str], bool]] = []
    monkeypatch.setattr(process.queue, "add", lambda key, fresh=False: queued.append((key, fresh)))

    def event(kind: str | None, generation: int, status: dict[str, object]) -> None:
        views = {"trainingjobs_seen": {}, "rayjobs_seen": {}, "claims_seen": {}, "namespaces_terminating": {}}
        asyncio.run(
            handlers.trainingjob_event(
                type=kind, namespace="ns", name="job", uid=None, meta={"generation": generation},
                status=status, services_by_trainingjob={}, memo=SimpleNamespace(process=process), **views,
            )
        )  # fmt: skip

    event("ADDED", 1, {})  # created: no status yet
    assert queued == [(("ns", "job"), True)] and process.trainingjobs == {("ns", "job")}
    event("MODIFIED", 1, {"phase": "Pending", "observedGeneration": 1})  # the operator's status write
    event("MODIFIED", 1, {"phase": "Running", "observedGeneration": 1, "progress": {"epoch": 1}})
    event(None, 1, {"phase": "Running", "observedGeneration": 1})  # listed at start-up, up to date
    assert len(queued) == 1
    event("MODIFIED", 2, {"phase": "Running", "observedGeneration": 1})  # a spec change
    event("MODIFIED", 2, {"phase": "Running", "observedGeneration": 1, "progress": {"epoch": 2}})
    assert queued == [(("ns", "job"), True)] * 3  # until a status reflects generation 2
    event(None, 3, {"phase": "Running", "observedGeneration": 2})  # changed while no operator ran
    assert len(queued) == 4
    event("DELETED", 3, {"phase": "Running", "observedGeneration": 3})
    assert process.trainingjobs == set() and len(queued) == 4


def test_an_event_after_the_operator_stopped_is_said_in_the_log_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reconcile that was running at SIGTERM may finish after kopf's loop closed: its Event cannot be
    posted; that is logged, while any other failure to post still raises."""
    import kopf

    from rayship.controller import reconcile as loop
    from rayship.controller.conditions import Event

    def closed(*_: object, **__: object) -> None:
        raise RuntimeError("Event loop is closed")

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("something else")

    owner = kopf.Body(cast(kopf.RawBody, {"metadata": {"name": "tj", "namespace": "ns"}}))
    monkeypatch.setattr(kopf, "event", closed)
    with caplog.at_level("INFO", logger="rayship"):
        loop.post(owner, Event("Normal", "RayJobCreated", "created"))
    assert "Event RayJobCreated of tj not posted" in caplog.text
    monkeypatch.setattr(kopf, "event", broken)
    with pytest.raises(RuntimeError, match="something else"):
        loop.post(owner, Event("Normal", "RayJobCreated", "created"))


def test_a_service_waiting_for_a_missing_trainingjob_is_told_those_of_its_namespace_from_the_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The names come from kopf's index of TrainingJobs (handed to the reconciler by the handlers): no
    API call; only without an index (no handler has handed it yet), one LIST of the namespace."""
    import yaml

    from rayship import api
    from rayship.controller import k8s
    from rayship.controller import reconcile as loop
    from rayship.controller.modelservice_handlers import SERVING
    from tests.conftest import SAMPLES

    service = yaml.safe_load((SAMPLES / "modelservice-from-trainingjob.yaml").read_text())
    service["spec"]["model"]["fromTrainingJob"]["name"] = "mlp-dpp"
    service["metadata"].update(uid="ms-1", resourceVersion="1", generation=1)
    monkeypatch.setattr(k8s, "get", lambda resource, *_: service if resource == api.MODELSERVICES else None)
    lists: list[tuple[object, ...]] = []
    monkeypatch.setattr(
        k8s, "list_objects", lambda *args: lists.append(args) or [{"metadata": {"name": "mlp-ddp"}}]
    )
    written: list[dict[str, object]] = []

    def patch_status(_resource: object, _ns: str, _name: str, changes: dict[str, object], _rv: str) -> dict:
        written.append(changes)
        return service

    monkeypatch.setattr(k8s, "patch_status", patch_status)
    monkeypatch.setattr(k8s, "namespace_terminating", lambda _ns: False)
    monkeypatch.setattr(loop, "post", lambda *_: None)

    def message() -> str:
        conditions = cast(list[dict[str, str]], written[-1]["conditions"])
        return next(c["message"] for c in conditions if c["type"] == "ModelAvailable")

    reconciler = a_process().reconciler
    index = {("default", "mlp-ddp"): [b""], ("default", "llm-zero3"): [b""], ("team-b", "mlp-dpq"): [b""]}
    reconciler.listed["trainingjobs"] = cast(loop.NameIndex, index)
    assert reconciler.reconcile_once(SERVING, "default", "mlp")
    assert message() == (
        "TrainingJob mlp-dpp does not exist (yet) in namespace default; did you mean mlp-ddp? "
        "TrainingJobs there: llm-zero3, mlp-ddp"
    )
    assert lists == []
    reconciler.listed.clear()
    assert reconciler.reconcile_once(SERVING, "default", "mlp")
    assert lists == [(api.TRAININGJOBS, "default", "")] and "did you mean mlp-ddp?" in message()
