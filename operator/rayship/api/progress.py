"""What a training run's workload reports into its TrainingJob's status while it trains
(`status.progress`), and what the next attempt reads back of a report lost with its attempt."""

from __future__ import annotations

from pydantic import Field

from rayship.api.common import ApiModel


class RecoveredReport(ApiModel):
    """Ray Train's record of a run's newest checkpoint and the report that carried it."""

    epoch: int = Field(..., ge=1, description="The epoch of the report.")
    step: int | None = Field(None, ge=0, description="Its optimizer step.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Its metrics (rank 0's).")
    checkpoint: str | None = Field(None, description="URI of the checkpoint.")
    ray_cluster: str | None = Field(
        None, description="The Ray cluster of the attempt that read it back (the next attempt's)."
    )


class ProgressStatus(ApiModel):
    """Training progress reported by the workload."""

    epoch: int | None = Field(None, ge=0, description="Last completed epoch.")
    step: int | None = Field(None, ge=0, description="Last optimizer step.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Latest metrics, e.g. loss.")
    last_checkpoint: str | None = Field(None, description="URI of the latest checkpoint.")
    resumed_from_epoch: int | None = Field(
        None,
        ge=1,
        description="This attempt resumed from the checkpoint of this epoch (after a retry, a restarted "
        "Ray head or a resubmitted job); absent when it started from scratch.",
    )
    stopped_early: bool | None = Field(
        None,
        description="Training stopped at `epoch`, before trainer.epochs: the metric had not improved for "
        "trainer.earlyStopping.patience epochs.",
    )
    checkpoint_epoch: int | None = Field(None, ge=1, description="The epoch of lastCheckpoint.")
    ray_cluster: str | None = Field(
        None,
        description="The Ray cluster of the attempt that reported it (status.attempts[].rayClusterName).",
    )
    recovered: RecoveredReport | None = Field(
        None,
        description="The report of the newest checkpoint as Ray Train registered it, read back when an "
        "attempt starts: the attempt before keeps it when that report was lost as it ended.",
    )
