"""A TrainingJob's attempts as its status records them: each attempt, its worker count as it changed,
and what each of its Ray pods held (rayship.controller.trainingjob.attempts writes them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rayship.api.common import ApiModel

MAX_WORKER_CHANGES = 20  # per attempt: a flapping node cannot grow the status without bound


class WorkerChange(ApiModel):
    """The ready worker count of an attempt's Ray cluster, from a time on."""

    time: str = Field(..., description="When the operator saw it (RFC 3339).")
    ready_workers: int = Field(..., ge=0, description="Worker pods KubeRay counted ready.")


class PodUse(ApiModel):
    """What one Ray pod of an attempt held, and for how long (from the pod's own times)."""

    name: str = Field(..., description="The pod.")
    start_time: str = Field(..., description="When it started on its node (its status.startTime).")
    end_time: str = Field(..., description="When it ended, or when it was last seen running.")
    ended: bool | None = Field(None, description="It has ended (else it is counted until now).")
    deadline: str | None = Field(
        None, description="Its deletion deadline (the kubelet kills it then at the latest)."
    )
    cpus: float = Field(0, ge=0, description="CPUs its containers request.")
    gpus: int = Field(0, ge=0, description="GPUs its containers are limited to.")


class AttemptStatus(ApiModel):
    """One attempt of the job: each runs on a new Ray cluster (KubeRay's retries)."""

    attempt: int = Field(..., ge=1, description="Its number, from 1.")
    start_time: str = Field(..., description="When KubeRay started it (RFC 3339).")
    end_time: str | None = Field(None, description="When it ended (RFC 3339); unset while it runs.")
    outcome: Literal["Succeeded", "Failed", "Suspended"] | None = Field(
        None, description="How it ended (Suspended: its cluster was deleted; a resume starts a new one)."
    )
    reason: str | None = Field(None, description="Why, in KubeRay's or rayship's words.")
    resumed_from_epoch: int | None = Field(
        None, ge=1, description="It resumed from the checkpoint of this epoch (as the workload reported)."
    )
    reached_epoch: int | None = Field(
        None,
        ge=0,
        description="The last epoch it reported (a report lost as it ended and read back by the next "
        "attempt from Ray Train's record of its checkpoint counts: reportRecovered).",
    )
    checkpoint_epoch: int | None = Field(
        None,
        ge=1,
        description="The newest checkpoint it left, from its reports and from the epoch the next attempt "
        "resumed from. Above reachedEpoch: the report of that epoch was lost as the attempt ended "
        "(Event ReportLost).",
    )
    report_recovered: bool | None = Field(
        None,
        description="Its last report (reachedEpoch) was lost as it ended, after Ray Train had registered "
        "its checkpoint; the next attempt's driver read it back from Ray Train's record (Event "
        "ReportRecovered).",
    )
    gpu_seconds: float | None = Field(
        None, ge=0, description="Each of its Ray pods' GPUs x that pod's own running time, summed."
    )
    cpu_seconds: float | None = Field(
        None, ge=0, description="Each of its Ray pods' CPU requests x that pod's own running time, summed."
    )
    ray_cluster_name: str | None = Field(None, description="The Ray cluster it ran on.")
    pods: list[PodUse] | None = Field(
        None,
        description="Its Ray pods while any may still run (their time counts until they are gone); "
        "unset once they are all gone and its figures are final.",
    )
    pods_seen_time: str | None = Field(None, description="When the operator last looked at its pods.")
    worker_changes: list[WorkerChange] = Field(
        default_factory=list,
        max_length=MAX_WORKER_CHANGES,
        description="Each change of its ready worker count while it ran: a worker pod lost (a spot "
        "reclaim, a drain) and back; an elastic job (workers.minReplicas) trains on with fewer. The "
        f"first is the count it started with; the last {MAX_WORKER_CHANGES} are kept.",
    )
