"""Every Kubernetes API call of the product has a request timeout (issue 57 §5): a hung API server
must not stall the CLI or a training loop that reports its progress (the workload's status patch had
none). Read from the code (its syntax tree), so a call added later without one fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

# The kubernetes client's API methods (CoreV1Api, CustomObjectsApi, ...) and the dynamic client's.
API_METHOD = re.compile(
    r"^(list|read|create|patch|delete|replace|get)_(namespaced|cluster|persistent|custom)"
)
DYNAMIC = {"get", "patch", "create", "delete", "replace", "server_side_apply"}


def _calls_without_timeout(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, node.func.value
        dynamic = isinstance(receiver, ast.Name) and receiver.id == "resource" and name in DYNAMIC
        if (API_METHOD.search(name) or dynamic) and not any(
            k.arg == "_request_timeout" for k in node.keywords
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_every_api_call_of_the_operator_the_cli_and_the_workloads_has_a_timeout() -> None:
    files = [
        *(ROOT / "operator" / "rayship").rglob("*.py"),
        *(ROOT / "workloads" / "rayship_workloads").rglob("*.py"),
    ]
    missing = [call for path in sorted(files) for call in _calls_without_timeout(path)]
    assert not missing, f"Kubernetes API calls without _request_timeout: {missing}"


def test_the_scan_sees_a_call_without_one(tmp_path: Path) -> None:
    probe = ROOT / "operator" / "rayship" / "_probe_for_the_scan.py"
    probe.write_text(
        "def f(core, resource):\n    core.read_namespaced_pod('p', 'ns')\n    resource.get(name='x')\n"
    )
    try:
        assert [c.split(" ")[1] for c in _calls_without_timeout(probe)] == ["read_namespaced_pod", "get"]
    finally:
        probe.unlink()
