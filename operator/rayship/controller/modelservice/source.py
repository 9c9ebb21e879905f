"""Where a ModelService's model comes from: `spec.model.uri`, or a TrainingJob's exported model once it
Succeeded (and the PVC it lives on); a missing or failed TrainingJob is a condition, never a crash, and a
service that already resolved a model keeps serving it when its TrainingJob is deleted."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rayship import api


@dataclass(frozen=True)
class Resolution:
    uri: str | None  # the model to serve (None: nothing to serve yet)
    reason: str  # condition reason for ModelAvailable
    message: str
    volume: api.PvcStorage | None = None  # the PVC the model is read from (mounted read-only)
    missing: str | None = None  # the TrainingJob named that does not exist (reason TrainingJobNotFound)


def _still_serving(served: str, volume: api.PvcStorage | None, reason: str, why: str) -> Resolution:
    """The model Serve was last confirmed to serve, kept while its source cannot give one (`why`)."""
    return Resolution(served, reason, f"{why}; still serving {served}", volume)


def _job_volume(trainingjob: Mapping[str, Any]) -> api.PvcStorage | None:
    """The checkpoint PVC of a TrainingJob, where its exported model lives."""
    pvc = ((trainingjob.get("spec") or {}).get("checkpoint") or {}).get("storage", {}).get("pvc")
    return api.PvcStorage.model_validate(pvc) if pvc else None


def _stored_volume(current: Mapping[str, Any]) -> api.PvcStorage | None:
    stored = current.get("modelVolume")
    return api.PvcStorage.model_validate(stored) if stored else None


def resolve_source(
    source: api.ModelSource,
    trainingjob: Mapping[str, Any] | None,
    served: str | None,
    served_volume: api.PvcStorage | None,
    storage: api.PvcStorage | None,
    *,
    engine: str = "rayship",
) -> Resolution:
    """One model: its `uri` (read from `storage`, if any), or the export of the TrainingJob it names
    (or of the run its TrainingSchedule promoted: then `trainingjob` is that schedule); `served` (and
    `served_volume`) is the URI Serve was last confirmed to serve for it, kept while the job cannot
    give one. `engine` vllm takes only language models."""
    if source.uri:
        return Resolution(source.uri, "ModelURI", f"serving {source.uri}", storage)
    if source.from_training_schedule is not None:
        return _from_schedule(source.from_training_schedule, trainingjob, served, served_volume, engine)
    ref = source.from_training_job
    assert ref is not None  # the API guarantees exactly one source
    if trainingjob is None:
        if served:
            return _still_serving(
                served, served_volume, "TrainingJobDeleted", f"TrainingJob {ref.name} was deleted"
            )
        return Resolution(
            None, "TrainingJobNotFound", f"TrainingJob {ref.name} does not exist (yet)", missing=ref.name
        )
    tj_status = trainingjob.get("status") or {}
    phase = tj_status.get("phase") or "Pending"
    if phase != "Succeeded":
        reason = "TrainingJobFailed" if phase in ("Failed", "Invalid") else "TrainingJobNotSucceeded"
        if served:
            return _still_serving(served, served_volume, reason, f"TrainingJob {ref.name} is {phase}")
        return Resolution(None, reason, f"waiting for TrainingJob {ref.name} to succeed (it is {phase})")
    recipe = ((trainingjob.get("spec") or {}).get("trainer") or {}).get("recipe")
    if engine == "vllm" and recipe == "mlp":
        return Resolution(
            None,
            "NotALanguageModel",
            f"engine vllm serves causal language models; TrainingJob {ref.name} trains recipe mlp "
            "(serve it with engine: rayship)",
        )
    key = "model" if ref.checkpoint == "latest" else "bestModel"
    uri = (tj_status.get("checkpoint") or {}).get(key)
    if not uri:
        return Resolution(
            None,
            "NoExportedModel",
            f"TrainingJob {ref.name} succeeded but reports no status.checkpoint.{key}",
        )
    return Resolution(
        uri,
        "FromTrainingJob",
        f"serving the {ref.checkpoint} model of TrainingJob {ref.name}: {uri}",
        _job_volume(trainingjob),
    )


# The TrainingJobs of the namespace a TrainingJobNotFound message names, at most.
NAMES_SHOWN = 10


def trainingjob_not_found(name: str, namespace: str, existing: Sequence[str]) -> str:
    """Why a service waits for TrainingJob `name`, with the TrainingJobs that do exist in its namespace
    (the first NAMES_SHOWN) and the closest one: a typo otherwise waits forever."""
    found = f"TrainingJob {name} does not exist (yet) in namespace {namespace}"
    names = sorted(set(existing))
    if not names:
        return f"{found}; there is no TrainingJob there"
    guess = difflib.get_close_matches(name, names, n=1)
    there = f"did you mean {guess[0]}? TrainingJobs there" if guess else "TrainingJobs there"
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return f"{found}; {there}: {', '.join(names[:NAMES_SHOWN])}{more}"


def _from_schedule(
    ref: api.FromTrainingSchedule,
    schedule: Mapping[str, Any] | None,
    served: str | None,
    served_volume: api.PvcStorage | None,
    engine: str,
) -> Resolution:
    """The model of the run `schedule` promoted last (its status.promoted): a newer promoted run is a
    new model, rolled out as any. A run that failed the gate is never promoted, so never served."""
    what = f"TrainingSchedule {ref.name}"
    if schedule is None:
        if served:
            return _still_serving(served, served_volume, "TrainingScheduleDeleted", f"{what} was deleted")
        return Resolution(None, "TrainingScheduleNotFound", f"{what} does not exist (yet)")
    promoted = (schedule.get("status") or {}).get("promoted") or {}
    if not promoted.get("job"):
        # A live service switched to follow a schedule keeps what it serves until a run passes the gate
        # (as a TrainingJob not yet succeeded does): switching never takes it down.
        waiting = f"waiting for {what} to promote a run (none has passed its gate yet)"
        if served:
            return _still_serving(served, served_volume, "NothingPromoted", waiting)
        return Resolution(None, "NothingPromoted", waiting)
    template = ((schedule.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}
    if engine == "vllm" and (template.get("trainer") or {}).get("recipe") == "mlp":
        return Resolution(
            None,
            "NotALanguageModel",
            f"engine vllm serves causal language models; {what} trains recipe mlp (serve it with engine: rayship)",
        )
    key = "model" if ref.checkpoint == "latest" else "bestModel"
    uri = promoted.get(key)
    if not uri:
        return Resolution(
            None, "NoExportedModel", f"{what} promoted {promoted['job']}, which reports no {key}"
        )
    volume = api.PvcStorage.model_validate(promoted["volume"]) if promoted.get("volume") else None
    message = f"serving the {ref.checkpoint} model of {promoted['job']}, promoted by {what}: {uri}"
    return Resolution(uri, "FromTrainingSchedule", message, volume)


def resolve_model(
    ms: api.ModelService, trainingjob: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Resolution:
    """`spec.model`, given the TrainingJob it names (if any) and the status as read."""
    assert ms.spec.model is not None
    storage = ms.spec.storage.pvc if ms.spec.storage else None
    return resolve_source(
        ms.spec.model,
        trainingjob,
        current.get("modelURI"),
        _stored_volume(current),
        storage,
        engine=ms.spec.engine,
    )


ONE = ""  # the key of spec.model's URI among a service's models (spec.models names are never empty)
KEPT_REASONS = (
    "ModelURI",
    "FromTrainingJob",
    "FromTrainingSchedule",
)  # a model resolved with nothing to report


@dataclass(frozen=True)
class Resolved:
    """Every model of a service (`spec.model` as ONE, or each of `spec.models` by name) resolved, or
    why not. The service deploys only when all are (one model still waiting holds the whole config)."""

    each: dict[str, Resolution]
    clash: str | None = None  # two models' PVCs cannot be mounted together

    @property
    def models(self) -> dict[str, str] | None:
        """name -> URI of every model, or None while any is not resolved."""
        if self.clash is not None or any(r.uri is None for r in self.each.values()):
            return None
        return {name: cast(str, r.uri) for name, r in sorted(self.each.items())}

    @property
    def volumes(self) -> tuple[api.PvcStorage, ...]:
        """The models' PVCs, each once, in a stable order (mounted read-only on every Ray pod)."""
        found = {(v.claim_name, v.mount_path): v for r in self.each.values() if (v := r.volume) is not None}
        return tuple(found[key] for key in sorted(found))

    @property
    def reason(self) -> str:
        if self.clash is not None:
            return "ModelVolumesClash"
        if ONE in self.each:
            return self.each[ONE].reason
        waiting = [r for _, r in sorted(self.each.items()) if r.uri is None]
        if waiting:
            return waiting[0].reason
        noted = [r.reason for _, r in sorted(self.each.items()) if r.reason not in KEPT_REASONS]
        return noted[0] if noted else "ModelsResolved"

    @property
    def message(self) -> str:
        if self.clash is not None:
            return self.clash
        if ONE in self.each:
            return self.each[ONE].message
        items = sorted(self.each.items())
        said = "; ".join(f"model {name}: {r.message}" for name, r in items)
        waiting = [name for name, r in items if r.uri is None]
        if waiting:
            return f"waiting for {', '.join(waiting)} (nothing changes until every model resolves): {said}"
        return said


def _volume_clash(each: Mapping[str, Resolution]) -> str | None:
    """Two models read from different PVCs mounted at the same path cannot be served together."""
    at: dict[str, tuple[str, str]] = {}
    for name, r in sorted(each.items()):
        if r.volume is None:
            continue
        seen = at.setdefault(r.volume.mount_path, (name, r.volume.claim_name))
        if seen[1] != r.volume.claim_name:
            return (
                f"models {seen[0]} and {name} are on PVCs {seen[1]} and {r.volume.claim_name}, both mounted "
                f"at {r.volume.mount_path}: give their TrainingJobs different checkpoint.storage.pvc.mountPath"
            )
    return None


def model_status_by_name(current: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """status.models as read, by name."""
    entries = current.get("models") or []
    return {e["name"]: e for e in entries if isinstance(e, Mapping) and isinstance(e.get("name"), str)}


def resolve(
    ms: api.ModelService, related: Mapping[tuple[str, str], Mapping[str, Any]], current: Mapping[str, Any]
) -> Resolved:
    """Every model of the service; `related` are the TrainingJobs and TrainingSchedules it names that
    exist, by (kind, name)."""

    def job(source: api.ModelSource) -> Mapping[str, Any] | None:
        if (schedule := source.from_training_schedule) is not None:
            return related.get((api.TRAINING_SCHEDULE.kind, schedule.name))
        ref = source.from_training_job
        return related.get((api.TRAINING_JOB.kind, ref.name)) if ref is not None else None

    if ms.spec.models is None:
        assert ms.spec.model is not None  # the API guarantees exactly one of model and models
        return Resolved({ONE: resolve_model(ms, job(ms.spec.model), current)})
    storage = ms.spec.storage.pvc if ms.spec.storage else None
    served = model_status_by_name(current)
    each: dict[str, Resolution] = {}
    for name, source in sorted(ms.spec.models.items()):
        entry = served.get(name) or {}
        volume = api.PvcStorage.model_validate(entry["volume"]) if entry.get("volume") else None
        each[name] = resolve_source(source, job(source), entry.get("uri"), volume, storage)
    return Resolved(each, _volume_clash(each))


def _referenced(ms: Mapping[str, Any], field: str) -> list[str]:
    """The names (same namespace) a ModelService document's sources give under `field`, sorted: in
    `spec.model` or each `spec.models.<name>`."""
    spec = ms.get("spec") or {}
    sources = [spec.get("model")] + list((spec.get("models") or {}).values())
    found = {
        ref.get("name")
        for source in sources
        if isinstance(source, Mapping) and isinstance(ref := source.get(field), Mapping)
    }
    return sorted(n for n in found if isinstance(n, str))


def referenced_trainingjobs(ms: Mapping[str, Any]) -> list[str]:
    """The TrainingJobs whose models a ModelService document serves (`fromTrainingJob`)."""
    return _referenced(ms, "fromTrainingJob")


def referenced_schedules(ms: Mapping[str, Any]) -> list[str]:
    """The TrainingSchedules whose promoted runs a ModelService document serves (`fromTrainingSchedule`)."""
    return _referenced(ms, "fromTrainingSchedule")
