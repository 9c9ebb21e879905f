"""kopf's bookkeeping kept in this process's memory, not written to the objects (its progress records,
the ModelService diff base), and the watched objects as the operator keeps them: trimmed and packed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import kopf

from rayship import api
from rayship.api import names


class MemoryProgress(kopf.AnnotationsProgressStorage):
    """kopf's per-handler progress (retry counts, delays) in this process's memory, not written to
    the object: a reconcile is idempotent, so after a restart every object is simply handled again.
    Only kopf's nudge to retry a failed handler after its delay (`touch`) is an annotation patch."""

    def __init__(self, prefix: str):
        super().__init__(prefix=prefix)
        self.records: dict[tuple[str, kopf.HandlerId], kopf.ProgressRecord] = {}

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        return self.records.get((body.metadata.uid or "", key))

    def store(
        self, *, key: kopf.HandlerId, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch
    ) -> None:
        self.records[(body.metadata.uid or "", key)] = kopf.ProgressRecord(**record)

    def purge(self, *, key: kopf.HandlerId, body: kopf.Body, patch: kopf.Patch) -> None:
        self.records.pop((body.metadata.uid or "", key), None)
        super().purge(key=key, body=body, patch=patch)  # annotations an earlier version wrote

    def forget(self, uid: str) -> None:
        for stale in [k for k in self.records if k[0] == uid]:
            del self.records[stale]


class MemoryDiffBase(kopf.AnnotationsDiffBaseStorage):
    """The spec kopf last handled for a ModelService (the base of its diffs: it runs the update
    handler only when something but the status changed), in memory packed as compact JSON
    (`packed`), not written to the object. After a restart an object has none, so kopf handles it as
    created: the same reconcile."""

    def __init__(self, prefix: str):
        super().__init__(prefix=prefix, key="last-handled-configuration")
        self.essences: dict[str, bytes] = {}

    # kopf builds the essence of every object at every event (a deep copy of the whole object, then
    # trimmed) and diffs it with the last one, whether or not the kind has a change handler
    # to give the diff to. TrainingJobs, RayJobs and namespaces have none: only a ModelService's is
    # built (and fetched); kopf takes None for none.
    @staticmethod
    def _diffed(body: kopf.Body) -> bool:
        return body.get("kind") == api.MODEL_SERVICE.kind and body.get("apiVersion") == api.API_VERSION

    def build(  # type: ignore[override]  # kopf's processing takes None for "no essence"
        self, *, body: kopf.Body, extra_fields: Any = None
    ) -> kopf.BodyEssence | None:
        return super().build(body=body, extra_fields=extra_fields) if self._diffed(body) else None

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if not self._diffed(body):
            return None
        found = self.essences.get(body.metadata.uid or "")
        if found is None:
            return super().fetch(body=body)  # an annotation an earlier version wrote
        return cast(kopf.BodyEssence, unpacked(found))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self.essences[body.metadata.uid or ""] = _packed(essence)

    def forget(self, uid: str) -> None:
        self.essences.pop(uid, None)


def kept(body: Mapping[str, Any], drop_spec: tuple[str, ...] = ()) -> bytes:
    """A watched object as the operator keeps it for as long as it exists (kopf's indexes, own status
    writes): `_trimmed`, packed as compact JSON, one allocation; `unpacked` reads it back. Kept as
    dicts, each object would be a tree of small objects that also holds on to the strings of kopf's
    decoded event: several times the memory per object (bench/operator_memory.py measures it)."""
    return _packed(_trimmed(body, drop_spec))


def _packed(value: Mapping[str, Any]) -> bytes:
    """What the operator keeps in memory per object (`kept`, kopf's diffbase): compact JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def unpacked(kept: bytes) -> dict[str, Any]:
    """A packed object (`_packed`) as plain dicts: a fresh copy, the caller's own."""
    return cast(dict[str, Any], json.loads(kept))


def _trimmed(body: Mapping[str, Any], drop_spec: tuple[str, ...] = ()) -> dict[str, Any]:
    """A watched object as plain dicts, without what no reconcile reads and memory would hold for
    every object: managedFields, kopf's copy of the last handled spec, and `drop_spec` fields."""
    kept: dict[str, Any] = {k: _plain(v) for k, v in body.items() if k not in ("metadata", "spec")}
    meta = {k: _plain(v) for k, v in body.get("metadata", {}).items() if k != "managedFields"}
    if annotations := meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in annotations.items() if k != names.KOPF_DIFFBASE_ANNOTATION}
    kept["metadata"] = meta
    if "spec" in body:
        kept["spec"] = {k: _plain(v) for k, v in body["spec"].items() if k not in drop_spec}
    return kept


def _plain(value: Any) -> Any:
    """A value of a watched object as plain dicts and lists. (Not a closure in `_trimmed`: a nested
    function that calls itself is a reference cycle, garbage for the cyclic collector at every event.)"""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def one_of(index: kopf.Index[Any, bytes], key: Any) -> dict[str, Any] | None:
    kept = next(iter(index.get(key, [])), None)
    return None if kept is None else unpacked(kept)
