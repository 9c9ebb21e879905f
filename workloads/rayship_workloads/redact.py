"""Secrets out of what the workload prints: a TrainingJob's `spec.env[].value`.

The resolved spec travels in the RayJob entrypoint (the operator's choice; plain `value`s are documented
as never secret, `valueFrom` is for Secrets, but users put tokens in `value` anyway). The workload never
prints or logs the spec; where a spec or a message about it could show, `env[].value` becomes `***`:
`redacted` for documents, `scrub` for text (error messages quoting a value).
"""

from __future__ import annotations

import copy
import json
from typing import Any

REDACTED = "***"


def _env_entries(doc: Any) -> list[dict[str, Any]]:
    """The `env` entries (dicts) of a TrainingJob document, or of its `spec` alone."""
    if not isinstance(doc, dict):
        return []
    spec = doc.get("spec", doc)
    env = spec.get("env") if isinstance(spec, dict) else None
    return [e for e in env if isinstance(e, dict)] if isinstance(env, list) else []


def redacted(doc: Any) -> Any:
    """A copy of a TrainingJob document (or spec) with every `env[].value` replaced by `***`."""
    out = copy.deepcopy(doc)
    for entry in _env_entries(out):
        if "value" in entry:
            entry["value"] = REDACTED
    return out


def _leaves(value: Any) -> list[str]:
    """The scalars inside an (invalid, non-string) value, as text."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [] if value is None or value == "" else [str(value)]


def env_values(doc: Any) -> list[str]:
    """How each `env[].value` of a document could appear in text (its str and JSON forms)."""
    values: set[str] = set()
    for entry in _env_entries(doc):
        value = entry.get("value")
        if value is None or value == "":
            continue
        values |= {str(value), json.dumps(value), repr(value)} | set(_leaves(value))
    return sorted(values, key=len, reverse=True)  # longest first: a value containing another goes whole


def scrub(text: str, doc: Any) -> str:
    """`text` with every `env[].value` of `doc` replaced by `***`."""
    for value in env_values(doc):
        text = text.replace(value, REDACTED)
    return text
