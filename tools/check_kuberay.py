"""Check RayJob documents on stdin strictly against the KubeRay CRDs and KubeRay's own rules.

Used by `make demo`: `rayship render -f sample.yaml | python -m tools.check_kuberay`; the tests use
the same CRD lookup (`kuberay_crds_dir`).
Exit 0 when every document passes (or, with a notice, when the CRDs are not available), 1 when a
document is invalid (each problem printed with its field path).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from tools.kuberay_rules import rayjob_violations
from tools.strict_schema import StrictValidator, load_crd_schema

ROOT = Path(__file__).resolve().parent.parent

KUBERAY_HINT = (
    "KubeRay v1.7.0 CRDs not found: set RAYSHIP_KUBERAY_CRDS to a directory holding "
    "ray.io_rayjobs.yaml (e.g. `helm pull kuberay/kuberay-operator --version 1.7.0 --untar` "
    "and point it at kuberay-operator/crds), or check out ../shared/kuberay/crds beside the repo"
)


def kuberay_crds_dir() -> Path | None:
    for candidate in (os.environ.get("RAYSHIP_KUBERAY_CRDS"), ROOT.parent / "shared" / "kuberay" / "crds"):
        if candidate and (Path(candidate) / "ray.io_rayjobs.yaml").is_file():
            return Path(candidate)
    return None


def main() -> int:
    crds = kuberay_crds_dir()
    if crds is None:  # nothing to check against: say so, but do not stop the demo
        print(f"strict check skipped: {KUBERAY_HINT}", file=sys.stderr)
        return 0
    validator = StrictValidator(load_crd_schema(crds / "ray.io_rayjobs.yaml", "v1"))
    failed = False
    for doc in yaml.safe_load_all(sys.stdin):
        if not doc or doc.get("kind") != "RayJob":
            continue  # ServiceAccount/Role/RoleBinding: core objects, checked by the chart tests
        label = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        problems = validator.errors(doc) + (rayjob_violations(doc) if doc.get("kind") == "RayJob" else [])
        for problem in problems:
            print(f"{label}: {problem}", file=sys.stderr)
        failed |= bool(problems)
        if not problems:
            print(f"{label}: valid (strict KubeRay v1.7 CRD schema and KubeRay validation rules)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
