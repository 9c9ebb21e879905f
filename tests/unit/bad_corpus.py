"""Invalid TrainingJobs: each case breaks one rule. The CLI, the pydantic models and the generated
CRD (schema + CEL) must all reject every one, and name the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Doc = dict[str, Any]


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    *parents, last = path.split(".")

    def mutate(doc: Doc) -> None:
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _delete(path: str) -> Callable[[Doc], None]:
    *parents, last = path.split(".")

    def mutate(doc: Doc) -> None:
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def _all(*mutations: Callable[[Doc], None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        for m in mutations:
            m(doc)

    return mutate


# (id, mutation of the DDP sample, text the error must contain: the field path)
SPEC_CASES: list[tuple[str, Callable[[Doc], None], str]] = [
    ("unknown-trainer-field", _set("spec.trainer.epoch", 3), "spec.trainer.epoch"),
    ("unknown-top-spec-field", _set("spec.replicas", 3), "spec.replicas"),
    ("recipe-and-entrypoint", _set("spec.trainer.entrypoint", "pkg.mod:loop"), "spec.trainer"),
    ("neither-recipe-nor-entrypoint", _delete("spec.trainer.recipe"), "spec.trainer"),
    ("unknown-recipe", _set("spec.trainer.recipe", "resnet"), "spec.trainer.recipe"),
    (
        "bad-entrypoint",
        _all(_delete("spec.trainer.recipe"), _set("spec.trainer.entrypoint", "no-colon")),
        "spec.trainer.entrypoint",
    ),
    ("bad-strategy", _set("spec.trainer.strategy", "horovod"), "spec.trainer.strategy"),
    ("fsdp-without-strategy", _set("spec.trainer.fsdp", {"precision": "fp32"}), "spec.trainer"),
    ("mlflow-without-tracking-uri", _set("spec.tracking", {"mlflow": {}}), "spec.tracking.mlflow"),
    (
        "mlflow-bad-tracking-uri",
        _set("spec.tracking", {"mlflow": {"trackingUri": "mlflow.example:5000"}}),
        "spec.tracking.mlflow.trackingUri",
    ),
    (
        "early-stopping-on-own-loop",
        _all(
            _delete("spec.trainer.recipe"),
            _set("spec.trainer.entrypoint", "pkg.mod:loop"),
            _set("spec.trainer.earlyStopping", {"patience": 2}),
        ),
        "spec.trainer",
    ),
    (
        "early-stopping-no-patience",
        _set("spec.trainer.earlyStopping", {}),
        "spec.trainer.earlyStopping.patience",
    ),
    (
        "early-stopping-negative-delta",
        _set("spec.trainer.earlyStopping", {"patience": 1, "minDelta": -0.1}),
        "spec.trainer.earlyStopping.minDelta",
    ),
    (
        "fsdp-bad-precision",
        _all(_set("spec.trainer.strategy", "fsdp"), _set("spec.trainer.fsdp", {"precision": "fp8"})),
        "spec.trainer.fsdp.precision",
    ),
    (
        "zero-stage-4",
        _all(_set("spec.trainer.strategy", "deepspeed"), _set("spec.trainer.deepspeed", {"zeroStage": 4})),
        "spec.trainer.deepspeed.zeroStage",
    ),
    ("deepspeed-without-strategy", _set("spec.trainer.deepspeed", {"zeroStage": 2}), "spec.trainer"),
    (
        "offload-params-stage-2",
        _all(
            _set("spec.trainer.strategy", "deepspeed"),
            _set("spec.trainer.deepspeed", {"zeroStage": 2, "offloadParams": True}),
        ),
        "spec.trainer.deepspeed",
    ),
    (
        "bad-precision",
        _all(
            _set("spec.trainer.strategy", "deepspeed"), _set("spec.trainer.deepspeed", {"precision": "fp8"})
        ),
        "spec.trainer.deepspeed.precision",
    ),
    ("zero-epochs", _set("spec.trainer.epochs", 0), "spec.trainer.epochs"),
    ("epochs-string", _set("spec.trainer.epochs", "ten"), "spec.trainer.epochs"),
    ("negative-lr", _set("spec.trainer.learningRate", -0.1), "spec.trainer.learningRate"),
    ("zero-batch", _set("spec.trainer.batchSizePerWorker", 0), "spec.trainer.batchSizePerWorker"),
    ("negative-replicas", _set("spec.workers.replicas", -1), "spec.workers.replicas"),
    ("zero-replicas", _set("spec.workers.replicas", 0), "spec.workers.replicas"),
    ("min-replicas-above-replicas", _set("spec.workers.minReplicas", 3), "workers.minReplicas"),
    ("min-replicas-zero", _set("spec.workers.minReplicas", 0), "spec.workers.minReplicas"),
    (
        "negative-max-preemptions",
        _set("spec.failurePolicy.maxPreemptions", -1),
        "spec.failurePolicy.maxPreemptions",
    ),
    ("negative-gpus", _set("spec.workers.gpusPerWorker", -1), "spec.workers.gpusPerWorker"),
    ("too-many-gpus", _set("spec.workers.gpusPerWorker", 64), "spec.workers.gpusPerWorker"),
    ("zero-cpus", _set("spec.workers.cpusPerWorker", 0), "spec.workers.cpusPerWorker"),
    ("bad-memory", _set("spec.workers.memoryPerWorker", "16GB"), "spec.workers.memoryPerWorker"),
    ("bad-gpu-product", _set("spec.workers.gpuProduct", "NVIDIA A100 80GB"), "spec.workers.gpuProduct"),
    (
        "bad-toleration-operator",
        _set("spec.workers.tolerations", [{"key": "a", "operator": "In"}]),
        "spec.workers.tolerations[0].operator",
    ),
    ("bad-head-memory", _set("spec.head.memory", "lots"), "spec.head.memory"),
    ("uri-source-without-uri", _set("spec.data", {"source": "uri"}), "spec.data"),
    ("uri-without-source", _set("spec.data", {"uri": "/data/x.parquet"}), "spec.data"),
    ("uri-unknown-extension", _set("spec.data", {"source": "uri", "uri": "s3://b/data.bin"}), "spec.data"),
    (
        "bad-data-format",
        _set("spec.data", {"source": "uri", "uri": "s3://b/d", "format": "avro"}),
        "spec.data.format",
    ),
    ("missing-checkpoint", _delete("spec.checkpoint"), "checkpoint.storage is required in a cluster"),
    ("ray-too-old-for-token-auth", _set("spec.rayVersion", "2.51.0"), "spec.rayVersion"),
    ("deadline-beyond-int32", _set("spec.failurePolicy.activeDeadlineSeconds", 2**31), "spec.failurePolicy"),
    ("ttl-beyond-int32", _set("spec.ttlSecondsAfterFinished", 2**31), "spec.ttlSecondsAfterFinished"),
    ("checkpoint-both-storages", _set("spec.checkpoint.storage.uri", "s3://b/c"), "spec.checkpoint.storage"),
    ("checkpoint-no-storage", _set("spec.checkpoint.storage", {}), "spec.checkpoint.storage"),
    (
        "checkpoint-bad-uri",
        _set("spec.checkpoint.storage", {"uri": "ftp://x/y"}),
        "spec.checkpoint.storage.uri",
    ),
    ("checkpoint-keep-zero", _set("spec.checkpoint.keep", 0), "spec.checkpoint.keep"),
    (
        "pvc-relative-mount",
        _set("spec.checkpoint.storage.pvc.mountPath", "ckpt"),
        "spec.checkpoint.storage.pvc.mountPath",
    ),
    ("negative-retries", _set("spec.failurePolicy.retries", -1), "spec.failurePolicy.retries"),
    (
        "zero-deadline",
        _set("spec.failurePolicy.activeDeadlineSeconds", 0),
        "spec.failurePolicy.activeDeadlineSeconds",
    ),
    ("negative-ttl", _set("spec.ttlSecondsAfterFinished", -5), "spec.ttlSecondsAfterFinished"),
    ("suspend-string", _set("spec.suspend", "yes"), "spec.suspend"),
    ("bad-queue", _set("spec.scheduling.queue", "team a"), "spec.scheduling.queue"),
    (
        "env-inline-and-secret",
        _set(
            "spec.env",
            [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        "spec.env[0]",
    ),
    (
        "env-configmap-ref",
        _set("spec.env", [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]),
        "spec.env[0].valueFrom",
    ),
    ("env-duplicate", _set("spec.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]), "spec"),
    # credentials where the object is readable: around, before the host, in the query, in pip's entries
    (
        "uri-leading-blank-credential",
        _set("spec.tracking", {"mlflow": {"trackingUri": " https://u:pw@mlflow.example.com"}}),
        "spec.tracking.mlflow.trackingUri",
    ),
    (
        "uri-presigned-s3",
        _set(
            "spec.data",
            {
                "source": "uri",
                "format": "parquet",
                "uri": "https://b.s3.amazonaws.com/d.parquet?X-Amz-Credential=A&X-Amz-Signature=f00",
            },
        ),
        "data.uri: a signature or token in the query",
    ),
    (
        "uri-azure-sas",
        _set("spec.checkpoint.storage", {"uri": "abfs://c@acct.dfs.core.windows.net/ck?sv=2024&sig=abc"}),
        "checkpoint.storage.uri: a signature or token in the query",
    ),
    (
        "pip-index-url",
        _set("spec.runtimeEnv", {"pip": ["--index-url https://u:pw@pypi.example.com/simple"]}),
        "runtimeEnv.pip: pip options",
    ),
    (
        "pip-requirements-file",
        _set("spec.runtimeEnv", {"pip": ["-r /etc/passwd"]}),
        "runtimeEnv.pip: pip options",
    ),
    (
        "pip-extra-index",
        _set("spec.runtimeEnv", {"pip": ["torch", " --extra-index-url=https://evil.example"]}),
        "runtimeEnv.pip: pip options",
    ),
    (
        "pip-git-token",
        _set("spec.runtimeEnv", {"pip": ["git+https://me:ghp_x@github.com/o/r.git"]}),
        "runtimeEnv.pip: a credential",
    ),
    (
        "pip-direct-url-signed",
        _set("spec.runtimeEnv", {"pip": ["pkg @ https://h.example/p.whl?token=t"]}),
        "runtimeEnv.pip: a credential",
    ),
    ("env-reserved", _set("spec.env", [{"name": "RAYSHIP_TRAININGJOB", "value": "x"}]), "spec.env"),
    ("env-gpu-runtime", _set("spec.env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), "spec.env"),
    (
        "runtime-env-gpu-runtime",
        _set("spec.runtimeEnv", {"envVars": {"NVIDIA_DRIVER_CAPABILITIES": "all"}}),
        "spec.runtimeEnv",
    ),
    ("env-bad-name", _set("spec.env", [{"name": "1A", "value": "x"}]), "spec.env[0].name"),
    ("bad-ray-version", _set("spec.rayVersion", "latest"), "spec.rayVersion"),
    ("name-too-long", _set("metadata.name", "x" * 64), "metadata.name"),
    ("name-uppercase", _set("metadata.name", "MyJob"), "metadata.name"),
    ("trainer-not-mapping", _set("spec.trainer", "mlp"), "spec.trainer"),
    # What the API server or the kubelet would reject later (issue: hardening), rejected at apply time:
    (
        "toleration-exists-with-value",
        _set("spec.workers.tolerations", [{"key": "a", "operator": "Exists", "value": "x"}]),
        "spec.workers.tolerations[0]",
    ),
    (
        "toleration-seconds-without-noexecute",
        _set("spec.workers.tolerations", [{"key": "a", "operator": "Exists", "tolerationSeconds": 30}]),
        "spec.workers.tolerations[0]",
    ),
    (
        "toleration-bad-key",
        _set("spec.workers.tolerations", [{"key": "bad key!", "operator": "Exists"}]),
        "key",
    ),
    ("toleration-bad-value", _set("spec.workers.tolerations", [{"key": "a", "value": "b c"}]), "value"),
    (
        "toleration-equal-without-key",
        _set("spec.workers.tolerations", [{"value": "x"}]),
        "spec.workers.tolerations[0]",
    ),
    ("node-selector-bad-key", _set("spec.workers.nodeSelector", {"bad key": "x"}), "spec.workers"),
    (
        "node-selector-bad-value",
        _set("spec.workers.nodeSelector", {"zone": "a b"}),
        "spec.workers.nodeSelector",
    ),
    (
        "secret-ref-bad-name",
        _set("spec.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}]),
        "secretKeyRef.name",
    ),
    (
        "secret-ref-bad-key",
        _set("spec.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}]),
        "secretKeyRef.key",
    ),
    ("cpu-below-1m", _set("spec.workers.cpusPerWorker", 0.0001), "spec.workers.cpusPerWorker"),
    ("memory-zero", _set("spec.workers.memoryPerWorker", "0"), "memoryPerWorker must be at least 64Mi"),
    ("memory-milli", _set("spec.workers.memoryPerWorker", "1m"), "spec.workers.memoryPerWorker"),
    ("memory-half-byte", _set("spec.workers.memoryPerWorker", "0.5"), "memoryPerWorker must be at least"),
    ("memory-100ki", _set("spec.head.memory", "100Ki"), "memory must be at least 64Mi"),
    ("memory-beyond-int64", _set("spec.workers.memoryPerWorker", "9Ei"), "below 8Ei"),
    ("image-with-space", _set("spec.image", "my image:1"), "spec.image"),
    (
        "mount-path-dev-shm",
        _set("spec.checkpoint.storage", {"pvc": {"claimName": "c", "mountPath": "/dev/shm"}}),
        "spec.checkpoint.storage.pvc",
    ),
    (
        "tune-epochs-below-1",
        _set("spec.tuning", {"searchSpace": {"epochs": {"distribution": "randint", "low": 0, "high": 5}}}),
        "epochs and batchSizePerWorker ranges start at 1",
    ),
    # a credential in a URI is readable by anyone who may read the object (and on Ray's dashboard)
    (
        "credential-in-tracking-uri",
        _set("spec.tracking", {"mlflow": {"trackingUri": "https://alice:s3cret@mlflow.example.com"}}),
        "tracking.mlflow.trackingUri: a credential in the URI",
    ),
    (
        "credential-in-data-uri",
        _set("spec.data", {"source": "uri", "uri": "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/train.parquet"}),
        "data.uri: a credential in the URI",
    ),
    (
        "token-in-working-dir",
        _set("spec.runtimeEnv", {"workingDir": "https://ghp_abc123@example.com/code.zip"}),
        "runtimeEnv.workingDir: a credential in the URI",
    ),
    (
        "credential-in-checkpoint-uri",
        _set("spec.checkpoint.storage", {"uri": "s3://key:secret@bucket/ckpt"}),
        "checkpoint.storage.uri: a credential in the URI",
    ),
    (
        "tune-batch-size-as-floats",
        _set(
            "spec.tuning",
            {"searchSpace": {"batchSizePerWorker": {"distribution": "uniform", "low": 16.0, "high": 64.0}}},
        ),
        "tuning.searchSpace.batchSizePerWorker: batchSizePerWorker is a whole number; use distribution randint",
    ),
    (
        "tune-epochs-as-floats",
        _set("spec.tuning", {"searchSpace": {"epochs": {"distribution": "loguniform", "low": 1, "high": 8}}}),
        "tuning.searchSpace.epochs: epochs is a whole number",
    ),
    (
        "tune-randint-floats",
        _set(
            "spec.tuning", {"searchSpace": {"config.h": {"distribution": "randint", "low": 0.5, "high": 3.5}}}
        ),
        "randint needs whole-number",
    ),
    (
        "tune-empty-config-key",
        _set("spec.tuning", {"searchSpace": {"config.": {"distribution": "uniform", "low": 0, "high": 1}}}),
        "searchSpace keys must be",
    ),
    (
        "tune-lr-range-not-positive",
        _set(
            "spec.tuning",
            {"searchSpace": {"learningRate": {"distribution": "uniform", "low": -1, "high": 1}}},
        ),
        "a learningRate range starts above 0",
    ),
    # spec.runtimeEnv (issue 12): a local folder only for `rayship run` and `rayship apply` (the API
    # server refuses any, naming the field; rayship packs one that exists, and names one that does not),
    # a file:// zip only on the job's claim, no secrets in plain envVars
    (
        "runtime-env-local-folder-in-cluster",
        _set("spec.runtimeEnv", {"workingDir": "no-such-folder"}),
        "spec.runtimeEnv",
    ),
    (
        "runtime-env-secret-looking-var",
        _set("spec.runtimeEnv", {"envVars": {"HF_TOKEN": "hf_abc"}}),
        "spec.runtimeEnv",
    ),
    ("runtime-env-bad-var-name", _set("spec.runtimeEnv", {"envVars": {"1X": "y"}}), "spec.runtimeEnv"),
    ("runtime-env-pip-not-a-list", _set("spec.runtimeEnv", {"pip": "torch"}), "spec.runtimeEnv.pip"),
    # a relative data path is read beside the YAML by `rayship run`; a cluster reads it from workingDir only
    (
        "data-uri-relative-in-cluster",
        _set("spec.data", {"source": "uri", "uri": "data/train.csv"}),
        "data.uri: in a cluster a relative path",
    ),
    (
        "validation-uri-relative-in-cluster",
        _set("spec.data.validation", {"uri": "val.csv"}),
        "data.validation.uri: in a cluster a relative path",
    ),
    (
        "validation-fraction-and-uri",
        _set("spec.data.validation", {"fraction": 0.1, "uri": "/data/val.csv"}),
        "spec.data.validation",
    ),
    (
        "validation-fraction-too-big",
        _set("spec.data.validation", {"fraction": 0.9}),
        "spec.data.validation.fraction",
    ),
    (
        "validation-format-without-uri",
        _set("spec.data.validation", {"fraction": 0.1, "format": "csv"}),
        "spec.data.validation",
    ),
    ("checkpoint-mode-unknown", _set("spec.checkpoint.mode", "best"), "spec.checkpoint.mode"),
    (
        "asha-knobs-with-fifo",
        _set(
            "spec.tuning",
            {
                "scheduler": "fifo",
                "asha": {"gracePeriod": 2},
                "searchSpace": {"epochs": {"distribution": "grid", "values": [1, 2]}},
            },
        ),
        "spec.tuning",
    ),
    (
        "asha-grace-over-max",
        _set(
            "spec.tuning",
            {
                "asha": {"gracePeriod": 5, "maxT": 2},
                "searchSpace": {"learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}},
            },
        ),
        "spec.tuning",
    ),
    (
        "asha-reduction-factor-one",
        _set(
            "spec.tuning",
            {
                "asha": {"reductionFactor": 1},
                "searchSpace": {"learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}},
            },
        ),
        "spec.tuning.asha.reductionFactor",
    ),
    (
        "pbt-knobs-with-asha",
        _set(
            "spec.tuning",
            {
                "scheduler": "asha",
                "pbt": {"perturbationInterval": 2},
                "searchSpace": {"learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}},
            },
        ),
        "spec.tuning",
    ),
    (
        "pbt-mutating-epochs",
        _set(
            "spec.tuning",
            {
                "scheduler": "pbt",
                "numSamples": 1,
                "maxConcurrentTrials": 2,
                "searchSpace": {"epochs": {"distribution": "grid", "values": [1, 2]}},
            },
        ),
        "spec.tuning",
    ),
    (
        "pbt-quantile-over-half",
        _set(
            "spec.tuning",
            {
                "scheduler": "pbt",
                "pbt": {"quantileFraction": 0.6},
                "searchSpace": {"learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}},
            },
        ),
        "spec.tuning.pbt.quantileFraction",
    ),
    (
        "pbt-interval-between-checkpoints",
        _all(
            _set("spec.checkpoint.everyEpochs", 2),
            _set(
                "spec.tuning",
                {
                    "scheduler": "pbt",
                    "numSamples": 1,
                    "pbt": {"perturbationInterval": 3},
                    "searchSpace": {
                        "learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}
                    },
                },
            ),
        ),
        "spec",
    ),
    (
        "pbt-own-loop",
        _all(
            _set("spec.trainer", {"entrypoint": "my_loop:train"}),
            _set(
                "spec.tuning",
                {
                    "scheduler": "pbt",
                    "numSamples": 1,
                    "searchSpace": {
                        "learningRate": {"distribution": "loguniform", "low": 0.001, "high": 0.1}
                    },
                },
            ),
        ),
        "spec",
    ),
]

# Rejected by rayship (the CLI and the operator: phase Invalid) though no CRD rule can say it: the
# API server's CEL cannot type a list of any JSON, measure an object, or see integers past int64.
RAYSHIP_ONLY_CASES: list[tuple[str, Callable[[Doc], None], str]] = [
    # every loop gets lr/learningRate/batch_size/epochs from the trainer fields; config may not shadow them
    (
        "config-sets-lr",
        _set("spec.trainer.config", {"lr": 0.1}),
        "config.lr: set by rayship from trainer.learningRate",
    ),
    (
        "engine-unknown",
        _all(_set("spec.trainer.recipe", "causal-lm"), _set("spec.trainer.config", {"engine": "keras"})),
        "config.engine: 'keras' is not an engine of recipe causal-lm; causal-lm runs on loop or hf-trainer",
    ),
    (
        "fsdp-on-hf-trainer",
        _all(
            _set("spec.trainer.recipe", "causal-lm"),
            _set("spec.trainer.strategy", "fsdp"),
            _set("spec.trainer.config", {"engine": "hf-trainer"}),
        ),
        "strategy: fsdp runs on the causal-lm recipe's own loop, not on config.engine hf-trainer",
    ),
    (
        "max-length-past-positions",
        _all(_set("spec.trainer.recipe", "causal-lm"), _set("spec.trainer.config", {"max_length": 512})),
        "config.max_length: 512 tokens do not fit the model's 128 positions (config.model_config.n_positions)",
    ),
    (
        "max-length-past-own-positions",
        _all(
            _set("spec.trainer.recipe", "causal-lm"),
            _set("spec.trainer.config", {"max_length": 40, "model_config": {"n_positions": 32}}),
        ),
        "config.max_length: 40 tokens do not fit the model's 32 positions (config.model_config.n_positions)",
    ),
    (
        "max-length-not-a-number",
        _all(_set("spec.trainer.recipe", "causal-lm"), _set("spec.trainer.config", {"max_length": "long"})),
        "config.max_length: 'long' is not a whole number of tokens >= 2",
    ),
    (
        "engine-for-mlp",
        _set("spec.trainer.config", {"engine": "hf-trainer"}),
        "config.engine: 'hf-trainer' is not an engine of recipe mlp",
    ),
    (
        "pbt-population-not-at-once",
        _set(
            "spec.tuning",
            {
                "scheduler": "pbt",
                "numSamples": 2,
                "maxConcurrentTrials": 3,
                "searchSpace": {"config.h": {"distribution": "grid", "values": [1, 2]}},
            },
        ),
        "maxConcurrentTrials: with scheduler pbt the whole population of 4 trials",
    ),
    (
        "tune-grid-without-values",
        _set("spec.tuning", {"searchSpace": {"config.h": {"distribution": "grid"}}}),
        "choice and grid need a non-empty values list",
    ),
    (
        "tune-lr-choice-of-junk",
        _set(
            "spec.tuning",
            {"searchSpace": {"learningRate": {"distribution": "choice", "values": [-1, "x", None]}}},
        ),
        "searchSpace.learningRate.values",
    ),
    (
        "tune-choice-without-values",
        _set("spec.tuning", {"searchSpace": {"config.h": {"distribution": "choice"}}}),
        "choice and grid need a non-empty values list",
    ),
    ("int-beyond-int64", _set("spec.trainer.config", {"x": 2**63}), "spec.trainer.config.x"),
    ("spec-over-64kib", _set("spec.trainer.config", {"blob": "x" * 70_000}), "bytes serialized"),
]

# Refused by the API server's own checks of metadata (it validates labels and annotations itself: no
# CRD rule holds them), and by rayship before anything is sent: (id, mutation, the field said).
METADATA_CASES: list[tuple[str, Callable[[Doc], None], str]] = [
    ("label-key-with-a-space", _set("metadata.labels", {"bad key": "x"}), "metadata.labels: key 'bad key'"),
    ("label-value-of-64", _set("metadata.labels", {"team": "x" * 64}), "metadata.labels: team="),
    ("label-value-with-a-space", _set("metadata.labels", {"team": "a b"}), "metadata.labels: team="),
    (
        "label-name-of-64",
        _set("metadata.labels", {"example.com/" + "n" * 64: "x"}),
        "metadata.labels: key 'example.com/nnn",
    ),
    ("label-prefix-uppercase", _set("metadata.labels", {"Example.com/team": "a"}), "metadata.labels: key"),
    ("annotation-key-two-slashes", _set("metadata.annotations", {"a/b/c": "x"}), "metadata.annotations: key"),
    (
        "annotations-over-256-kib",
        _set("metadata.annotations", {"note": "x" * (256 * 1024)}),
        "metadata.annotations: 262148 bytes in all",
    ),
]

# Documents the CLI must reject before any field is looked at: (id, file text, expected message part)
_TJ = "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\n"
_SPEC = "spec:\n  workers: {replicas: 1}\n  trainer:\n    recipe: mlp\n"

TEXT_CASES: list[tuple[str, str, str]] = [
    (
        "duplicate-key",
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\nkind: ModelService\n",
        "duplicate key 'kind'",
    ),
    ("nested-1000-deep", "a: " + "[" * 1000 + "]" * 1000 + "\n", "nested more than 64 levels"),
    ("5000-digit-integer", "a: " + "9" * 5000 + "\n", "a value cannot be read"),
    (
        "billion-laughs",
        "a: &a [x,x,x,x,x,x,x,x,x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
        ),
        "more than 64 aliases",
    ),
    (
        "kind-is-a-list",
        "apiVersion: rayship.dev/v1alpha1\nkind: [TrainingJob]\n",
        "kind: ['TrainingJob'] is not a rayship kind",
    ),
    ("over-4-mib", "a: " + "x" * (4 * 1024 * 1024 + 1) + "\n", "larger than 4 MiB"),
    ("not-yaml", "apiVersion: [unclosed\n", "not valid YAML at line"),
    ("empty-file", "", "no documents found"),
    # numbers JSON has no form for, and control characters, anywhere in any kind: one line each
    (
        "nan-learning-rate",
        _TJ + "metadata: {name: x}\nspec:\n  trainer: {recipe: mlp, learningRate: .nan}\n",
        "spec.trainer.learningRate: nan is not a number JSON can hold (.nan, .inf): give a finite number",
    ),
    (
        "inf-in-free-config",
        _TJ + "metadata: {name: x}\nspec:\n  trainer: {recipe: mlp, config: {scale: -.inf}}\n",
        "spec.trainer.config.scale: -inf is not a number JSON can hold",
    ),
    (
        "inf-in-a-modelservice",
        "apiVersion: rayship.dev/v1alpha1\nkind: ModelService\nmetadata: {name: x}\n"
        "spec:\n  resources: {cpus: .inf}\n",
        "spec.resources.cpus: inf is not a number JSON can hold",
    ),
    (
        "nul-in-time-zone",
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingSchedule\nmetadata: {name: x}\n"
        'spec: {schedule: "0 3 * * *", timeZone: "Europe/Paris\\0"}\n',
        "spec.timeZone: holds the control character '\\x00': remove it",
    ),
    (
        "escape-in-a-key",
        _TJ + 'metadata: {name: x}\nspec:\n  trainer: {recipe: mlp, config: {"a\\eb": 1}}\n',
        "spec.trainer.config: the key 'a\\x1bb' holds a control character: remove it",
    ),
    ("only-comments", "# nothing here\n", "no documents found"),
    # metadata as the API server takes it: a namespace is a DNS-1123 label; YAML tags make no JSON
    *(
        (
            f"namespace-{case}",
            f"{_TJ}metadata:\n  name: x\n  namespace: {value}\n{_SPEC}",
            "metadata.namespace: ",
        )
        for case, value in (
            ("empty", '""'),
            ("10k-chars", "a" * 10_000),
            ("emoji", '"\U0001f600"'),
            ("nul", '"a\\0b"'),
            ("spaces", '"my team"'),
            ("upper-case", "Team"),
        )
    ),
    (
        "name-binary-tag",
        f"{_TJ}metadata:\n  name: !!binary bWxwLWRkcA==\n{_SPEC}",
        "metadata.name: a !!binary value is not JSON: write it as a plain string",
    ),
    (
        "config-set-tag",
        f"{_TJ}metadata: {{name: x}}\n{_SPEC}    config: !!set {{a, b}}\n",
        "spec.trainer.config: a !!set",
    ),
    ("a-list", "- a\n- b\n", "expected a mapping"),
    ("a-scalar", "hello\n", "expected a mapping"),
    (
        "wrong-kind",
        "apiVersion: rayship.dev/v1alpha1\nkind: RayJob\nmetadata: {name: x}\nspec: {}\n",
        "kind: 'RayJob' is not a rayship kind",
    ),
    (
        "missing-kind",
        "apiVersion: rayship.dev/v1alpha1\nmetadata: {name: x}\n",
        "kind: None is not a rayship kind",
    ),
    (
        "wrong-api-version",
        "apiVersion: rayship.dev/v1\nkind: TrainingJob\nmetadata: {name: x}\nspec: {}\n",
        "apiVersion: 'rayship.dev/v1' is not served",
    ),
    (
        "missing-metadata",
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\nspec: {}\n",
        "metadata: required field is missing",
    ),
    (
        "missing-spec",
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\n",
        "spec: required field is missing",
    ),
    (
        "tabs-in-yaml",
        "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\n\tmetadata: {}\n",
        "not valid YAML",
    ),
]

# Bad input whose whole message is said here, word for word, as `rayship render` prints it after
# "error: FILE: ": (id, sample the mutation applies to, the mutation, the one line). What a new user
# writes most often (a memory unit from another world, a quoted or milli CPU, a lower bound above the
# upper one) gets the fix with the values, not a regular expression.
_MS = "modelservice-from-trainingjob.yaml"
_PIPELINE = "../../examples/pipeline/modelservice.yaml"
_QUANTITY = "is not a Kubernetes quantity; use"
MESSAGE_CASES: list[tuple[str, str, Callable[[Doc], None], str]] = [
    *(
        (
            f"memory-{value.replace(' ', '-')}",
            "trainingjob-ddp.yaml",
            _set("spec.workers.memoryPerWorker", value),
            f"spec.workers.memoryPerWorker: {value!r} {_QUANTITY} 16Gi (binary) or 16G (decimal)",
        )
        for value in ("16GB", "16gb", "16G B", "16g")
    ),
    *(
        (
            f"memory-{value.replace(' ', '-')}",
            "trainingjob-ddp.yaml",
            _set("spec.workers.memoryPerWorker", value),
            f"spec.workers.memoryPerWorker: {value!r} {_QUANTITY} 16Gi",
        )
        for value in ("16 Gi", "16GiB", "16gi", "16 GiB")
    ),
    (
        "memory-megabytes",
        "trainingjob-ddp.yaml",
        _set("spec.head.memory", "512MB"),
        f"spec.head.memory: '512MB' {_QUANTITY} 512Mi (binary) or 512M (decimal)",
    ),
    (
        "memory-kilobytes",
        "trainingjob-ddp.yaml",
        _set("spec.head.memory", "900000KB"),
        f"spec.head.memory: '900000KB' {_QUANTITY} 900000Ki (binary) or 900000k (decimal)",
    ),
    (
        "memory-milli",
        "trainingjob-ddp.yaml",
        _set("spec.workers.memoryPerWorker", "512m"),
        "spec.workers.memoryPerWorker: '512m' is thousandths of a byte (m is milli); use 512Mi (binary) or "
        "512M (decimal)",
    ),
    (
        "memory-words",
        "trainingjob-ddp.yaml",
        _set("spec.head.memory", "lots"),
        "spec.head.memory: 'lots' is not a Kubernetes quantity: a number and a unit, e.g. 16Gi (binary) or "
        "16G (decimal)",
    ),
    (
        "service-memory",
        _MS,
        _set("spec.resources.memory", "8 GB"),
        f"spec.resources.memory: '8 GB' {_QUANTITY} 8Gi (binary) or 8G (decimal)",
    ),
    (
        "cpu-milli",
        "trainingjob-ddp.yaml",
        _set("spec.workers.cpusPerWorker", "500m"),
        "spec.workers.cpusPerWorker: '500m' is not a number of CPU cores; use 0.5 (m is a thousandth of a core)",
    ),
    (
        "cpu-quoted",
        "trainingjob-ddp.yaml",
        _set("spec.head.cpus", "2"),
        "spec.head.cpus: '2' is a string, not a number of CPU cores; use 2 (without quotes)",
    ),
    (
        "cpu-cores-word",
        _MS,
        _set("spec.resources.cpus", "4 cores"),
        "spec.resources.cpus: '4 cores' is not a number of CPU cores; use 4",
    ),
    (
        "cpu-actor-milli",
        _PIPELINE,
        _all(
            _set("spec.application.runtimeEnv.workingDir", "s3://b/pipeline.zip"),
            _set("spec.deployments.Preprocess.rayActorOptions.numCpus", "250m"),
        ),
        "spec.deployments.Preprocess.rayActorOptions.numCpus: '250m' is not a number of CPU cores; use 0.25 "
        "(m is a thousandth of a core)",
    ),
    (
        "replicas-min-above-max",
        _MS,
        _set("spec.replicas", {"min": 5, "max": 3}),
        "spec.replicas.min (5) is more than spec.replicas.max (3)",
    ),
    (
        "replicas-initial-outside",
        _MS,
        _set("spec.replicas", {"min": 1, "max": 3, "initial": 4}),
        "spec.replicas.initial (4) is not within spec.replicas.min..spec.replicas.max (1..3)",
    ),
    (
        "workers-min-replicas-above-replicas",
        "trainingjob-ddp.yaml",
        _set("spec.workers.minReplicas", 3),
        "spec.workers.minReplicas (3) is more than spec.workers.replicas (2), the most workers the job trains on",
    ),
    (
        "autoscaling-min-above-max",
        _PIPELINE,
        _all(
            _set("spec.application.runtimeEnv.workingDir", "s3://b/pipeline.zip"),
            _set("spec.deployments.Model.autoscaling", {"minReplicas": 4, "maxReplicas": 2}),
        ),
        "spec.deployments.Model.autoscaling.minReplicas (4) is more than "
        "spec.deployments.Model.autoscaling.maxReplicas (2)",
    ),
    (
        "autoscaling-initial-outside",
        _PIPELINE,
        _all(
            _set("spec.application.runtimeEnv.workingDir", "s3://b/pipeline.zip"),
            _set(
                "spec.deployments.Model.autoscaling",
                {"minReplicas": 1, "maxReplicas": 2, "initialReplicas": 3},
            ),
        ),
        "spec.deployments.Model.autoscaling.initialReplicas (3) is not within "
        "spec.deployments.Model.autoscaling.minReplicas..spec.deployments.Model.autoscaling.maxReplicas (1..2)",
    ),
    (
        "asha-grace-above-max-t",
        "trainingjob-tuning.yaml",
        _set("spec.tuning.asha", {"gracePeriod": 5, "maxT": 3}),
        "spec.tuning.asha.gracePeriod (5) is more than spec.tuning.asha.maxT (3)",
    ),
    (
        "search-low-above-high",
        "trainingjob-tuning.yaml",
        _set(
            "spec.tuning.searchSpace.learningRate", {"distribution": "loguniform", "low": 0.5, "high": 0.05}
        ),
        "spec.tuning.searchSpace.learningRate: low (0.5) is not below high (0.05): loguniform, uniform and "
        "randint draw from [low, high)",
    ),
]

# YAML a parser cannot read: (id, file text, what `rayship render` says after "not valid YAML "). The
# parser's own words (libyaml's, or PyYAML's where libyaml is absent) end the line in parentheses.
_HEAD = "apiVersion: rayship.dev/v1alpha1\nkind: TrainingJob\n"
YAML_CASES: list[tuple[str, str, str]] = [
    (
        "indented-too-far",
        f"{_HEAD}metadata:\n  name: x\n    namespace: team-a\n",
        "at line 5, column 14 ('namespace: team-a'): YAML did not expect a key here: check the indentation "
        "of line 5 (spaces, aligned with its siblings), or quote a value that holds ': ' "
        "(mapping values are not allowed in this context)",
    ),
    (
        "colon-in-value",
        f"{_HEAD}metadata: {{name: x}}\nspec:\n  image: repo/img: v1\n",
        "at line 5, column 18 ('image: repo/img: v1'): YAML did not expect a key here: check the indentation "
        "of line 5 (spaces, aligned with its siblings), or quote a value that holds ': ' "
        "(mapping values are not allowed in this context)",
    ),
    (
        "indented-too-little",
        f"{_HEAD}spec:\n  workers:\n    replicas: 2\n   memoryPerWorker: 1Gi\n",
        "at line 6, column 4 ('memoryPerWorker: 1Gi'): YAML expected a key at this indentation: check the "
        "indentation of line 6 (spaces, aligned with its siblings) (did not find expected key)",
    ),
    (
        "no-colon",
        f"{_HEAD}metadata:\n  name: x\n  labels\n  team: a\n",
        "at line 5, column 3 ('labels'): YAML expected 'key: value' on line 5: add the ':' after the key, "
        "or indent the line under the one above if it continues its value (could not find expected ':')",
    ),
    (
        "tab",
        f"{_HEAD}metadata:\n\tname: x\n",
        "at line 4, column 1 ('\\tname: x'): YAML indents with spaces only: replace the tab on line 4 with "
        "spaces (found character that cannot start any token)",
    ),
    (
        "tab-in-value",
        f"{_HEAD}\tmetadata: {{}}\n",
        "at line 3, column 1 ('\\tmetadata: {}'): YAML indents with spaces only: replace the tab on line 3 "
        "with spaces (found a tab character that violates indentation)",
    ),
    (
        "list-item-misaligned",
        f"{_HEAD}spec:\n  env:\n    - name: A\n     - name: B\n",
        "at line 6, column 6 ('- name: B'): YAML expected a list item ('- ') at this indentation: check the "
        "indentation of line 6 (aligned with the items above it) (did not find expected '-' indicator)",
    ),
    (
        "list-not-closed",
        f"{_HEAD}metadata: {{name: x}}\nspec:\n  tolerations: [a, b\n",
        "at line 5, column 16 ('tolerations: [a, b'): the '[' here is not closed: end the list with ']' "
        "(items separated by ',') (did not find expected ',' or ']')",
    ),
    (
        "mapping-not-closed",
        f"{_HEAD}metadata: {{name: x\nspec: {{}}\n",
        "at line 3, column 11 ('metadata: {name: x'): the '{' here is not closed: end the mapping with '}' "
        "(entries separated by ',') (did not find expected ',' or '}')",
    ),
    (
        "quote-not-closed",
        f"{_HEAD}metadata:\n  name: 'x\nspec: {{}}\n",
        'at line 4, column 9 ("name: \'x"): the quote here is not closed: end the value with the same '
        "quote (found unexpected end of stream)",
    ),
    (
        "at-sign",
        f"{_HEAD}metadata:\n  name: @x\n",
        "at line 4, column 9 ('name: @x'): a plain value cannot start with '@': quote the value "
        "(found character that cannot start any token)",
    ),
    (
        "undefined-alias",
        f"{_HEAD}metadata:\n  name: *x\n",
        "at line 4, column 9 ('name: *x'): an alias (*x) with no anchor (&x) before it: define the anchor, "
        "or quote a value that starts with '*' (found undefined alias)",
    ),
]
