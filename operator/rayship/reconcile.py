"""Pure planning: given a TrainingJob and its RayJob (as stored), what should change.

`plan()` does no I/O; the kopf handlers execute the plan through `rayship.k8s`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rayship import names, render
from rayship.api import TERMINAL_PHASES
from rayship.config import OperatorConfig
from rayship.status import Observation
from rayship.validation import SpecError, parse_trainingjob

# Spec fields KubeRay applies to a live RayJob; every other edit after launch is reported.
MUTABLE_FIELDS = frozenset({"suspend"})


@dataclass(frozen=True)
class Plan:
    rayjob_name: str
    create: dict[str, Any] | None  # the RayJob to create (not yet adopted)
    rayjob_patch: dict[str, Any] | None  # a merge patch for the existing RayJob
    observation: Observation  # for status.derive(), once `rayjob` is filled in with the result
    prerequisites: tuple[dict[str, Any], ...] = ()  # created (if absent) before the RayJob


def spec_edits(applied: Any, desired: Any, prefix: str = "") -> list[str]:
    """Dotted paths where `desired` differs from `applied` (lists compared whole)."""
    if isinstance(applied, Mapping) and isinstance(desired, Mapping):
        paths: list[str] = []
        for key in sorted(set(applied) | set(desired)):
            paths += spec_edits(applied.get(key), desired.get(key), f"{prefix}{key}.")
        return paths
    return [] if applied == desired else [prefix.rstrip(".")]


def applied_spec(rayjob: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = (rayjob.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_SPEC)
    return json.loads(raw) if raw else None


def plan(trainingjob: Mapping[str, Any], rayjob: Mapping[str, Any] | None, config: OperatorConfig) -> Plan:
    meta = trainingjob["metadata"]
    rayjob_name = names.rayjob_name(meta["name"])
    current = trainingjob.get("status") or {}
    base = Observation(generation=meta.get("generation", 0), current=current, rayjob_name=rayjob_name)
    try:
        tj = parse_trainingjob(trainingjob)
    except SpecError as err:
        return Plan(rayjob_name, None, None, replace(base, invalid="; ".join(err.problems)))

    gpus = render.total_gpus(tj)
    observed = replace(base, gpus=gpus)
    if rayjob is None:
        if current.get("phase") in TERMINAL_PHASES:
            return Plan(rayjob_name, None, None, observed)  # finished: never start it again
        *rbac, rayjob = render.render_trainingjob(tj, config)
        return Plan(rayjob_name, rayjob, None, observed, prerequisites=tuple(rbac))

    launched = applied_spec(rayjob)
    wanted = tj.spec.wire()
    if launched is None:  # not rendered by rayship: report, never overwrite
        return Plan(
            rayjob_name, None, None, replace(observed, unapplied=("(RayJob not managed by rayship)",))
        )
    edits = spec_edits(launched, wanted)
    mutable = [p for p in edits if p in MUTABLE_FIELDS]
    patch = None
    if mutable:
        launched.update({p: wanted[p] for p in mutable})
        patch = {
            "metadata": {"annotations": {names.ANNOTATION_SPEC: render.canonical_json(launched)}},
            "spec": {p: wanted[p] for p in mutable},
        }
    unapplied = tuple(p for p in edits if p not in MUTABLE_FIELDS)
    return Plan(rayjob_name, None, patch, replace(observed, unapplied=unapplied))
