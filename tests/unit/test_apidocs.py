"""The docs site's API reference (rayship.apidocs) says every field of every kind, at every depth, with
its type, default, validation and description as the CRD (generated from the same models) has them;
the committed page is what the models make now."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from rayship import api, apidocs, generate
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "reference" / "api.md"


def fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(the section's path, the field's name, its schema) for every field under `schema`."""
    for name, field in schema.get("properties", {}).items():
        yield path, name, field
        for child, inner in (
            (f"{path}.{name}", field),
            (f"{path}.{name}[]", field.get("items") or {}),
            (f"{path}.{name}.<name>", field.get("additionalProperties") or {}),
        ):
            if isinstance(inner, dict) and inner.get("properties"):
                yield from fields(inner, child)


def sections(page: str) -> dict[str, str]:
    """The text of each `### `path`` section."""
    parts = re.split(r"^### `([^`]+)` \{#[^}]+\}$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.fixture(scope="module")
def crds() -> list[dict[str, Any]]:
    return [generate.crd(kind) for kind in api.KINDS]


def test_every_field_of_every_kind_has_its_row_with_type_default_validation_and_description(crds) -> None:
    page = apidocs.page(crds)
    by_kind = re.split(r"^## ", page, flags=re.MULTILINE)
    for crd, text in zip(crds, by_kind[1:], strict=True):
        root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert text.startswith(crd["spec"]["names"]["kind"])
        found = sections(text)
        count = 0
        for part in ("spec", "status"):
            for section, name, field in fields(root["properties"][part], part):
                rows = [
                    r for r in found[section].splitlines() if re.match(rf"^\| (\[)?`{re.escape(name)}`", r)
                ]
                assert len(rows) == 1, (section, name)
                row = rows[0]
                description = " ".join(field.get("description", "").split()).replace("|", "\\|")
                assert row.endswith(f"| {description} |"), (section, name, row)
                if "default" in field:
                    assert f"`{json.dumps(field['default'])}`" in row, (section, name)
                for value in field.get("enum", []):
                    assert f"`{json.dumps(value)}`" in row, (section, name, value)
                for bound in ("minimum", "maximum", "maxLength", "minItems", "maxItems"):
                    if bound in field:
                        assert str(field[bound]) in row, (section, name, bound)
                if "pattern" in field:
                    assert field["pattern"].replace("|", "\\|") in row, (section, name)
                count += 1
        assert count > 20, crd["spec"]["names"]["kind"]


def test_every_cel_rule_is_on_the_page_with_its_message(crds) -> None:
    page = apidocs.page(crds)

    def rules(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            yield from node.get("x-kubernetes-validations", [])
            for value in node.values():
                yield from rules(value)
        elif isinstance(node, list):
            for value in node:
                yield from rules(value)

    every = [r for crd in crds for r in rules(crd["spec"]["versions"][0]["schema"])]
    assert len(every) > 10
    for rule in every:
        message = " ".join((rule.get("message") or rule.get("messageExpression") or "").split())
        assert message in page.replace("\\|", "|"), rule


def test_the_committed_page_is_what_the_models_make(crds) -> None:
    assert PAGE.read_text() == apidocs.page(crds), "run `make generate` (docs/reference/api.md is stale)"
