"""The recipe registry: one `Recipe` record per built-in `trainer.recipe`, and bring-your-own train
loops (`trainer.entrypoint: module:function`).

A recipe is everything rayship knows about one kind of model:
- `data_kind`: the data it trains on (`data.load`: tabular rows, or a text column);
- `model_setup`: its model config, worked out from the data and `trainer.config`;
- `loop`: its Ray Train `train_loop_per_worker`;
- `export`: its weights in the serving layout (`models.export` adds the manifest);
- `load`: that model back, ready to serve (`models.load`, used by `serve`).

Adding a recipe: write those in its own module (like `mlp.py`), add its `Recipe` to
`registry.RECIPES`, and add its name to `TrainerSpec.recipe` in `operator/rayship/api/trainer.py`. Nothing else names a recipe.

Every loop receives `config` = the TrainingJob's `trainer.config`, the common hyperparameters from
the trainer fields (`lr` and `learningRate`, `batch_size`, `epochs`), and a `rayship` key: the resolved
spec in its camelCase wire form (`spec`; its `env[].value`s read `***`: they are in the process
environment, and the spec is not a place for secrets), the model config (`model_config`) and the setup's extras
(e.g. the feature columns), `storage_root` and `run_name`. Own loops get the same, with the data as
written (`own_loop_setup`: its `columns`). The dataset shards are `train` and, with `data.validation`,
`validation`. The loops mark their Ray steps `# [1] prepare data ... # [4] report`.
"""

from __future__ import annotations

from rayship_workloads.recipes.base import (
    STATE,
    EpochHook,
    ModelSetup,
    Recipe,
    Servable,
    TextGenerator,
    TrainLoop,
)
from rayship_workloads.recipes.causal_lm import (
    ByteTokenizer,
    CausalLMGenerator,
    PretrainedTokenizer,
    Tokens,
    build_causal_lm,
    byte_tokenizer,
    causal_lm_config,
    causal_lm_loop,
    causal_lm_setup,
    check_positions,
    export_causal_lm,
    load_causal_lm,
    max_length,
)
from rayship_workloads.recipes.loop import (
    EARLY_STOPPING,
    EVAL_LOSS,
    STOPPED_EARLY,
    Checkpointer,
    EarlyStopping,
    Evaluation,
    Run,
    Start,
    checkpoint_name,
    evaluation,
    global_mean,
    job_metric,
    loop_spec,
    preempted,
    report,
    resume,
    run_epochs,
    validation_shard,
)
from rayship_workloads.recipes.mlp import (
    MLP,
    MLP_WEIGHTS,
    FeaturesAndLabel,
    build_mlp,
    export_mlp,
    load_mlp,
    mlp_config,
    mlp_loop,
    mlp_setup,
)
from rayship_workloads.recipes.registry import (
    RECIPES,
    data_kind,
    for_trainer,
    get,
    names,
    own_loop_setup,
    resolve_entrypoint,
    run_own_loop,
    setup,
    train_loop,
)

__all__ = [
    "TrainLoop",
    "EpochHook",
    "STATE",
    "ModelSetup",
    "TextGenerator",
    "Servable",
    "Recipe",
    "loop_spec",
    "preempted",
    "checkpoint_name",
    "Run",
    "Start",
    "Checkpointer",
    "resume",
    "report",
    "EVAL_LOSS",
    "Evaluation",
    "validation_shard",
    "global_mean",
    "evaluation",
    "job_metric",
    "EARLY_STOPPING",
    "STOPPED_EARLY",
    "EarlyStopping",
    "run_epochs",
    "train_epochs",
    "MLP_WEIGHTS",
    "MLP",
    "mlp_config",
    "build_mlp",
    "mlp_setup",
    "FeaturesAndLabel",
    "mlp_loop",
    "export_mlp",
    "load_mlp",
    "causal_lm_config",
    "byte_tokenizer",
    "causal_lm_setup",
    "build_causal_lm",
    "max_length",
    "check_positions",
    "Tokens",
    "causal_lm_loop",
    "export_causal_lm",
    "ByteTokenizer",
    "PretrainedTokenizer",
    "CausalLMGenerator",
    "load_causal_lm",
    "RECIPES",
    "own_loop_setup",
    "get",
    "names",
    "for_trainer",
    "setup",
    "data_kind",
    "run_own_loop",
    "train_loop",
    "resolve_entrypoint",
]
