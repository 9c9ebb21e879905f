"""CEL rules evaluated in Python (cel-python), as the API server evaluates a CRD's
`x-kubernetes-validations`, with the Kubernetes quantity library.

`rayship render` / `run` evaluate every rule of `rayship.api`; the operator only those that are not in
the CRD (the API server evaluated the others when the object was written), usually none, so this
module (and cel-python) is imported on first use.

Start-up: cel-python builds its CEL parser (a lark LALR parser) when the first program is compiled,
and lark's analysis of the grammar takes longer than the rest of `rayship render`. lark can keep that
analysis in a cache file (checked against the grammar, the parser options, lark's and Python's
versions; rebuilt when any differs): it is kept in the user's cache directory
(`$XDG_CACHE_HOME/rayship` or `~/.cache/rayship`), or not at all where that cannot be written.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import celpy
import lark
from celpy.celparser import CELParser

# cel-python logs every evaluation step at DEBUG; that would drown the operator's own log.
logging.getLogger("celpy").setLevel(logging.WARNING)

_SUFFIXES: dict[str, Fraction | int] = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)")


class _Quantity:
    """A Kubernetes resource.Quantity, for the CEL quantity library (Kubernetes >= 1.29) as the API
    server evaluates it: `quantity('16Gi').compareTo(quantity('64Mi'))`."""

    def __init__(self, text: Any):
        found = _QUANTITY.fullmatch(str(text))
        if found is None or found.group(2) not in _SUFFIXES:
            raise ValueError(f"not a quantity: {text!r}")
        self.value = Fraction(found.group(1)) * _SUFFIXES[found.group(2)]


def _compare(a: _Quantity, b: _Quantity) -> celpy.celtypes.IntType:
    return celpy.celtypes.IntType((a.value > b.value) - (a.value < b.value))


FUNCTIONS: dict[str, Any] = {
    "quantity": _Quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celpy.celtypes.BoolType(a.value > b.value),
    "isLessThan": lambda a, b: celpy.celtypes.BoolType(a.value < b.value),
}

# The options cel-python 0.5.0 builds its parser with (celpy/celparser.py, CELParser.__init__);
# tests/unit/test_cel.py checks that this parser is the one cel-python would build.
_GRAMMAR = Path(celpy.__file__).parent / "cel.lark"
_PARSER_OPTIONS: dict[str, Any] = {
    "parser": "lalr",
    "start": "expr",
    "debug": True,
    "g_regex_flags": re.M,
    "lexer_callbacks": {"IDENT": CELParser.ambiguous_literals},
    "propagate_positions": True,
    "maybe_placeholders": False,
    "priority": "invert",
    "tree_class": celpy.InterpretedRunner.tree_node_class,
}


def cache_file() -> Path | None:
    """The parser cache file, or None where the cache directory cannot be written."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "rayship"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(folder, os.W_OK | os.X_OK):
        return None
    return folder / f"cel-parser-lark{lark.__version__}.cache"


def _build_parser() -> lark.Lark:
    grammar = _GRAMMAR.read_text()
    path = cache_file()
    if path is None:
        return lark.Lark(grammar, **_PARSER_OPTIONS)
    if path.exists():  # lark loads it, or rebuilds and rewrites it if it does not match
        return lark.Lark(grammar, cache=str(path), **_PARSER_OPTIONS)
    # A new cache file appears whole (written beside it, then renamed): another process never reads
    # half of one.
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
    os.close(fd)
    os.unlink(partial)  # lark treats an existing file as a cache to load
    try:
        parser = lark.Lark(grammar, cache=partial, **_PARSER_OPTIONS)
        if os.path.exists(partial):
            os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return parser


@functools.cache
def _environment() -> celpy.Environment:
    if CELParser.CEL_PARSER is None:  # cel-python makes its parser once per process, like this
        CELParser.CEL_PARSER = _build_parser()
    return celpy.Environment()


@functools.cache
def program(rule: str) -> celpy.Runner:
    env = _environment()
    return env.program(env.compile(rule), functions=FUNCTIONS)


def holds(rule: str, value: Any) -> bool:
    """Evaluate a CEL rule with `self` bound to `value` (a JSON-like structure).

    As in the API server, a rule whose evaluation fails (e.g. a missing field) does not hold.
    """
    try:
        result = program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError:
        return False
    return not isinstance(result, Exception) and bool(result)
