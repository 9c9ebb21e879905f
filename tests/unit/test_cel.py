"""rayship's CEL evaluation (`rayship.api.cel`): the API server's semantics, the quantity library, and the
rules defaults skip."""

from __future__ import annotations

import pytest

from rayship import api
from rayship.api import cel

MODELS = [m for m in vars(api).values() if isinstance(m, type) and issubclass(m, api.ApiModel)]
RULES = sorted({r.rule for m in MODELS for r in m.cel_rules})


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_compiles(rule: str) -> None:
    assert cel.program(rule) is not None


@pytest.mark.parametrize(
    ("rule", "value", "expected"),
    [
        ("self.a > 1", {"a": 2}, True),
        ("self.a > 1", {"a": 1}, False),
        # a missing field is an error, and an error does not hold
        ("self.a.b == 1", {"a": {}}, False),
        ("has(self.a.b) && self.a.b == 1", {"a": {"b": 1}}, True),
        # numbers: an integer in a `number` field compares with a double, as the API server's double
        ("self.cpus >= 0.001", {"cpus": 1}, True),
        ("self.cpus >= 0.001", {"cpus": 0}, False),
        ("double(int(self.low)) == self.low", {"low": 2.0}, True),
        ("double(int(self.low)) == self.low", {"low": 2.5}, False),
        ("1 / self.n == 1", {"n": 0}, False),  # division by zero: an error
        # RE2, as in the API server, and sizes in code points
        ("self.k.matches('(?i)(pass(word)?|secret)')", {"k": "MY_PASSWORD"}, True),
        ("self.k.size() == 3", {"k": "héé"}, True),
        (
            "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            {"env": [{"name": "A"}, {"name": "A"}]},
            False,
        ),
        ("'x' in self.m && !('y' in self.m)", {"m": {"x": 1}}, True),
        ("self.n", {"n": 1}, False),  # not a boolean: does not hold
    ],
)
def test_rules_evaluate_as_the_api_server_does(rule: str, value: object, expected: bool) -> None:
    assert cel.holds(rule, value) is expected


@pytest.mark.parametrize(
    ("memory", "expected"),
    [("64Mi", True), ("67108863", False), ("67108864", True), ("1.5Gi", True), ("8Ei", False),
     ("9223372036854775807", True), ("64mi", False), ("lots", False), ("", False)],
)  # fmt: skip
def test_the_quantity_library(memory: str, expected: bool) -> None:
    rule = "quantity(self.m).compareTo(quantity('64Mi')) >= 0 && quantity(self.m).isLessThan(quantity('8Ei'))"
    assert cel.holds(rule, {"m": memory}) is expected
    assert cel.holds("quantity(self.m).isGreaterThan(quantity('1k'))", {"m": "1001"})
    assert cel.quantity_value("500m") * 2 == 1


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
