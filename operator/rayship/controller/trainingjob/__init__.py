"""TrainingJob: render the RayJob, plan a reconcile, derive the status. Pure: no I/O, no clock.

- render: a validated TrainingJob in, the KubeRay `ray.io/v1` objects out (golden-tested), built on
  the shared pod builders in `rayship.controller.pods`. Everything cluster-specific comes in via `OperatorConfig`.
- plan: given the TrainingJob and its RayJob as stored, what should change (`conditions.Plan`).
- status: one lookup table maps KubeRay's (jobDeploymentStatus, jobStatus) to our phase; the
  conditions are derived from the phase, so they never contradict it. Only operator-owned fields
  are returned; `progress` and `checkpoint` belong to the workload and are never touched here.

(KubeRay's rayjob_controller is the model: one module per kind over shared builders.)
"""

from __future__ import annotations

from rayship.controller.trainingjob.phase import (
    ANY,
    BLOCKED_REASONS,
    CREATED,
    PHASE_CONDITIONS,
    PHASE_TABLE,
    WORKLOAD_FIELDS,
    Observation,
    announce,
    derive,
    look_again_in,
    phase_of,
    pods_going,
    ray_pods,
    starting_pods,
    status,
)
from rayship.controller.trainingjob.planner import (
    MUTABLE_FIELDS,
    applied_spec,
    claim_to_check,
    plan,
    spec_edits,
)
from rayship.controller.trainingjob.rayjob import (
    JOB_MODULE,
    SECRET_NAME,
    STUCK_REASONS,
    applied_record,
    build_rayjob,
    build_workload_rbac,
    render_trainingjob,
    resolved_spec,
    secret_looking_env,
    spec_secret,
    total_gpus,
    train_entrypoint,
    workload_document,
    workload_env,
)

__all__ = [
    "STUCK_REASONS",
    "JOB_MODULE",
    "resolved_spec",
    "workload_document",
    "applied_record",
    "SECRET_NAME",
    "secret_looking_env",
    "train_entrypoint",
    "spec_secret",
    "workload_env",
    "build_rayjob",
    "build_workload_rbac",
    "render_trainingjob",
    "total_gpus",
    "MUTABLE_FIELDS",
    "spec_edits",
    "applied_spec",
    "claim_to_check",
    "plan",
    "ANY",
    "CREATED",
    "PHASE_TABLE",
    "PHASE_CONDITIONS",
    "Observation",
    "phase_of",
    "derive",
    "WORKLOAD_FIELDS",
    "starting_pods",
    "ray_pods",
    "look_again_in",
    "pods_going",
    "status",
    "BLOCKED_REASONS",
    "announce",
]
