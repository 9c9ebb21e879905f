"""`rayship get KIND [NAME...]`: rayship's objects as `kubectl get` lists them, the columns the CRDs
declare (`api.KINDS`: the same printer columns, short names and plurals the API server serves)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from rayship import api
from rayship.cli import kube, output

OUTPUTS = ("yaml", "json", "wide", "name")


def kind_words() -> dict[str, api.Kind]:
    """Every word that names a kind, as kubectl takes them: plural, singular, short names, the kind
    itself and `plural.group` (lower case; a word is matched case-insensitively)."""
    words: dict[str, api.Kind] = {}
    for kind in api.KINDS:
        for word in (kind.plural, kind.singular, *kind.short_names, kind.kind, kind.crd_name):
            words[word.lower()] = kind
    return words


def kind_names() -> list[str]:
    """The words completion offers for a kind: plural, singular and short names of each."""
    return [w for k in api.KINDS for w in (k.plural, k.singular, *k.short_names)]


class KindChoices(list[str]):
    """`choices` of a KIND argument: lists (for help and completion) the kind names, and takes any
    word that names a kind, in any case, or KIND/NAME."""

    def __init__(self) -> None:
        super().__init__(kind_names())

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and word.partition("/")[0].lower() in kind_words()


KIND_HELP = ", ".join(f"{k.plural} ({'/'.join(k.short_names)})" for k in api.KINDS) + "; or KIND/NAME"


def kind_of(word: str) -> api.Kind:
    found = kind_words().get(word.lower())
    if found is None:
        raise kube.ClusterError(f"{word}: not a kind rayship serves (one of {', '.join(kind_names())})")
    return found


def split_ref(ref: str) -> tuple[api.Kind | None, str]:
    """`tj/NAME` -> (TrainingJob, NAME); a bare NAME -> (None, NAME)."""
    word, slash, name = ref.partition("/")
    if not slash:
        return None, ref
    if not name:
        raise kube.ClusterError(f"{ref}: name an object as KIND/NAME, e.g. tj/mlp")
    return kind_of(word), name


def object_name(kind: api.Kind, obj: dict[str, Any]) -> str:
    """`-o name`: `trainingjob.rayship.dev/NAME`, as kubectl writes it."""
    return f"{kind.singular}.{api.GROUP}/{obj['metadata']['name']}"


def fetch(
    conn: kube.Connection, kind: api.Kind, namespace: str | None, names: Sequence[str], selector: str | None
) -> list[dict[str, Any]]:
    """The named objects (each must exist), else every object of the kind in `namespace` (None: in all)."""
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(conn.client)
    group, version, plural = kind.resource
    timeout, labels = kube.TIMEOUT, selector or ""
    if names:
        assert namespace is not None  # cmd_get refuses names with -A
        found = []
        for name in names:
            with kube.talking(conn, f"{kind.singular} {name} in namespace {namespace}", kind.crd_name):
                found.append(
                    custom.get_namespaced_custom_object(
                        group, version, namespace, plural, name, _request_timeout=timeout
                    )
                )
        return cast(list[dict[str, Any]], found)
    where = f"namespace {namespace}" if namespace else "any namespace"
    with kube.talking(conn, f"{kind.plural} in {where}", kind.crd_name):
        if namespace is None:
            listed = custom.list_cluster_custom_object(
                group, version, plural, label_selector=labels, _request_timeout=timeout
            )
        else:
            listed = custom.list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=labels, _request_timeout=timeout
            )
    items = cast(list[dict[str, Any]], cast(dict[str, Any], listed).get("items") or [])
    for item in items:  # a List's items carry no kind (as kubectl, -o yaml/json shows them with theirs)
        item.setdefault("apiVersion", api.API_VERSION)
        item.setdefault("kind", kind.kind)
    return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def render(
    kind: api.Kind, items: list[dict[str, Any]], how: str | None, single: bool, everywhere: bool
) -> str:
    if how in ("yaml", "json"):
        return output.dump(items, how, single)
    if how == "name":
        return "".join(object_name(kind, o) + "\n" for o in items)
    now = datetime.now(UTC)
    return output.table(kind, items, wide=how == "wide", namespaces=everywhere, now=now)


def cmd_get(args: argparse.Namespace) -> int:
    kind_word, names = args.kind, list(args.names)
    kind: api.Kind | None
    kind, first = split_ref(kind_word)
    if kind is not None:  # `get tj/mlp`: the kind and a first name in one
        names.insert(0, first)
    else:
        kind = kind_of(kind_word)
    if names and args.all_namespaces:
        raise kube.ClusterError(
            "a name cannot be looked up across all namespaces (-A): name its namespace with -n"
        )
    conn = kube.connect(args.kubeconfig, args.context)
    namespace = None if args.all_namespaces else conn.namespace_or_default(args.namespace)
    items = fetch(conn, kind, namespace, names, args.selector)
    if not items and args.output not in ("yaml", "json"):
        where = f"in {namespace} namespace" if namespace else ""
        print(f"No {kind.plural} found {where}".rstrip() + ".", file=sys.stderr)
        return kube.EXIT_OK
    sys.stdout.write(render(kind, items, args.output, bool(names) and len(names) == 1, namespace is None))
    return kube.EXIT_OK


def add_parser(sub: Any, cluster: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "get",
        parents=[cluster],
        help="list TrainingJobs, ModelServices or TrainingSchedules (tj, ms, ts) as kubectl does",
        description="List rayship's objects with the columns their CRDs declare (as `kubectl get`).",
    )
    p.add_argument("kind", metavar="KIND", choices=KindChoices(), help=KIND_HELP)
    p.add_argument("names", nargs="*", metavar="NAME", help="only these objects (each must exist)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list the kind in every namespace")
    p.add_argument("-l", "--selector", help="label selector, e.g. team=a (as kubectl's -l)")
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        help="yaml, json, wide (every printer column) or name (default: a table)",
    )
    p.set_defaults(func=cmd_get)
