"""Generate the CRDs (and later RBAC / chart files) from the API models.

`python -m rayship.generate` writes them; `--check` fails (exit 1) when a committed file differs from
what the models produce, so CI catches drift. Nothing here is hand-copied: every schema comes from
`rayship.api`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from rayship import api

# Keys pydantic emits that a Kubernetes structural schema must not carry.
_DROP = {"title", "additionalProperties", "$defs", "discriminator"}


def structural_schema(model: type[api.ApiModel]) -> dict[str, Any]:
    """The model's JSON schema rewritten as a Kubernetes structural schema.

    Inlines `$ref`s, turns `Optional[X]` into `X` (nulls are never stored), keeps descriptions and
    defaults, maps free-form dicts to `x-kubernetes-preserve-unknown-fields`, string maps to
    `additionalProperties`, and attaches each model's CEL rules as `x-kubernetes-validations`.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    rules = _rules_by_title()
    return _convert(raw, defs, rules)


def _rules_by_title() -> dict[str, tuple[api.CelRule, ...]]:
    found: dict[str, tuple[api.CelRule, ...]] = {}
    pending: list[type] = list(api.ApiModel.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.cel_rules:
            found[cls.__name__] = cls.cel_rules
    return found


def _convert(node: dict[str, Any], defs: dict[str, Any], rules: dict[str, tuple[api.CelRule, ...]]) -> dict:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = {**target, **node}  # the field's own description/default win over the model's
        return _convert(merged, defs, rules)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {options}")
        return _convert({**options[0], **node}, defs, rules)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", ...) is None:
        del node["default"]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[limit], node[bound] = node[bound], True  # OpenAPI v3.0 form

    title = node.get("title")
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROP}
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {k: _convert(v, defs, rules) for k, v in node["properties"].items()}
            if title in rules:
                out["x-kubernetes-validations"] = [r.as_schema() for r in rules[title]]
        else:
            extra = node.get("additionalProperties", True)
            if isinstance(extra, dict) and extra:
                out["additionalProperties"] = _convert(extra, defs, rules)
            else:  # a free-form object: keep whatever the user put there
                out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array":
        out["items"] = _convert(node["items"], defs, rules)
    if "enum" in out and "type" not in out:
        out["type"] = "integer" if all(isinstance(v, int) for v in out["enum"]) else "string"
    if "type" not in out:  # Any: a JSON value of any type
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def crd(kind: api.Kind) -> dict[str, Any]:
    """The CustomResourceDefinition for one kind."""
    spec_schema = structural_schema(kind.spec_model)
    status_schema = structural_schema(kind.status_model)
    conditions = status_schema["properties"].get("conditions")
    if conditions is not None:
        conditions.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    root = {
        "type": "object",
        "description": kind.model.__doc__.strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "rayship.dev/v1alpha1"},
            "kind": {"type": "string", "description": kind.kind},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [r.as_schema() for r in kind.root_rules],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {"app.kubernetes.io/name": "rayship", "app.kubernetes.io/part-of": "rayship"},
        },
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": ["rayship", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.as_crd() for c in kind.columns],
                }
            ],
        },
    }


HEADER = "# Generated by `make generate` from operator/rayship/api.py. Do not edit.\n"


def dump(obj: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=100)


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file, by path, with its exact content."""
    files: dict[Path, str] = {}
    for kind in api.KINDS:
        files[root / "manifests" / "crds" / f"{kind.crd_name}.yaml"] = dump(crd(kind))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rayship generate", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="fail if generated files are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, content in outputs(args.root).items():
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            print(f"wrote {path.relative_to(args.root)}")
    if stale:
        for path in stale:
            print(f"out of date: {path.relative_to(args.root)}", file=sys.stderr)
        print("run `make generate` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
