"""Reading manifests as kubectl reads `-f`: a file, `-` (stdin) or a folder (its .yaml, .yml and .json
files in name order; its subfolders too with `-R`), several documents in a file, `kind: List` taken
apart into its items; each document labelled with where it came from (`FILE (document 2, item 1)`), so
that a problem is said where it is. A YAML error is said in one line with its line and what YAML wanted
there (`yamlio.explain`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rayship.api import yamlio

# The files of a folder `kubectl apply -f DIR` reads (others are skipped).
SUFFIXES = (".yaml", ".yml", ".json")


class InputError(Exception):
    """A file that cannot be read or parsed."""


def files(paths: Sequence[str], recursive: bool = False) -> list[str]:
    """The files `-f` names, in order: `-` (stdin), a file, or a folder's manifests (`folder`)."""
    found: list[str] = []
    for path in paths:
        if path != "-" and Path(path).is_dir():
            inside = folder(Path(path), recursive)
            if not inside:
                hint = "" if recursive else " (-R reads its subfolders)"
                raise InputError(
                    f"{path}: no {', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]} files in this folder{hint}"
                )
            found += [str(p) for p in inside]
        else:
            found.append(path)
    return found


def folder(path: Path, recursive: bool) -> list[Path]:
    """A folder's manifest files by name, as kubectl walks it: a subfolder (with `recursive`) where its
    name sorts among the files."""
    try:
        entries = sorted(path.iterdir(), key=lambda p: p.name)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    found: list[Path] = []
    for entry in entries:
        if entry.is_dir():
            found += folder(entry, recursive) if recursive else []
        elif entry.suffix in SUFFIXES:
            found.append(entry)
    return found


def load_documents(path: str) -> list[tuple[str, Any]]:
    """(label, document) for each non-empty YAML document in `path` ('-' for stdin), a List's items each
    in its place."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (expected YAML or JSON)") from None
    try:
        docs = [d for d in yamlio.load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise InputError(f"{path}: {yamlio.explain(err, text)}") from None
    if not docs:
        raise InputError(f"{path}: no documents found (expected a TrainingJob)")
    parts = [[f"document {i}"] if len(docs) > 1 else [] for i in range(1, len(docs) + 1)]
    return [
        (f"{path} ({', '.join(where)})" if where else path, item)
        for doc, part in zip(docs, parts, strict=True)
        for where, item in taken_apart(doc, part)
    ]


def is_list(doc: Any) -> bool:
    """A `kind: List` (or a kind's own list, e.g. ConfigMapList) with its objects in `items`."""
    return (
        isinstance(doc, Mapping)
        and isinstance(doc.get("kind"), str)
        and doc["kind"].endswith("List")
        and isinstance(doc.get("items"), list)
    )


def taken_apart(doc: Any, where: list[str]) -> Iterator[tuple[list[str], Any]]:
    """A document, or each item of a List (and of a List in it), with where it is."""
    if not is_list(doc):
        yield where, doc
        return
    for index, item in enumerate(doc["items"], start=1):
        yield from taken_apart(item, [*where, f"item {index}"])
