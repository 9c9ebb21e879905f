"""What the CLI prints, as kubectl prints it, all pure: YAML with readable multi-line strings, tables
whose columns are a CRD's printer columns (`api.Kind.columns`), ages as kubectl writes them."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from rayship import api


class Dumper(yaml.SafeDumper):
    """YAML output with multi-line strings (serveConfigV2, entrypoints) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def dump(objects: Sequence[Mapping[str, Any]], output: str, single: bool) -> str:
    """`objects` as kubectl's -o json / -o yaml: the object itself when one was named (`single`), else
    a v1 List of them."""
    payload: Any = (
        objects[0]
        if single and len(objects) == 1
        else {"apiVersion": "v1", "kind": "List", "items": list(objects), "metadata": {"resourceVersion": ""}}
    )
    if output == "json":
        return json.dumps(payload, indent=4) + "\n"
    return yaml.dump(payload, Dumper=Dumper, sort_keys=False, width=120)


# The JSONPath subset the CRDs' printer columns use: a dotted path of field names (`.status.phase`).
# Every column of api.KINDS is one (tests/unit/test_cli_output.py); anything else is refused at once.
SIMPLE_PATH = re.compile(r"(\.[A-Za-z_][A-Za-z0-9_-]*)+")


def at_path(obj: Any, path: str) -> Any:
    """The value at a printer column's jsonPath (None where a field on the way is absent)."""
    if not SIMPLE_PATH.fullmatch(path):
        raise ValueError(f"{path!r}: only dotted field paths (.status.phase) are supported")
    for key in path.split(".")[1:]:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def human_duration(seconds: float) -> str:
    """kubectl's AGE (k8s.io/apimachinery duration.HumanDuration): 45s, 3m20s, 15m, 5h10m, 20h, 3d4h, 20d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // 24 // 365, hours // 24 % 365
    if hours < 24 * 365 * 8:
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{years}y"


def age(timestamp: Any, now: datetime) -> str:
    """The age of an RFC 3339 time ("" for none)."""
    if not timestamp:
        return ""
    try:
        then = datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    except ValueError:
        return str(timestamp)
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return human_duration((now - then).total_seconds())


def cell(value: Any, column_type: str, now: datetime) -> str:
    """One printer column's value as kubectl shows it: a date as an age, a boolean as true/false,
    nothing for a field not set."""
    if value is None:
        return ""
    if column_type == "date":
        return age(value, now)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def columns_of(kind: api.Kind, wide: bool) -> list[api.PrinterColumn]:
    """The kind's printer columns kubectl shows: priority 0, and with -o wide every one."""
    return [c for c in kind.columns if wide or c.priority == 0]


def table(
    kind: api.Kind, items: Sequence[Mapping[str, Any]], *, wide: bool, namespaces: bool, now: datetime
) -> str:
    """`kubectl get`'s table: NAME (NAMESPACE first with -A), then the CRD's printer columns."""
    columns = columns_of(kind, wide)
    header = (["NAMESPACE"] if namespaces else []) + ["NAME"] + [c.name.upper() for c in columns]
    rows = [header]
    for obj in items:
        meta = obj.get("metadata") or {}
        row = [str(meta.get("namespace", ""))] if namespaces else []
        row.append(str(meta.get("name", "")))
        row.extend(cell(at_path(obj, c.json_path), c.type, now) for c in columns)
        rows.append(row)
    return align(rows)


def align(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows in columns three spaces apart (kubectl's tabwriter), trailing blanks trimmed."""
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(map(len, rows)))]
    lines = []
    for row in rows:
        padded = [value.ljust(widths[i]) if i < len(row) - 1 else value for i, value in enumerate(row)]
        lines.append((indent + "   ".join(padded)).rstrip())
    return "\n".join(lines) + "\n"
