"""The house rules of the code's layout, read from the source (no import runs):

- the contract (`rayship.api`) imports nothing of rayship outside itself, and nothing of the workloads;
- the workloads stand on the contract only: no `rayship.*` module outside `rayship.api`;
- the controller never imports the workloads: only the top floor (`TOP_FLOOR`) joins the two, and
  nothing below imports it;
- no import circle between modules (lazy imports inside functions count too);
- files and functions stay small: no product file over 600 lines, no function over 60.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "rayship": ROOT / "operator" / "rayship",
    "rayship_workloads": ROOT / "workloads" / "rayship_workloads",
    "controlplane": ROOT / "controlplane",
}
CONTRACT = "rayship.api"
TOP_FLOOR = {
    "rayship.cli",
    "rayship.serve_local",
    "rayship.joblogs",
    "rayship.codeupload",
}  # the CLI (the package rayship.cli, each of its modules); `rayship serve -f`, `rayship logs` and
# `rayship apply`'s code upload behind it


def top_floor(name: str) -> bool:
    return name in TOP_FLOOR or name.startswith("rayship.cli.")


MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """The known modules `name` imports (at any depth of its code), with the line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, node.lineno


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for target, _ in imports(name, path, known):
            # `from rayship import api` names a package whose __init__ is the module itself
            edges[name].add(target)
    return edges


def in_contract(name: str) -> bool:
    return name == CONTRACT or name.startswith(CONTRACT + ".")


def test_the_contract_imports_only_itself() -> None:
    found = modules()
    bad = [
        f"{name}:{line} imports {target}"
        for name, path in found.items()
        if in_contract(name)
        for target, line in imports(name, path, set(found))
        if not in_contract(target) and target != "rayship"
    ]
    assert not bad, "the contract must stand alone:\n" + "\n".join(bad)


def test_the_workloads_stand_on_the_contract_only() -> None:
    found = modules()
    bad = [
        f"{name}:{line} imports {target}"
        for name, path in found.items()
        if name.startswith("rayship_workloads")
        for target, line in imports(name, path, set(found))
        if target.startswith("rayship.") and not in_contract(target)
    ]
    assert not bad, "a workload imports the controller:\n" + "\n".join(bad)


def test_only_the_top_floor_joins_the_controller_and_the_workloads() -> None:
    found = modules()
    bad = [
        f"{name}:{line} imports {target}"
        for name, path in found.items()
        if name.split(".")[0] == "rayship" and not top_floor(name)
        for target, line in imports(name, path, set(found))
        if target.startswith("rayship_workloads")
    ]
    assert not bad, "the controller imports the workloads:\n" + "\n".join(bad)


def test_nothing_imports_the_top_floor() -> None:
    found = modules()
    bad = [
        f"{name}:{line} imports {target}"
        for name, path in found.items()
        if not top_floor(name)
        for target, line in imports(name, path, set(found))
        if top_floor(target)
    ]
    assert not bad, "only the top floor imports the top floor:\n" + "\n".join(bad)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_circles_are_found() -> None:
    """The check below can fail: a circle of three is one component, a chain is none."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle() -> None:
    edges = graph()
    # a package's __init__ re-exporting its own modules is the package, not a circle
    for name in edges:
        edges[name] = {t for t in edges[name] if not name.startswith(t + ".")}
    assert circles(edges) == []


def sizes() -> Iterator[tuple[str, int]]:
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        yield rel, len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                yield f"{rel}:{node.name}", node.end_lineno - node.lineno + 1


def test_files_and_functions_stay_small() -> None:
    over = []
    for what, lines in sizes():
        limit = MAX_FUNCTION_LINES if ":" in what else MAX_FILE_LINES
        if lines > limit:
            over.append(f"{what}: {lines} lines (limit {limit})")
    assert not over, "over the size limits (split by what the parts hold):\n" + "\n".join(over)
