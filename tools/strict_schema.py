"""Strict validation of objects against CRD schemas, the way a real API server treats them.

CRD schemas do not reject unknown fields (the API server prunes them silently), so a typo in a
rendered manifest would be lost without a trace. Here every object schema that lists `properties`
and lacks `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`; nulls are
dropped and schema defaults applied first, as the API server does. CEL rules
(`x-kubernetes-validations`) are evaluated with rayship's CEL environment (`rayship.api.cel`), as on a create:
transition rules (those that read `oldSelf`) are skipped, as the API server skips them there.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rayship.api import cel

_TRANSITION_RULE = re.compile(r"\boldSelf\b")


def load_crd_schema(path: Path, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON-schema (draft 4) copy of an OpenAPI v3 structural schema that rejects unknown fields."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = strict(schema["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    return out


def drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a `default`, recursively."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            sub = props.get(key) or (
                schema.get("additionalProperties")
                if isinstance(schema.get("additionalProperties"), dict)
                else None
            )
            if sub:
                apply_defaults(sub, item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def typed(schema: dict[str, Any], value: Any) -> Any:
    """The value as the API server hands it to CEL: a JSON integer in a `number` field is a double."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        return {
            k: typed(props.get(k) or (extra if isinstance(extra, dict) else {}), v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [typed(schema.get("items", {}), v) for v in value]
    return value


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Evaluate every x-kubernetes-validations rule on the value it is attached to, as on a create."""
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        if _TRANSITION_RULE.search(rule["rule"]):
            continue
        # rayship's own CEL environment: the Kubernetes quantity library the API server offers too
        if not cel.holds(rule["rule"], typed(schema, value)):
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key) or (extra if isinstance(extra, dict) else None)
            if sub:
                errors += cel_errors(sub, item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


class StrictValidator:
    """Validate objects like the API server would, but refusing what it would silently prune."""

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.validator = jsonschema.Draft4Validator(strict(schema))

    def errors(self, obj: dict[str, Any]) -> list[str]:
        value = apply_defaults(self.schema, drop_nulls(copy.deepcopy(obj)))
        found = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(self.validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
        ]
        return found or cel_errors(self.schema, value)
