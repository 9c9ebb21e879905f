"""rayship's CEL evaluation (`rayship.cel`): the parser cache, and the rules defaults skip."""

from __future__ import annotations

from pathlib import Path

import lark
import pytest
from celpy.celparser import CELParser

from rayship import api, cel

MODELS = [m for m in vars(api).values() if isinstance(m, type) and issubclass(m, api.ApiModel)]
RULES = sorted({r.rule for m in MODELS for r in m.cel_rules})


def celpy_own_parser() -> lark.Lark:
    """The parser cel-python builds itself (CELParser keeps it on the class)."""
    saved = CELParser.CEL_PARSER
    CELParser.CEL_PARSER = None
    try:
        CELParser()
        built = CELParser.CEL_PARSER
    finally:
        CELParser.CEL_PARSER = saved
    assert built is not None
    return built


def test_the_cached_parser_is_the_one_cel_python_builds(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    own = celpy_own_parser()
    written = cel._build_parser()  # no cache file yet: built, and the cache written
    (cache,) = (tmp_path / "rayship").iterdir()
    assert cache == cel.cache_file()
    loaded = cel._build_parser()  # loaded from the cache
    assert loaded.options.options == own.options.options | {"cache": str(cache)}
    for rule in RULES + ["self.a == true && !false", "self.x in ['a', 'b'] ? 1u : 2.5"]:
        assert written.parse(rule) == loaded.parse(rule) == own.parse(rule), rule


def test_no_cache_where_the_cache_directory_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file: no directory can be made in it
    assert cel.cache_file() is None
    parser = cel._build_parser()
    assert not parser.options.cache and parser.parse("self.a > 1") == celpy_own_parser().parse("self.a > 1")


DEFAULTS = {
    type(value): value
    for model in MODELS
    for field in model.model_fields.values()
    if field.default_factory is not None and isinstance(value := field.default_factory(), api.ApiModel)  # type: ignore[call-arg]
}


@pytest.mark.parametrize("default", DEFAULTS.values(), ids=lambda d: type(d).__name__)
def test_defaults_hold_every_rule(default: api.ApiModel) -> None:
    """Nested objects' defaults (`api.sub`) are built without evaluating the CEL rules (the API server
    checks the CRD's defaults against them): they must hold every one."""
    wire = default.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert [r.rule for r in type(default).cel_rules if not cel.holds(r.rule, wire)] == []


def test_nested_defaults_are_copies() -> None:
    first, second = (
        api.TrainingJobSpec.model_fields["head"].default_factory(),
        api.TrainingJobSpec.model_fields["head"].default_factory(),
    )  # type: ignore[call-arg,misc]
    assert first == second and first is not second
