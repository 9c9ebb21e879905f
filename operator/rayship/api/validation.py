"""Turn a user's document into a validated API object, or a `SpecError` that names each bad field
and says how to fix it. Used by the CLI and by the operator (same rules, same words)."""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ValidationError

from rayship import api

# What a pattern means, in words a user can act on.
PATTERN_HINTS = {
    api.QUANTITY_PATTERN: "a Kubernetes quantity such as 16Gi, 512Mi or 2",
    api.DNS1123_LABEL_PATTERN: "lowercase letters, digits and '-', starting and ending with a letter or digit",
    api.LABEL_VALUE_PATTERN: "a label value: letters, digits, '-', '_' and '.', at most 63 characters",
    api.ENV_NAME_PATTERN: "letters, digits and '_', not starting with a digit",
    api.ENTRYPOINT_PATTERN: "module:function, e.g. mypkg.train:train_loop",
    api.IMPORT_PATH_PATTERN: "module:attribute, e.g. myapp.serve:app_builder",
    api.RAY_VERSION_PATTERN: "a Ray version of at least 2.52.0 (token auth), such as 2.60.0",
    r"^(s3|gs|abfs|hdfs)://.+": "an object-store URI such as s3://bucket/checkpoints",
    r"^/.*": "an absolute path such as /mnt/checkpoints",
    api.SCHEDULE_PATTERN: "a cron schedule: five fields (minute hour day-of-month month day-of-week, "
    "e.g. '0 3 * * *') or one of " + ", ".join(api.CRON_MACROS) + " (a time zone goes in spec.timeZone)",
}


class SpecError(ValueError):
    """Invalid input: one line per problem, each starting with the field path."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside Optional[...] / list[...] / dict[str, ...], if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


def _keyed(annotation: Any) -> bool:
    """Whether a field is a mapping (dict[str, ...], optional or not): its next path part is a key."""
    if typing.get_origin(annotation) is dict:
        return True
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and any(
        map(_keyed, typing.get_args(annotation))
    )


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    key_next = False  # the part after a mapping field is one of its keys, not a field name
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int) or key_next:
            key_next = False
            continue
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part), None)
        current = _inner_model(field.annotation) if field is not None else None
        key_next = field is not None and _keyed(field.annotation)
    return current


def _allowed(model: type[BaseModel] | None) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()] if model else []


def shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: an error line stays one line whatever was given."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _describe(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = field_path(loc) or model.__name__
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed(_model_at(model, loc[:-1]))
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        return f"{path}: unknown field; {hint}allowed here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        if pattern in (api.MEMORY_PATTERN, api.QUANTITY_PATTERN):
            return f"{path}: {memory_fix(value)}"
        return f"{path}: {shown(value)} is not valid: expected {PATTERN_HINTS.get(pattern, f'to match {pattern}')}"
    if kind in ("float_type", "float_parsing") and isinstance(value, str) and "cpu" in str(loc[-1]).lower():
        return f"{path}: {cpu_fix(value)}"
    if kind == "value_error":
        return _rule_failed(path, str(loc[-1]) if loc else "", error["msg"].removeprefix("Value error, "))
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{path}: expected a mapping of fields, got {type(value).__name__} {shown(value)}"
    return f"{path}: {error['msg'][0].lower()}{error['msg'][1:]} (got {shown(value)})"


def _rule_failed(path: str, name: str, message: str) -> str:
    """A rule of the object at `path` failed. A message that says the values of the object's own fields,
    each as `name.field (value)` (a rule's messageExpression: `replicas.min (5) is more than replicas.max
    (3)`), says each field by its whole path instead: `spec.replicas.min (5) is more than
    spec.replicas.max (3)`."""
    if not name or not re.match(rf"{re.escape(name)}\.[\w.]+ \(", message):
        return f"{path}: {message}"
    # each `name.` that starts a path (not one inside a path, such as `x.name.`; `a..name.` does)
    return re.sub(rf"(?<!\w)(?<!\w\.){re.escape(name)}\.(?=\w)", f"{path}.", message)


# A memory size as users write it elsewhere: 16GB, 16 gb, 16 GiB, 512MB (number, unit letter, i, B).
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtTpPeE])\s*([iI]?)\s*((?:[bB](?:ytes?)?)?)\s*")


def memory_fix(value: Any) -> str:
    """Why `value` is not a memory quantity, and the quantity it most likely means: '16GB' -> use 16Gi
    (binary) or 16G (decimal); '16 GiB' -> use 16Gi; '512m' (milli) -> 512Mi or 512M."""
    found = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return f"{shown(value)} is not a Kubernetes quantity: a number and a unit, e.g. 16Gi (binary) or 16G (decimal)"
    number, letter, binary, byte = found.groups()
    binary_unit, decimal_unit = f"{letter.upper()}i", "k" if letter in "kK" else letter.upper()
    if binary:
        return f"{shown(value)} is not a Kubernetes quantity; use {number}{binary_unit}"
    both = f"{number}{binary_unit} (binary) or {number}{decimal_unit} (decimal)"
    if letter == "m" and not byte:
        return f"{shown(value)} is thousandths of a byte (m is milli); use {both}"
    return f"{shown(value)} is not a Kubernetes quantity; use {both}"


_CORES = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(m|cores?|cpus?|vcpus?)?\s*", re.IGNORECASE)


def cpu_fix(value: str) -> str:
    """Why a string is not a number of CPU cores, and the number it most likely means: '500m' -> 0.5;
    '2' (quoted) -> 2; '4 cores' -> 4."""
    found = _CORES.fullmatch(value)
    if found is None:
        return f"{shown(value)} is not a number of CPU cores, e.g. 4 or 0.5"
    number, unit = found.group(1), (found.group(2) or "").lower()
    if unit == "m":
        cores = format((Decimal(number) / 1000).normalize(), "f")
        return f"{shown(value)} is not a number of CPU cores; use {cores} (m is a thousandth of a core)"
    if not unit:
        return f"{shown(value)} is a string, not a number of CPU cores; use {number} (without quotes)"
    return f"{shown(value)} is not a number of CPU cores; use {number}"


def problems(model: type[BaseModel], err: ValidationError) -> list[str]:
    return [_describe(model, e) for e in err.errors(include_url=False)]


INT64 = (-(2**63), 2**63 - 1)
# Control characters (tab, newline and carriage return aside): no field means one, and a NUL byte
# reached the standard library as a traceback (`ValueError: embedded null byte`, a time zone).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# What YAML's explicit tags make that JSON (what the API server stores) has no type for, and the fix.
_NOT_JSON: dict[type, str] = {
    bytes: "a !!binary value is not JSON: write it as a plain string",
    set: "a !!set is not JSON: write a list",
}


def _storable(value: Any) -> bool:
    """Whether a document holds only JSON values, every integer within int64: the quick check (no
    paths built) before `_unstorable` names what is not."""
    low, high = INT64
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
            stack.extend(item)  # the keys: a string's control characters count there too
        elif kind is str:
            if _CONTROL.search(item):
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is list:
            stack.extend(item)
        elif kind is int:
            if not low <= item <= high:
                return False
        elif kind not in (bool, type(None)):
            return False  # a subclass, or what a YAML tag made: `_unstorable` looks closer
    return True


def _unstorable(value: Any, path: str) -> Iterator[str]:
    """What Kubernetes cannot store, anywhere in a document, by path: integers beyond int64, numbers
    JSON has no form for (.nan, .inf), control characters in a string or a key, and values a YAML tag
    made that are not JSON (!!binary, !!set, !!timestamp)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            bad = _CONTROL.search(item)
            if bad:
                yield f"{where}: holds the control character {bad.group()!r}: remove it"
        elif isinstance(item, float):
            if not math.isfinite(item):
                yield f"{where}: {item} is not a number JSON can hold (.nan, .inf): give a finite number"
        elif isinstance(item, bool | None):
            continue
        elif isinstance(item, int):
            if not INT64[0] <= item <= INT64[1]:
                yield f"{where}: integer out of range: it must fit in 64 bits (-2^63 to 2^63-1)"
        elif isinstance(item, Mapping):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
            for key in item:
                if isinstance(key, str) and _CONTROL.search(key):
                    yield f"{where or 'document'}: the key {key!r} holds a control character: remove it"
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
        else:
            fix = _NOT_JSON.get(
                type(item), f"a {type(item).__name__} (from a YAML tag) is not JSON: quote it"
            )
            yield f"{where}: {fix}"


def other_kind(doc: Any) -> bool:
    """Whether a document is of a kind that is not rayship's (a PersistentVolumeClaim, a ConfigMap): its
    apiVersion or its kind is said, and neither is rayship's (a typo in a rayship kind is not other)."""
    if not isinstance(doc, Mapping):
        return False
    kind, version = doc.get("kind"), doc.get("apiVersion")
    if (isinstance(kind, str) and kind in api.KIND_BY_NAME) or (
        isinstance(version, str) and version.partition("/")[0] == api.GROUP
    ):
        return False
    return kind is not None or version is not None


def other_kind_problems(doc: Mapping[str, Any]) -> list[str]:
    """What keeps a document of another kind from being applied as it is: apiVersion, kind and
    metadata.name as kubectl needs them, a List's items, and values JSON (what the API server stores)
    has."""
    problems = []
    for key in ("apiVersion", "kind"):
        value = doc.get(key)
        if value is None:
            problems.append(f"{key}: required field is missing")
        elif not isinstance(value, str) or not value:
            problems.append(f"{key}: expected a non-empty string, got {shown(value)}")
    if str(doc.get("kind", "")).endswith("List") and "items" in doc:
        problems.append(f"items: a List holds a list of objects, got {type(doc['items']).__name__}")
    else:
        meta = doc.get("metadata")
        if not isinstance(meta, Mapping) or not (meta.get("name") or meta.get("generateName")):
            problems.append("metadata.name: required field is missing")
    return problems + ([] if _storable(doc) else sorted(_unstorable(doc, "")))


def parse(doc: Any, *, local: bool = False, admitted: bool = False) -> api.ApiModel:
    """Validate one document (a parsed YAML/JSON object) against the rayship API.

    `local=True` skips the rules only a cluster needs (e.g. checkpoint storage): `rayship run`.
    `admitted=True` (the operator, for an object it read from the API server) skips the CEL rules in
    the CRD (`CelRule.in_crd`): the API server evaluated those when the object was written, so only
    the rules it cannot check are evaluated again here; the schema itself is still checked in full.
    The CLI and local mode evaluate every rule."""
    if not isinstance(doc, Mapping):
        raise SpecError(
            [
                f"document: expected a mapping with apiVersion, kind, metadata and spec, got {type(doc).__name__}"
            ]
        )
    kinds = ", ".join(api.KIND_BY_NAME)
    given = doc.get("kind")
    kind = api.KIND_BY_NAME.get(given) if isinstance(given, str) else None
    if kind is None:
        raise SpecError([f"kind: {shown(given)} is not a rayship kind; expected one of: {kinds}"])
    if doc.get("apiVersion") != api.API_VERSION:
        raise SpecError(
            [f"apiVersion: {doc.get('apiVersion')!r} is not served; use apiVersion: {api.API_VERSION}"]
        )
    unstorable = [] if _storable(doc) else sorted(_unstorable(doc, ""))
    if unstorable:
        raise SpecError(unstorable)
    try:
        return kind.model.model_validate(doc, context={"local": local, "admitted": admitted})
    except ValidationError as err:
        raise SpecError(problems(kind.model, err)) from None


def parse_trainingjob(doc: Any, *, local: bool = False, admitted: bool = False) -> api.TrainingJob:
    obj = parse(doc, local=local, admitted=admitted)
    if not isinstance(obj, api.TrainingJob):
        raise SpecError([f"kind: expected TrainingJob, got {type(obj).__name__}"])
    return obj
