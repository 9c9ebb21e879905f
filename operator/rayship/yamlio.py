"""Serialization: YAML the way Kubernetes reads it (YAML 1.2 numbers, so `2e-5` is a float; PyYAML,
following YAML 1.1, would make it the string "2e-5" and strict validation would then reject it), and
canonical JSON for what rayship stores in annotations and hashes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """SafeLoader plus YAML 1.2 floats written without a dot (1e-3, 2E+5)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_all(text: str) -> Iterator[Any]:
    return yaml.load_all(text, Loader=Loader)  # noqa: S506 (Loader is a SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=Loader)  # noqa: S506


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal values always give equal strings (annotations, hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
