"""The `causal-lm` recipe: a Hugging Face AutoModelForCausalLM trained on next-token prediction over a
`text` column (a byte-level tokenizer built here, or a pretrained one); served by `/generate` and the
OpenAI routes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ray.data
import ray.train
import ray.train.torch
import torch

from rayship import api
from rayship_workloads import data, strategies
from rayship_workloads.recipes.base import EpochHook, ModelSetup, Servable
from rayship_workloads.recipes.loop import loop_spec, train_epochs

# On a cluster, `config.model_path` names a local/PVC directory (from_pretrained, its own tokenizer);
# otherwise `config.model_config` updates `api.CAUSAL_LM_MODEL_CONFIG`, a model built from a config
# (from_config) on byte tokens: UTF-8 bytes, 256 = end of text, 257 = padding (`byte_tokenizer` is
# that scheme as a Hugging Face tokenizer). Exported as a save_pretrained() directory with its
# tokenizer, loaded with from_pretrained (and AutoTokenizer).


def causal_lm_config(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("model_path"):
        return {"model_path": str(config["model_path"])}
    return {"model_config": {**api.CAUSAL_LM_MODEL_CONFIG, **(config.get("model_config") or {})}}


def byte_tokenizer() -> Any:
    """The byte tokens as a Hugging Face fast tokenizer (`transformers.PreTrainedTokenizerFast`): a
    byte-level BPE without merges whose vocabulary maps each byte's GPT-2 symbol to the byte's value,
    plus the end-of-text (also beginning) and padding tokens; `encode` adds no special tokens, so
    `encode(text)` is `list(text.encode("utf-8"))` and `decode` is its inverse."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = bytes_to_unicode()
    eos, pad = "<|endoftext|>", "<|pad|>"
    vocab = {symbols[b]: b for b in range(256)} | {eos: api.BYTE_EOS, pad: api.BYTE_PAD}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=eos,
        eos_token=eos,
        pad_token=pad,
        clean_up_tokenization_spaces=False,
    )


def causal_lm_setup(dataset: ray.data.Dataset, config: Mapping[str, Any]) -> ModelSetup:
    return ModelSetup(causal_lm_config(config))


def build_causal_lm(model_config: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if "model_path" in model_config:
        return AutoModelForCausalLM.from_pretrained(model_config["model_path"], local_files_only=True)
    settings = dict(model_config["model_config"])
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))


def max_length(config: Mapping[str, Any]) -> int:
    """`trainer.config.max_length`: tokens per training sequence (the API checked it)."""
    return int(config.get("max_length", api.CAUSAL_LM_MAX_LENGTH))


def check_positions(model: Any, max_length: int) -> None:
    """A sequence of `max_length` tokens fits the model's position embedding (the API checks what a
    config says; a `model_path` model is known only here)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_length > positions:
        raise ValueError(
            f"trainer.config.max_length: {max_length} tokens do not fit the model's {positions} positions "
            f"(its max_position_embeddings); set max_length <= {positions}"
        )


class Tokens:
    """Batches of text -> (input_ids, attention_mask, labels): bytes, or the model's own tokenizer."""

    def __init__(self, model_config: Mapping[str, Any], max_length: int):
        self.max_length = max_length
        self.tokenizer: Any = None
        if "model_path" in model_config:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_config["model_path"], local_files_only=True)
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if self.tokenizer is not None:
            enc = self.tokenizer(
                texts, max_length=self.max_length, truncation=True, padding="max_length", return_tensors="pt"
            )
            ids, mask = enc["input_ids"], enc["attention_mask"]
        else:
            rows = [list(t.encode("utf-8"))[: self.max_length - 1] + [api.BYTE_EOS] for t in texts]
            ids = torch.full((len(rows), self.max_length), api.BYTE_PAD, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)  # no loss on padding
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def causal_lm_loop(config: dict[str, Any], on_epoch_end: EpochHook | None = None) -> None:
    """Next-token prediction on a `text` column (`config.engine: hf-trainer` runs `hf_trainer.loop`
    instead: `train.loop_for` picks it)."""
    rayship = config["rayship"]
    spec = loop_spec(config)
    batch_size = spec.trainer.batch_size_per_worker
    device = ray.train.torch.get_device()
    tokens = Tokens(rayship["model_config"], max_length(config))

    # [1] prepare data: this worker's shard of the text dataset
    shard = ray.train.get_dataset_shard("train")

    # [2] prepare the model: DDP, DeepSpeed or FSDP
    torch.manual_seed(data.seed(config))
    model = build_causal_lm(rayship["model_config"])
    check_positions(model, tokens.max_length)
    strategy = strategies.create(spec.trainer, model)

    def batch_losses(source: Any) -> Iterator[tuple[torch.Tensor, int]]:
        for batch in source.iter_batches(batch_size=batch_size, batch_format="numpy"):
            inputs = {k: v.to(device) for k, v in tokens([str(t) for t in batch[data.TEXT]]).items()}
            yield strategy.model(**inputs).loss, int((inputs["labels"] != -100).sum())

    # [3] resume from the latest checkpoint, if this run has one; [4] train, evaluate on the validation
    # shard (with data.validation), and report every epoch
    train_epochs(strategy, config, shard, batch_losses, on_epoch_end=on_epoch_end, perplexity=True)


def export_causal_lm(directory: Path, setup: ModelSetup, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A Hugging Face save_pretrained() directory (and the tokenizer, for `model_path`)."""
    model = build_causal_lm(setup.config)
    loaded = model.load_state_dict(state, strict=False)  # tied weights (lm_head = embeddings) are stored once
    missing = [k for k in loaded.missing_keys if not k.startswith("lm_head.")]
    if missing or loaded.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing}, unexpected {loaded.unexpected_keys}"
        )
    model.save_pretrained(str(directory))
    if "model_path" in setup.config:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(setup.config["model_path"], local_files_only=True)
    else:
        tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(str(directory))  # AutoTokenizer.from_pretrained(<the model>) works
    return {"tokenizer": "pretrained"}


class ByteTokenizer:
    """`"tokenizer": "bytes"` (a model saved without a tokenizer, e.g. by `models.save_model`): UTF-8
    bytes are the token ids; ids >= 256 are special and decode to nothing."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class PretrainedTokenizer:
    """`"tokenizer": "pretrained"`: the Hugging Face tokenizer saved in the model directory."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))


class CausalLMGenerator:
    """Greedy decoding with a Hugging Face causal LM and its tokenizer (on the model's device)."""

    def __init__(self, model: Any, tokenizer: ByteTokenizer | PretrainedTokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """The ids greedy decoding appends to `ids`."""
        input_ids = torch.tensor([ids], device=next(self.model.parameters()).device)
        config = self.model.config
        pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return list(output[0, len(ids) :].tolist())


def load_causal_lm(directory: Path, manifest: dict[str, Any]) -> Servable:
    from transformers import AutoModelForCausalLM

    kind = manifest.get("tokenizer", "pretrained")
    tokenizer: ByteTokenizer | PretrainedTokenizer
    if kind == "bytes":
        tokenizer = ByteTokenizer()
    elif kind == "pretrained":
        tokenizer = PretrainedTokenizer(directory)
    else:
        raise ValueError(
            f"{directory}: unknown tokenizer {kind!r} in the manifest; expected 'bytes' or 'pretrained'"
        )
    model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
    return Servable(model, generator=CausalLMGenerator(model, tokenizer))
