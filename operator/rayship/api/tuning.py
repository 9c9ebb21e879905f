"""TrainingJob `spec.tuning`: the Ray Tune search (dimensions, ASHA, PBT) over the trainer's fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rayship.api.common import ApiModel, CelRule, said_with_values

TUNABLE_FIELDS = ("learningRate", "batchSizePerWorker", "epochs")


class SearchDimension(ApiModel):
    """One dimension of the search space."""

    cel_rules: ClassVar = (
        CelRule(
            "self.distribution in ['choice', 'grid'] || (has(self.low) && has(self.high) && self.low < self.high)",
            "loguniform, uniform and randint need low < high",
            message_expression="has(self.low) && has(self.high) ? "
            + said_with_values(
                "low (",
                "self.low",
                ") is not below high (",
                "self.high",
                "): loguniform, uniform and randint draw from [low, high)",
            )
            + " : 'loguniform, uniform and randint need low and high'",
        ),
        # The API server's CEL cannot see `values` (its items are any JSON, so it has no CEL type):
        # this rule is checked by rayship (CLI and operator), and the CRD keeps minItems: 1.
        CelRule(
            "!(self.distribution in ['choice', 'grid']) || (has(self.values) && size(self.values) > 0)",
            "choice and grid need a non-empty values list",
            in_crd=False,
        ),
        CelRule(
            "self.distribution != 'loguniform' || (has(self.low) && self.low > 0.0)",
            "loguniform needs low > 0",
        ),
        CelRule(
            "self.distribution != 'randint' || (has(self.low) && has(self.high) "
            "&& double(int(self.low)) == self.low && double(int(self.high)) == self.high)",
            "randint needs whole-number low and high",
        ),
    )
    distribution: Literal["loguniform", "uniform", "choice", "randint", "grid"] = Field(
        ...,
        description="loguniform/uniform (floats in [low, high)), randint (integers in [low, high)), "
        "choice (one of values at random), grid (every one of values: numSamples repeats the whole grid).",
    )
    low: float | None = Field(
        None, allow_inf_nan=False, description="Lower bound (loguniform, uniform, randint)."
    )
    high: float | None = Field(
        None, allow_inf_nan=False, description="Upper bound, exclusive (loguniform, uniform, randint)."
    )
    values: list[Any] | None = Field(
        None, min_length=1, max_length=256, description="Candidates (choice, grid)."
    )


class AshaSpec(ApiModel):
    """ASHA's knobs (scheduler: asha), in epochs."""

    max_t: int | None = Field(
        None, ge=1, le=100_000, description="Longest a trial runs (default trainer.epochs)."
    )
    grace_period: int = Field(
        1, ge=1, le=100_000, description="Epochs every trial runs before it can be stopped."
    )
    reduction_factor: float = Field(
        2,
        gt=1,
        le=100,
        allow_inf_nan=False,
        description="1/reductionFactor of the trials go on at each rung.",
    )


class PbtSpec(ApiModel):
    """Population Based Training's knobs (scheduler: pbt), in epochs."""

    perturbation_interval: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Epochs between perturbations: a trial in the bottom quantile then resumes from a "
        "top trial's checkpoint with mutated hyperparameters (a multiple of checkpoint.everyEpochs).",
    )
    quantile_fraction: float = Field(
        0.25,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description="Share of the trials in the top (and the bottom) quantile.",
    )
    resample_probability: float = Field(
        0.25,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Chance that a mutation draws a new value from the search space instead of "
        "perturbing the copied one (x0.8 or x1.2, or a neighbouring choice/grid value).",
    )
    synchronous: bool = Field(
        False,
        description="Every trial waits for the others at each perturbation (Tune's synchronous PBT): "
        "reproducible hand-offs, but every trial restarts from a checkpoint each time.",
    )


class TuningSpec(ApiModel):
    """Hyperparameter search with Ray Tune: each trial is a full Ray Train run."""

    cel_rules: ClassVar = (
        CelRule(
            "self.searchSpace.all(k, k in "
            + str(list(TUNABLE_FIELDS))
            + " || (k.startsWith('config.') && k.size() > 7))",
            "searchSpace keys must be learningRate, batchSizePerWorker, epochs or config.<key>",
        ),
        CelRule(
            "['epochs', 'batchSizePerWorker'].all(k, !(k in self.searchSpace) "
            "|| !has(self.searchSpace[k].low) || self.searchSpace[k].low >= 1.0)",
            "epochs and batchSizePerWorker ranges start at 1 or more",
        ),
        *(
            CelRule(
                f"!('{key}' in self.searchSpace) "
                f"|| self.searchSpace.{key}.distribution in ['randint', 'choice', 'grid']",
                f"tuning.searchSpace.{key}: {key} is a whole number; use distribution randint (or "
                "choice/grid with whole numbers), not uniform or loguniform (floats)",
            )
            for key in ("epochs", "batchSizePerWorker")
        ),
        CelRule(
            "!('learningRate' in self.searchSpace) || !has(self.searchSpace.learningRate.low) "
            "|| self.searchSpace.learningRate.low > 0.0",
            "a learningRate range starts above 0",
        ),
        CelRule(
            "!has(self.asha) || self.scheduler == 'asha'",
            "tuning.asha settings need scheduler: asha (or remove tuning.asha)",
        ),
        CelRule(
            "!has(self.asha) || !has(self.asha.maxT) || self.asha.gracePeriod <= self.asha.maxT",
            "tuning.asha.gracePeriod must not exceed maxT",
            message_expression=said_with_values(
                "tuning.asha.gracePeriod (",
                "self.asha.gracePeriod",
                ") is more than tuning.asha.maxT (",
                "self.asha.maxT",
                ")",
            ),  # fmt: skip
        ),
        CelRule(
            "!has(self.pbt) || self.scheduler == 'pbt'",
            "tuning.pbt settings need scheduler: pbt (or remove tuning.pbt)",
        ),
        CelRule(
            "self.scheduler != 'pbt' || !('epochs' in self.searchSpace)",
            "tuning.searchSpace.epochs: with scheduler pbt every trial trains trainer.epochs (a mutation "
            "cannot change a run's length); remove it from the searchSpace",
        ),
    )
    num_samples: int = Field(4, ge=1, le=1000, description="Number of trials.")
    metric: str = Field("loss", min_length=1, description="Reported metric to optimize.")
    mode: Literal["min", "max"] = Field("min", description="Minimize or maximize the metric.")
    scheduler: Literal["fifo", "asha", "pbt"] = Field(
        "asha",
        description="asha stops poor trials early (by epoch); fifo runs every trial to the end; pbt "
        "(Population Based Training) lets poor trials resume from good trials' checkpoints with "
        "hyperparameters mutated within the searchSpace.",
    )
    asha: AshaSpec | None = Field(None, description="ASHA's knobs (scheduler: asha).")
    pbt: PbtSpec | None = Field(None, description="Population Based Training's knobs (scheduler: pbt).")
    max_concurrent_trials: int = Field(
        1,
        ge=1,
        le=256,
        description=(
            "Trials running at once, each on workers.replicas workers of its own: the job's cluster has "
            "workers.replicas times this many worker pods (at most as many trials as the search runs)."
        ),
    )
    search_space: dict[str, SearchDimension] = Field(
        ..., min_length=1, max_length=32, description="Trainer fields or config.<key> to search over."
    )

    @model_validator(mode="after")
    def _choices_fit_their_field(self) -> TuningSpec:
        """A choice's values must be values its field takes (the API server's CEL cannot type the
        values list: this is checked by rayship, in the CLI and the operator)."""
        wants: dict[str, tuple[str, Callable[[Any], bool]]] = {
            "learningRate": ("a number above 0", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")),
            "epochs": ("a whole number of at least 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "batchSizePerWorker": ("a whole number of at least 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        }  # fmt: skip
        for key, (what, ok) in wants.items():
            dim = self.search_space.get(key)
            bad = [v for v in (dim.values or []) if not ok(v)] if dim else []
            if bad:
                raise ValueError(f"searchSpace.{key}.values must each be {what} (got {bad[:3]!r})")
        if self.scheduler == "pbt" and self.max_concurrent_trials < self.trials():
            raise ValueError(
                f"maxConcurrentTrials: with scheduler pbt the whole population of {self.trials()} trials "
                "(numSamples x grid values) runs at once (PBT compares them and hands checkpoints between "
                f"them); set maxConcurrentTrials to {self.trials()} or more"
            )
        return self

    def trials(self) -> int:
        """How many trials the search runs: numSamples times the grid's combinations."""
        grid = 1
        for dim in self.search_space.values():
            if dim.distribution == "grid":
                grid *= len(dim.values or [])
        return self.num_samples * grid

    def concurrent_trials(self) -> int:
        """How many trials run at once: maxConcurrentTrials, or every trial when there are fewer."""
        return min(self.max_concurrent_trials, self.trials())
