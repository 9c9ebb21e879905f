"""Generate every derived file from the API models: the CRDs (`manifests/crds/`, the chart's
`files/crds/`), the chart's RBAC rules (`rayship.rbac`), `values.schema.json` and values table
(`rayship.chart`), the docs site's API reference (`docs/reference/api.md`, `rayship.apidocs`), and
`manifests/install.yaml` (the chart rendered by `helm template`).

`python -m rayship.generate` writes them; `--check` fails (exit 1) when a committed file differs from
what the models produce, so CI catches drift. Nothing here is hand-copied: every schema comes from
`rayship.api`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rayship import api, apidocs, chart, rbac
from rayship.api import names

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
    pending: list[type[api.ApiModel]] = list(api.ApiModel.__subclasses__())
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
                out["x-kubernetes-validations"] = [r.as_schema() for r in rules[title] if r.in_crd]
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
        "description": (kind.model.__doc__ or kind.kind).strip(),
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


HEADER = "# Generated by `make generate` from operator/rayship/api/. Do not edit.\n"


def dump(obj: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=100)


CHART = Path("charts") / "rayship"


def chart_readme() -> str:
    return f"""# rayship Helm chart

Installs the rayship operator (kopf) and the TrainingJob / ModelService / TrainingSchedule CRDs. Needs the KubeRay
operator v1.7 in the cluster (`helm install kuberay-operator kuberay/kuberay-operator --version 1.7.0`).

```bash
helm install rayship charts/rayship -n rayship-system --create-namespace
```

<!-- Generated by `make generate` from operator/rayship/chart.py. Do not edit. -->
## Values

{chart.values_table()}

The operator's RBAC rules are generated from `operator/rayship/rbac.py` into
`files/operator-rules.yaml` (a ClusterRole), or `files/operator-namespaced-rules.yaml` (one Role per
`watchNamespaces` entry: no list or watch of namespaces, `get` of its own only). Each
TrainingJob also gets its own ServiceAccount and RoleBinding (created by the operator, owned by the
TrainingJob) to the release's ClusterRole `<full name>-workload` (`{names.WORKLOAD_ROLE}` for the
release `rayship`; `files/workload.yaml`: `patch` on TrainingJob `status`). The release's
ValidatingAdmissionPolicy `<full name>-workload-writes-its-own-status` (same file) narrows that to the
job's own TrainingJob, the one whose `status.workloadAccount` names the ServiceAccount: its Ray pods
may patch that status and nothing else. One ClusterRole instead of a Role per job: the operator may
`bind` exactly its release's ClusterRole, so the API server does not read every RoleBinding of the
namespace for each job (its no-escalation check of a Role the creator may not bind).
Upgrading from a version with per-job Roles: those jobs keep their Role until they are deleted.

Several releases (e.g. one per team, each with its own `watchNamespaces`, none watching another's
namespaces) install side by side: every cluster-wide object carries the release's full name, but the
CRDs, which are the cluster's: install them with one release and set `crds.install=false` on the
others. Their admission policies are identical, so none refuses what another admits.

Secrets: the operator may `create` Secrets (each ModelService's Ray token, named in the RayService's
`authOptions.secretName`) but read none, except `rayship-ray-token-key` in its own namespace
(`files/operator-key-rules.yaml`), the key it derives those tokens from. With the token it reads
Serve's own application state through the API server's service proxy (`services/proxy` `get`, as
KubeRay does), to confirm which model Serve really serves before `status.modelURI` names it.
"""


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file except manifests/install.yaml (see `helm_outputs`), with its content."""
    files: dict[Path, str] = {}
    for kind in api.KINDS:
        text = dump(crd(kind))
        files[root / "manifests" / "crds" / f"{kind.crd_name}.yaml"] = text
        files[root / CHART / "files" / "crds" / f"{kind.crd_name}.yaml"] = text
    for file, generated in (
        ("operator-rules.yaml", rbac.operator_rules(rbac.CHART_WORKLOAD_ROLE)),
        ("operator-namespaced-rules.yaml", rbac.namespaced_operator_rules(rbac.CHART_WORKLOAD_ROLE)),
        ("operator-key-rules.yaml", rbac.KEY_RULES),
        ("workload.yaml", rbac.workload_objects(rbac.CHART_WORKLOAD_ROLE, rbac.CHART_WORKLOAD_POLICY)),
    ):
        files[root / CHART / "files" / file] = HEADER.replace("api/", "rbac.py") + yaml.safe_dump(
            generated, sort_keys=False
        )
    files[root / CHART / "values.schema.json"] = json.dumps(chart.values_schema(), indent=2) + "\n"
    files[root / CHART / "README.md"] = chart_readme()
    files[root / "docs" / "reference" / "api.md"] = apidocs.page([crd(kind) for kind in api.KINDS])
    return files


def helm_outputs(root: Path) -> dict[Path, str]:
    """manifests/install.yaml: the chart rendered with its default values (needs `helm`)."""
    helm = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
    rendered = subprocess.run(
        [helm, "template", "rayship", str(root / CHART), "--namespace", "rayship-system"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header = "# Generated by `make generate`: `helm template rayship charts/rayship -n rayship-system`.\n"
    return {root / "manifests" / "install.yaml": header + rendered}


def _write(root: Path, files: dict[Path, str]) -> None:
    for path, content in files.items():
        if path.exists() and path.read_text() == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path.relative_to(root)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rayship generate", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="fail if generated files are out of date")
    args = parser.parse_args(argv)
    if not args.check:
        _write(args.root, outputs(args.root))
        _write(args.root, helm_outputs(args.root))  # rendered from the chart files just written
        return 0
    expected = {**outputs(args.root), **helm_outputs(args.root)}
    stale = [p for p, content in expected.items() if not p.exists() or p.read_text() != content]
    for path in stale:
        print(f"out of date: {path.relative_to(args.root)}", file=sys.stderr)
    if stale:
        print("run `make generate` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
