"""CEL rules evaluated in Python as the API server evaluates a CRD's `x-kubernetes-validations`, with
cel-expr-python (the CEL project's Python binding of its C++ implementation: the same language
definition and RE2 regular expressions as the API server's cel-go) and the Kubernetes quantity library.

`rayship render` / `run` evaluate every rule of `rayship.api`; the operator only those that are not in
the CRD (the API server evaluated the others when the object was written), usually none, so this
module (and cel-expr-python, which imports protobuf) is imported on first use. A rule is compiled
(parsed and type-checked) once per process.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Any

from cel_expr_python import cel

_SUFFIXES: dict[str, Fraction | int] = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)")


def quantity_value(text: str) -> Fraction:
    """The exact value of a Kubernetes resource.Quantity such as `16Gi`, `500m` or `1.5`."""
    found = _QUANTITY.fullmatch(text)
    if found is None or found.group(2) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {text!r}")
    return Fraction(found.group(1)) * _SUFFIXES[found.group(2)]


def _quantity(text: str) -> str:
    quantity_value(text)  # an error in the rule, as in the API server, if it is not one
    return text


def _compare(a: str, b: str) -> int:
    x, y = quantity_value(a), quantity_value(b)
    return (x > y) - (x < y)


def _method(name: str, result: Any, impl: Any) -> Any:
    """A method of the quantity library, declared on strings (see FUNCTIONS)."""
    overload = cel.Overload(
        f"quantity_{name}", result, [cel.Type.STRING, cel.Type.STRING], is_member=True, impl=impl
    )
    return cel.FunctionDecl(name, [overload])


# The quantity library (Kubernetes >= 1.29), as the API server offers it:
# `quantity('16Gi').compareTo(quantity('64Mi'))`. cel-expr-python cannot hand an opaque value from a
# Python function back to CEL, so a quantity is carried as its checked text (exact, where a double or
# an int64 could not hold 8Ei) and its methods are declared on strings: rayship's rules are the only
# ones evaluated here, and the API server type-checks every one of them with the real library.
FUNCTIONS = [
    cel.FunctionDecl(
        "quantity", [cel.Overload("quantity_string", cel.Type.STRING, [cel.Type.STRING], impl=_quantity)]
    ),
    _method("compareTo", cel.Type.INT, _compare),
    _method("isGreaterThan", cel.Type.BOOL, lambda a, b: _compare(a, b) > 0),
    _method("isLessThan", cel.Type.BOOL, lambda a, b: _compare(a, b) < 0),
]


@functools.cache
def _environment() -> Any:
    # The strings library, as the API server (>= 1.29) offers it: `format` in messageExpressions.
    from cel_expr_python.ext.ext_strings import ExtStrings

    return cel.NewEnv(variables={"self": cel.Type.DYN}, functions=FUNCTIONS, extensions=[ExtStrings(2)])


@functools.cache
def program(rule: str) -> Any:
    """The rule compiled (parsed and type-checked) with `self` of any type; a rule that does not
    compile is a bug in the rule: RuntimeError, naming it."""
    return _environment().compile(rule)


def holds(rule: str, value: Any) -> bool:
    """Evaluate a CEL rule with `self` bound to `value` (a JSON-like structure).

    As in the API server, a rule whose evaluation fails (e.g. a missing field) does not hold.
    """
    result = program(rule).eval(data={"self": value})
    return result.type() == cel.Type.BOOL and result.value() is True


def text(expression: str, value: Any) -> str | None:
    """Evaluate a CEL string expression (a rule's messageExpression) with `self` bound to `value`; None
    where it fails or is not a string (the API server then says the rule's message)."""
    result = program(expression).eval(data={"self": value})
    return str(result.value()) if result.type() == cel.Type.STRING else None
