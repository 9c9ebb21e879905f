"""Plan one reconcile of a TrainingJob: given it and its RayJob as stored, what should change
(`conditions.Plan`); only `suspend` may change on a running job."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from rayship import api
from rayship.api import names
from rayship.api.validation import SpecError, parse_trainingjob
from rayship.config import OperatorConfig
from rayship.controller.conditions import (
    Event,
    Plan,
    describe_foreign,
    ownership,
)
from rayship.controller.trainingjob.phase import (
    CLAIM_NOT_FOUND,
    CREATED,
    STARTUP_DEADLINE,
    Observation,
    startup_deadline_passed,
)
from rayship.controller.trainingjob.rayjob import (
    applied_record,
    digested,
    render_trainingjob,
    secret_looking_env,
    total_cpus,
    total_gpus,
)

# Spec fields KubeRay applies to a live RayJob; every other edit after launch is reported.
MUTABLE_FIELDS = frozenset({"suspend"})


def claim_to_check(trainingjob: Mapping[str, Any]) -> list[tuple[api.Resource, str]]:
    """`Controller.related` of this kind: the checkpoint claim, while the job has not launched (a Ray
    cluster made without it would wait for it in Pending pods, and say so only once they exist); a
    launched or finished job needs no look (so a reconcile after launch makes no call for it)."""
    status = trainingjob.get("status") or {}
    if status.get("rayJobUID") or status.get("phase") in api.TERMINAL_PHASES:
        return []
    claim = _at(trainingjob.get("spec"), ["checkpoint", "storage", "pvc", "claimName"])
    return [(api.PVCS, claim)] if isinstance(claim, str) else []


def _missing_claim(
    tj: api.TrainingJob, related: Sequence[Mapping[str, Any]] | None
) -> tuple[str, str] | None:
    """(reason, message) when the checkpoint claim the job names does not exist in its namespace
    (`related` None: not looked up, as in a plan made offline)."""
    storage = tj.spec.checkpoint.storage
    if related is None or storage is None or storage.pvc is None:
        return None
    claim = storage.pvc.claim_name
    if any(r.get("kind") == "PersistentVolumeClaim" and r["metadata"]["name"] == claim for r in related):
        return None
    return CLAIM_NOT_FOUND, (
        f"spec.checkpoint.storage.pvc.claimName: PersistentVolumeClaim {claim} does not exist in namespace "
        f"{tj.metadata.namespace}; create it (ReadWriteMany where the job's pods may span nodes: "
        "manifests/samples/checkpoints-pvc.yaml) or name one that exists: no Ray cluster is made until then"
    )


def spec_edits(applied: Any, desired: Any, prefix: str = "") -> list[str]:
    """Dotted paths where `desired` differs from `applied` (lists compared whole)."""
    if isinstance(applied, Mapping) and isinstance(desired, Mapping):
        paths: list[str] = []
        for key in sorted(set(applied) | set(desired)):
            paths += spec_edits(applied.get(key), desired.get(key), f"{prefix}{key}.")
        return paths
    return [] if applied == desired else [prefix.rstrip(".")]


def _at(doc: Any, path: list[str]) -> Any:
    """The value at `path` in a wire document (None where it has none)."""
    for key in path:
        doc = doc.get(key) if isinstance(doc, Mapping) else None
    return doc


def _default(path: list[str]) -> Any:
    """The API's default for the spec field at the wire `path` (None when it is required or unknown)."""
    model: Any = api.TrainingJobSpec
    field = None
    for key in path:
        fields = model.model_fields if isinstance(model, type) and hasattr(model, "model_fields") else {}
        field = next((f for n, f in fields.items() if (f.alias or n) == key), None)
        if field is None:
            return None
        model = field.annotation
    return None if field is None or field.is_required() else field.get_default(call_default_factory=True)


def added_with_default(launched: Mapping[str, Any], path: str, wanted: Mapping[str, Any]) -> bool:
    """Whether `path` is a field the launch's record lacks (added to the API since) and that has its
    default: a field is added with the default that keeps what launches did before it, so no edit."""
    *parent, key = path.split(".")
    record = _at(launched, parent)
    if not isinstance(record, Mapping) or key in record:
        return False  # recorded (a real edit), or a whole section missing
    value = _at(wanted, [*parent, key])
    return value is not None and bool(value == _default([*parent, key]))


def applied_spec(rayjob: Mapping[str, Any]) -> dict[str, Any] | None:
    """The launched spec as recorded, in today's form: a record from before every string was
    digested (only env values were) reads the same once digested."""
    raw = (rayjob.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_SPEC)
    return cast(dict[str, Any], digested(json.loads(raw))) if raw else None


# `Controller.plan` of this kind: the same signature as the other kind's (an intended parallel).
def plan(
    trainingjob: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    related: Sequence[Mapping[str, Any]] | None,
    config: OperatorConfig,
) -> Plan:
    """The reconcile's plan; its `context` is the `Observation` that `status()` completes. `related`:
    the checkpoint claim, where `claim_to_check` asked for it and it exists (None: not looked up)."""
    meta = trainingjob["metadata"]
    rayjob_name = names.rayjob_name(meta["name"])
    current = trainingjob.get("status") or {}
    base = Observation(
        generation=meta.get("generation", 0),
        current=current,
        rayjob_name=rayjob_name,
        workload_account=names.workload_account(meta["name"]),
    )
    try:
        tj = parse_trainingjob(trainingjob, admitted=True)  # read from the API server
    except SpecError as err:
        return Plan(rayjob_name, context=replace(base, invalid="; ".join(err.problems)))

    observed = replace(base, gpus=total_gpus(tj), cpus=total_cpus(tj), queue=tj.spec.scheduling.queue)
    if rayjob is not None and (how := ownership(rayjob, trainingjob)) != "owned":
        reason = "PreviousRayJobTerminating" if how == "previous" else "RayJobNameTaken"
        return Plan(
            rayjob_name, context=replace(observed, blocked=(reason, describe_foreign(rayjob, "RayJob", how)))
        )
    if rayjob is None:
        if current.get("phase") in api.TERMINAL_PHASES:
            return Plan(rayjob_name, context=observed)  # finished: never start it again
        if current.get("phase") == "Invalid" and current.get("observedGeneration") == base.generation:
            return Plan(rayjob_name, context=replace(observed, keep=True))  # refused before: edit to retry
        if current.get("rayJobUID"):
            # Launched once and gone (deleted by hand, by KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES,
            # or past its TTL while the operator was down): never silently started again.
            return Plan(rayjob_name, context=replace(observed, lost=str(current["rayJobUID"])))
        if (missing := _missing_claim(tj, related)) is not None:
            return Plan(rayjob_name, context=replace(observed, blocked=missing))
        *rbac, created = render_trainingjob(tj, config)
        return Plan(
            rayjob_name,
            create=created,
            prerequisites=tuple(rbac),
            on_create=Event(
                "Normal", CREATED, f"created RayJob {rayjob_name}{_suspended(created, observed)}"
            ),
            warnings=tuple(Event("Warning", "PlainSecretValue", w) for w in secret_looking_env(tj)),
            context=observed,
        )

    return _edits(tj, rayjob, rayjob_name, observed)


def _suspended(rayjob: Mapping[str, Any], observed: Observation) -> str:
    """What the creation's Event adds for a RayJob created suspended (its status says no more: the
    phase it starts in gets no Event of its own)."""
    if not (rayjob.get("spec") or {}).get("suspend"):
        return ""
    if observed.queue:
        return f", queued: Kueue (queue {observed.queue}) starts its Ray cluster"
    return ", suspended: no Ray cluster runs until spec.suspend is false"


def _edits(tj: api.TrainingJob, rayjob: Mapping[str, Any], rayjob_name: str, observed: Observation) -> Plan:
    """The plan for a launched job: the spec edits a running RayJob takes (`suspend`) patched, the
    others reported as not applied."""
    launched = applied_spec(rayjob)
    wanted = json.loads(applied_record(tj.spec.wire()))  # compared as recorded: env values digested
    if launched is None:  # not rendered by rayship: report, never overwrite
        return Plan(rayjob_name, context=replace(observed, unapplied=("(RayJob not managed by rayship)",)))
    edits = [p for p in spec_edits(launched, wanted) if not added_with_default(launched, p, wanted)]
    # Under a Kueue queue, Kueue owns the RayJob's spec.suspend (admission): never fight it.
    mutable = [p for p in edits if p in MUTABLE_FIELDS and not tj.spec.scheduling.queue]
    patch = None
    if mutable:
        launched.update({p: wanted[p] for p in mutable})
        patch = {
            "metadata": {"annotations": {names.ANNOTATION_SPEC: applied_record(launched)}},
            "spec": {p: wanted[p] for p in mutable},
        }
    unapplied = tuple(p for p in edits if p not in mutable)
    on_patch = Event("Normal", "RayJobUpdated", f"applied {sorted(mutable)}")
    if startup_deadline_passed(rayjob) and (rayjob.get("spec") or {}).get("ttlSecondsAfterFinished") != 0:
        # The cluster never ran: nothing in it is worth keeping for ttlSecondsAfterFinished, and its
        # pods may hold GPUs. KubeRay reads the TTL at each reconcile (our patch is one): deleted now.
        patch = patch or {"spec": {}}
        patch["spec"]["ttlSecondsAfterFinished"] = 0
        on_patch = Event(
            "Normal", STARTUP_DEADLINE, "the Ray cluster never started: KubeRay deletes it now (TTL set to 0)"
        )
    return Plan(
        rayjob_name,
        patch=patch,
        on_patch=on_patch,
        context=replace(observed, unapplied=unapplied),
    )
