"""Serialization: YAML the way Kubernetes reads it, and canonical JSON for what rayship stores in
annotations and hashes.

Reading is strict and bounded, as `kubectl apply` in strict mode would be:
- YAML 1.2 numbers, so `2e-5` is a float (PyYAML, following YAML 1.1, would make it the string
  "2e-5" and strict validation would then reject it);
- a key given twice in one mapping is an error (not "the last one wins");
- an unquoted date is a string, as the API server reads it (explicit tags such as !!binary are
  left to `validation.parse`, which names the field they are in);
- the input size, the number of aliases (no "billion laughs") and the nesting depth are bounded;
- libyaml's C parser where it is installed (a large file parses ~10x faster).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import yaml

MAX_BYTES = 4 * 1024 * 1024  # far above any real TrainingJob; the API server's own limit is ~3 MiB
MAX_ALIASES = 64
MAX_DEPTH = 64

if TYPE_CHECKING:  # the stubs type both alike; the C parser is absent where libyaml is
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLLimitError(yaml.YAMLError):
    """The document is over one of the bounds above."""


class Loader(_Base):
    """SafeLoader (C parser if available) plus YAML 1.2 floats written without a dot (1e-3, 2E+5)
    and duplicate-key rejection. Merge keys (`<<: *anchor`) merge, as kubectl's reader does: a key the
    mapping gives itself wins over a merged one (not a duplicate); a key given twice is."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # SafeConstructor.flatten_mapping merges it below
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key (a list): SafeConstructor says so with its line
                break
            if duplicate:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {mark.line + 1}): give each key once", mark
                )
            seen.add(key)
        return dict(super().construct_mapping(node, deep=deep))


def _check_events(text: str) -> None:
    """Bound aliases and nesting on the parser's event stream, before anything is built (an alias
    is a reference until built: counting events costs nothing, expanding them can cost 2^n)."""
    aliases = depth = 0
    for event in yaml.parse(text, Loader=Loader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YAMLLimitError(f"more than {MAX_ALIASES} aliases (*ref): expand them in the file")
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
# An unquoted date stays a string, as the API server reads it (sigs.k8s.io/yaml goes through JSON,
# which has no date): a `datetime` here would be a value no rayship field takes. (The resolvers were
# copied to Loader by the call above: SafeLoader keeps its own.)
Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in Loader.yaml_implicit_resolvers.items()
}
# The C parser builds mappings through this constructor too.
Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_mapping)


def load_all(text: str) -> Iterator[Any]:
    if len(text.encode(errors="replace")) > MAX_BYTES:
        raise YAMLLimitError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    _check_events(text)
    try:
        yield from yaml.load_all(text, Loader=Loader)  # noqa: S506 (Loader is a SafeLoader)
    except RecursionError:
        raise YAMLLimitError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as err:  # e.g. Python's int() limit on a 5000-digit number
        raise YAMLLimitError(f"a value cannot be read: {err}") from None


def load(text: str) -> Any:
    docs = list(load_all(text))
    if len(docs) != 1:
        raise YAMLLimitError(f"expected one document, found {len(docs)}")
    return docs[0]


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal values always give equal strings (annotations, hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def files_digest(files: Mapping[str, str]) -> str:
    """`sha256:<hex>` of a Secret's files (key -> text): what the operator wrote into a TrainingJob's
    spec Secret, which the driver checks the Secret it finds mounted against (one planted under the
    same name has other content)."""
    return "sha256:" + hashlib.sha256(canonical_json(dict(files)).encode()).hexdigest()


# What the parser meant, in words a user can act on. Each: (the start of its problem, in libyaml's words
# or PyYAML's; a part of its context it needs; which mark to point at; what YAML wanted there, from the
# line number and the text from the mark on).
Words = Callable[[int, str], str]


def _indent(line: int, _rest: str) -> str:
    return f"YAML expected a key at this indentation: check the indentation of line {line} (spaces, aligned with its siblings)"


def _no_key(line: int, _rest: str) -> str:
    return (
        f"YAML did not expect a key here: check the indentation of line {line} (spaces, aligned with its "
        "siblings), or quote a value that holds ': '"
    )


def _no_colon(line: int, _rest: str) -> str:
    return (
        f"YAML expected 'key: value' on line {line}: add the ':' after the key, or indent the line under the "
        "one above if it continues its value"
    )


def _tab(line: int, _rest: str) -> str:
    return f"YAML indents with spaces only: replace the tab on line {line} with spaces"


def _character(line: int, rest: str) -> str:
    if rest.startswith("\t"):
        return _tab(line, rest)
    if rest:
        return f"a plain value cannot start with {rest[0]!r}: quote the value"
    return "no value starts with the character here: quote the value, or indent with spaces (not tabs)"


def _list_item(line: int, _rest: str) -> str:
    return (
        f"YAML expected a list item ('- ') at this indentation: check the indentation of line {line} "
        "(aligned with the items above it)"
    )


def _not_closed(line: int, rest: str) -> str:
    if rest.startswith("["):
        return "the '[' here is not closed: end the list with ']' (items separated by ',')"
    if rest.startswith("{"):
        return "the '{' here is not closed: end the mapping with '}' (entries separated by ',')"
    return f"what opens on line {line} is not closed"


def _quote(_line: int, _rest: str) -> str:
    return "the quote here is not closed: end the value with the same quote"


def _no_value(_line: int, _rest: str) -> str:
    return "YAML expected a value here: close a '[' or '{' left open above, or give the value a '-' or ':' announces"


def _alias(_line: int, rest: str) -> str:
    found = re.match(r"\*([^\s,\[\]{}]+)", rest)
    name = found.group(1) if found else "name"
    return (
        f"an alias (*{name}) with no anchor (&{name}) before it: define the anchor, or quote a value that "
        "starts with '*'"
    )


_PLAIN_WORDS: tuple[tuple[str, str, str, Words], ...] = (
    ("mapping values are not allowed", "", "problem", _no_key),
    ("could not find expected ':'", "", "context", _no_colon),
    ("found a tab character", "", "problem", _tab),
    ("found character", "", "problem", _character),  # a tab, or another character no value starts with
    ("did not find expected '-' indicator", "", "problem", _list_item),
    ("expected <block end>", "block collection", "problem", _list_item),
    ("did not find expected key", "", "problem", _indent),
    ("expected <block end>", "", "problem", _indent),
    ("did not find expected ','", "", "context", _not_closed),
    ("expected ','", "", "context", _not_closed),
    ("found unexpected end of stream", "quoted scalar", "context", _quote),
    ("did not find expected node content", "", "problem", _no_value),
    ("expected the node content", "", "problem", _no_value),
    ("found undefined alias", "", "problem", _alias),
)


def explain(err: yaml.YAMLError, text: str | None) -> str:
    """A YAML error in one line: where (line, column and that line's text, trimmed, where `text` is
    known), what YAML wanted there in plain words, and the parser's own words in parentheses at the end.
    An error with no position (one of the bounds above) is its own words."""
    problem = str(getattr(err, "problem", None) or err)
    context = str(getattr(err, "context", None) or "")
    marks = {"problem": getattr(err, "problem_mark", None), "context": getattr(err, "context_mark", None)}
    rule = next((r for r in _PLAIN_WORDS if problem.startswith(r[0]) and r[1] in context), None)
    mark = (marks[rule[2]] if rule is not None else None) or marks["problem"]
    if mark is None:
        return f"not valid YAML: {problem}"
    lines = (text or "").splitlines()
    source = lines[mark.line] if mark.line < len(lines) else ""
    shown = f" ({source.strip(' ')[:80]!r})" if source.strip() else ""
    where = f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}{shown}"
    if rule is None:
        return f"{where}: {problem}"
    return f"{where}: {rule[3](mark.line + 1, source[mark.column :])} ({problem})"
