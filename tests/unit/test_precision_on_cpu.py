"""fp16 asked of CPU workers trains in fp32, said in one line, on the cluster as on a laptop: DeepSpeed
refuses fp16 on a CPU without it ("Type fp16 is not supported on your device": the language model
example failed so on real-0, an AMD EPYC, in the clean-clone CI run of be78727)."""

from __future__ import annotations

import copy

import yaml

from rayship.api.validation import parse_trainingjob
from rayship_workloads.strategies import fp32_on_cpu
from tests.conftest import ROOT

EXAMPLE = yaml.safe_load((ROOT / "examples" / "lm-finetune" / "trainingjob.yaml").read_text())


def example(gpus: int) -> dict:
    """The example as shipped (read as `rayship run` reads it: its working folder is local)."""
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"]["workers"]["gpusPerWorker"] = gpus
    return doc


def test_cpu_workers_train_fp16_as_fp32_and_say_so() -> None:
    tj = parse_trainingjob(example(0), local=True)
    assert tj.spec.trainer.deepspeed.precision == "fp16"
    assert fp32_on_cpu(tj) == "precision fp16 -> fp32: CPUs do not train in fp16"
    assert tj.spec.trainer.deepspeed.precision == "fp32"


def test_gpu_workers_keep_fp16() -> None:
    tj = parse_trainingjob(example(1), local=True)
    assert fp32_on_cpu(tj) is None
    assert tj.spec.trainer.deepspeed.precision == "fp16"
