"""`rayship render -f FILE|DIR [-f ...] [-R] [-o yaml|json]`: the objects the operator would create for
the TrainingJobs, ModelServices and TrainingSchedules named, offline, validated by the rules the API
server applies, read as kubectl reads `-f` (`manifests`). Documents of other kinds (the checkpoint
claim, a ConfigMap) are passed through untouched, in their place, so that
`rayship render -f manifests/samples/ | kubectl apply -f -` applies what `kubectl apply -f` would have,
with rayship's kinds rendered. Bad input is one line per problem naming the file, the document and the
field, and nothing is printed; a ModelService whose TrainingJob is not among the documents is rendered,
with a warning (in a cluster it would wait for it)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rayship import api, codepack
from rayship.api.validation import SpecError, other_kind, other_kind_problems, parse, parse_trainingjob
from rayship.cli.manifests import files, load_documents
from rayship.cli.output import Dumper
from rayship.config import OperatorConfig, from_environment
from rayship.controller import trainingjob

if TYPE_CHECKING:
    from rayship.controller import modelservice


@dataclass
class Rendering:
    """The documents read, each validated: a rayship object, or one of another kind as it was written."""

    read: list[tuple[str, api.ApiModel | dict[str, Any]]] = field(default_factory=list)

    def trainingjobs(self) -> dict[str | None, list[str]]:
        """The TrainingJobs among the documents: namespace (None: not said) -> names."""
        found: dict[str | None, list[str]] = {}
        for _, obj in self.read:
            if isinstance(obj, api.TrainingJob):
                found.setdefault(obj.metadata.namespace, []).append(obj.metadata.name)
        return found


def validated(docs: list[tuple[str, Any]]) -> Rendering:
    """Every document validated, or a SpecError with every problem of every document."""
    out, errors = Rendering(), []
    for label, doc in docs:
        if other_kind(doc):
            problems = other_kind_problems(doc)
            errors += [f"{label}: {p}" for p in problems]
            if not problems:
                out.read.append((label, doc))
            continue
        try:
            out.read.append((label, parse(doc)))
        except SpecError as err:
            errors += [f"{label}: {p}" for p in err.problems]
    if errors:
        raise SpecError(errors)
    return out


def render_documents(
    docs: list[tuple[str, Any]], config: OperatorConfig, next_run: bool = False
) -> list[dict[str, Any]]:
    """The objects of every document, in the documents' order (nothing, and every problem, if any is
    invalid). A TrainingSchedule makes no object when it is applied, only a TrainingJob at each time
    due: it renders to nothing (its next due time said on stderr), or with `next_run` to that run's
    TrainingJob and its objects, a preview never to be applied as is (a run outside the schedule)."""
    rendering = validated(docs)
    jobs = rendering.trainingjobs()
    objects: list[dict[str, Any]] = []
    for label, obj in rendering.read:
        if isinstance(obj, dict):
            objects.append(obj)  # another kind: as written
        elif isinstance(obj, api.TrainingJob):
            for warning in trainingjob.secret_looking_env(obj):
                print(f"warning: {label}: {warning}", file=sys.stderr)
            objects.extend(trainingjob.render_trainingjob(obj, config))
        elif isinstance(obj, api.ModelService):
            from rayship.controller import (
                modelservice,  # on first use: a TrainingJob's render does without it
            )
            from rayship.controller.readable import modelservice_warnings

            for warning in modelservice_warnings(obj):
                print(f"warning: {label}: {warning}", file=sys.stderr)
            volume = obj.spec.storage.pvc if obj.spec.storage else None
            model = _offline_model(obj, label, jobs)
            objects.extend(modelservice.network_policy(obj, config))
            if (secret := modelservice.env_secret(obj, config)) is not None:
                objects.append(secret)  # before the RayService whose pods read it
            objects.append(modelservice.desired_rayservice(obj, config, model, volume))
        elif isinstance(obj, api.TrainingSchedule):
            run = _next_run(obj, label, config, next_run)
            if next_run:
                objects.extend(run)
    return objects


def _next_run(
    ts: api.TrainingSchedule, label: str, config: OperatorConfig, shown: bool
) -> list[dict[str, Any]]:
    """The TrainingJob a schedule's next run would be (its data's placeholders filled in for that
    time), and the objects it renders to."""
    from rayship.controller import trainingschedule

    now = datetime.now(UTC)
    due = trainingschedule.next_after(ts.spec.schedule, ts.spec.time_zone, now)
    if due is None:
        raise SpecError(
            [f"{label}: spec.schedule: {ts.spec.schedule!r} has no time due in the next five years"]
        )
    run = trainingschedule.build_run(ts, {"metadata": ts.metadata.model_dump()}, due)
    del run["metadata"]["ownerReferences"]  # the schedule's uid is the API server's to give
    said = (
        "below is that run: a preview, which applied would run now, outside the schedule"
        if shown
        else "so it renders to no object; --next-run prints that run"
    )
    print(
        f"note: {label}: TrainingSchedule {ts.metadata.name} makes one TrainingJob per time due, the next at "
        f"{due:%Y-%m-%dT%H:%M:%SZ}; {said}",
        file=sys.stderr,
    )
    return [run, *trainingjob.render_trainingjob(parse_trainingjob(run), config)]


def missing_trainingjob(name: str, namespace: str | None, jobs: dict[str | None, list[str]]) -> str | None:
    """Why a service's `fromTrainingJob` would wait in a cluster, judged from the documents rendered
    (`jobs`: namespace -> TrainingJob names; a namespace not said matches any), or None: it is there."""
    same = sorted(
        {n for ns, names in jobs.items() if namespace is None or ns is None or ns == namespace for n in names}
    )
    if name in same:
        return None
    guess = difflib.get_close_matches(name, same, n=1)
    return (
        f"TrainingJob {name} is not among the documents rendered; in a cluster the service waits until a "
        "TrainingJob of that name exists and succeeds" + (f"; did you mean {guess[0]}?" if guess else "")
    )


def _offline_model(ms: api.ModelService, label: str, jobs: dict[str | None, list[str]]) -> modelservice.Model:
    """`model.uri` (or each of `models`), a stand-in for `fromTrainingJob` (the real URI is known once
    the job succeeds) or `fromTrainingSchedule`; a TrainingJob not among the documents is warned of."""
    from rayship.controller import modelservice

    sources = {modelservice.ONE: ms.spec.model} if ms.spec.models is None else ms.spec.models
    namespace = ms.metadata.namespace or "default"
    out: dict[str, str] = {}
    for name, source in sources.items():
        assert source is not None  # the API guarantees exactly one of model and models
        if source.uri:
            out[name] = source.uri
            continue
        where = "model" if name == modelservice.ONE else f"models.{name}"
        if (schedule := source.from_training_schedule) is not None:
            print(
                f"note: {label}: {where}.fromTrainingSchedule is resolved by the operator to the run TrainingSchedule "
                f"{schedule.name} promoted last; the RayService below shows a stand-in model URI",
                file=sys.stderr,
            )
            out[name] = f"trainingschedule://{namespace}/{schedule.name}/{schedule.checkpoint}"
            continue
        ref = source.from_training_job
        assert ref is not None
        if (missing := missing_trainingjob(ref.name, ms.metadata.namespace, jobs)) is not None:
            print(f"warning: {label}: spec.{where}.fromTrainingJob: {missing}", file=sys.stderr)
        else:
            print(
                f"note: {label}: {where}.fromTrainingJob is resolved by the operator once TrainingJob {ref.name} "
                "succeeds; the RayService below shows a stand-in model URI",
                file=sys.stderr,
            )
        out[name] = f"trainingjob://{namespace}/{ref.name}/{ref.checkpoint}"
    return out if ms.spec.models is not None else out[modelservice.ONE]


def emit(objects: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        payload = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(payload, indent=2) + "\n"
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, width=120)


def read(paths: list[str], recursive: bool) -> list[tuple[str, Any, Path]]:
    """Every document `-f` names: (label, document, the folder its relative paths are relative to)."""
    return [
        (label, doc, Path.cwd() if path == "-" else Path(path).resolve().parent)
        for path in files(paths, recursive)
        for label, doc in load_documents(path)
    ]


Lookup = Callable[[str, str | None], "dict[str, Any] | None"]


def with_code(
    docs: list[tuple[str, Any, Path]], lookup: Lookup | None = None
) -> tuple[list[tuple[str, Any]], dict[str, codepack.Shipment]]:
    """The documents with each local runtimeEnv.workingDir packed (`codepack`) and replaced by the zip's
    URI on the claim the Ray pods mount, and what has to be uploaded there. A ModelService's code goes
    to its TrainingJob's claim: that TrainingJob is looked for among the documents, then by `lookup`
    (name, namespace) in the cluster. Every problem of every document, or none."""
    jobs = {
        (doc["metadata"].get("name"), doc["metadata"].get("namespace")): doc
        for _, doc, _ in docs
        if isinstance(doc, dict)
        and doc.get("kind") == "TrainingJob"
        and isinstance(doc.get("metadata"), dict)
    }
    out: list[tuple[str, Any]] = []
    shipments: dict[str, codepack.Shipment] = {}
    errors: list[str] = []
    for label, doc, base in docs:
        if not isinstance(doc, dict):
            out.append((label, doc))
            continue
        job = None
        if (ref := codepack.referenced_trainingjob(doc)) is not None:
            namespace = (doc.get("metadata") or {}).get("namespace")
            job = jobs.get((ref, namespace)) or next((d for (n, _), d in jobs.items() if n == ref), None)
            if job is None and lookup is not None:
                job = lookup(ref, namespace)
        try:
            shipment = codepack.plan(doc, base, job)
        except codepack.PackError as err:
            errors.append(f"{label}: {err}")
            continue
        if shipment is None:
            out.append((label, doc))
            continue
        shipments[label] = shipment
        out.append((label, codepack.rewritten(doc, shipment)))
    if errors:
        raise SpecError(errors)
    return out, shipments


def cmd_render(args: argparse.Namespace) -> int:
    config = from_environment()
    docs, shipments = with_code(read(args.file, args.recursive))
    objects = render_documents(docs, config, args.next_run)
    for label, shipment in shipments.items():
        print(
            f"note: {label}: {shipment.field} {shipment.folder} is packed ({shipment.package.counted}) as "
            f"{shipment.uri} on claim {shipment.claim.claim_name}: `rayship apply -f` uploads it there; "
            "`kubectl apply` of this output alone does not",
            file=sys.stderr,
        )
    sys.stdout.write(emit(objects, args.output))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "render",
        help="print the KubeRay objects TrainingJobs, ModelServices and TrainingSchedules become (offline); "
        "other kinds pass through",
        description="Render the objects the operator would create, offline, as kubectl reads -f: files, "
        "folders (their .yaml, .yml and .json files), several documents and kind: List in a file. "
        "Documents of other kinds are printed as written, in their place.",
    )
    p.add_argument(
        "-f",
        "--file",
        action="append",
        required=True,
        help="a YAML/JSON file, a folder, or - for stdin (repeatable)",
    )
    p.add_argument(
        "-R", "--recursive", action="store_true", help="also read the folders' subfolders (as kubectl -R)"
    )
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    p.add_argument(
        "--next-run",
        action="store_true",
        help="a TrainingSchedule's next run: its TrainingJob and objects (a preview; by default a schedule "
        "renders to nothing, as applying it makes nothing until a time is due)",
    )
    p.set_defaults(func=cmd_render)
