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

import json
import re
from collections.abc import Iterator
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
    and duplicate-key rejection."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
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
