"""What a user wrote that anyone who may read the objects rayship makes can read, or that runs code they
did not write: said as warnings by `rayship render` (pure; the API refuses what is certain, these are
the likely cases, which a rule could not refuse without refusing `max_tokens`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rayship import api

# A key that names a secret as a whole word at its end (hf_token, api_key, db.password): not
# max_tokens, tokenizer or key_prefix, which are settings.
SECRET_KEY = re.compile(
    r"(?i)(^|[_.-])(pass(word|wd)?|secret|token|api_?key|access_?key|private_?key|credentials?)$"
)
# Env names: the rule a TrainingJob's plain env values are warned by (trainingjob.secret_looking_env),
# the same for both kinds; the whole-word SECRET_KEY is for the free-form args, full of settings.
SECRET_ENV_NAME = re.compile(api.SECRET_NAME_PATTERN)
SERVE_CONFIG = (
    "the RayService's serveConfigV2 (readable by anyone who may get rayservices, and on Ray's dashboard)"
)


def _secret_keys(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}"
            if isinstance(key, str) and SECRET_KEY.search(key) and item not in (None, "", False):
                yield path
            yield from _secret_keys(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _secret_keys(item, f"{where}[{i}]")


def _remote_code(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("trust_remote_code", "trustRemoteCode") and item is True:
                yield f"{where}.{key}"
            yield from _remote_code(item, f"{where}.{key}")


def modelservice_warnings(ms: api.ModelService) -> list[str]:
    """Plain env values whose names say they are secrets (in the ModelService itself; its pods read
    them from a Secret of their own), secret-looking keys in application.args and vllm.engineArgs (written
    into serveConfigV2 as they are), and trust_remote_code, which runs the model repository's code."""
    spec = ms.spec
    said = [
        f"spec.env[{i}] {e.name}: a plain value that looks like a secret is readable by whoever may get this "
        "ModelService (its pods read it from a Secret); use valueFrom.secretKeyRef"
        for i, e in enumerate(spec.env)
        if e.value is not None and SECRET_ENV_NAME.search(e.name)
    ]
    free = {"spec.application.args": spec.application.args if spec.application else {},
            "spec.vllm.engineArgs": spec.vllm.engine_args if spec.vllm else {}}  # fmt: skip
    for where, value in free.items():
        said += [
            f"{path}: looks like a secret and is written into {SERVE_CONFIG}; give it by reference "
            "(spec.env[].valueFrom.secretKeyRef, read from the environment by the application)"
            for path in _secret_keys(value, where)
        ]
        said += [
            f"{path}: true runs the Python code that comes with the model's files, with the pod's "
            "identity: serve only models you trust"
            for path in _remote_code(value, where)
        ]
    return said
