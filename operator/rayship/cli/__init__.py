"""`rayship` command line: render | run | serve | demo | apply | get | status | logs | completion |
generate | operator.

- `render -f`: the KubeRay objects the operator would create, offline (cluster validation rules), read
  as kubectl reads `-f` (files, folders, Lists; other kinds passed through): `render.py`, `manifests.py`.
- `run -f` / `serve` / `demo -f`: the same YAML on local Ray (`rayship_workloads.local`).
- `apply -f`: kubectl apply with a local workingDir packed onto the claim the Ray pods mount
  (`apply.py`, `rayship.codepack`, `rayship.codeupload`).
- `get`, `status` (`describe`), `logs`: the objects on a cluster, as kubectl reaches it (`-n`,
  `--context`, `--kubeconfig`: `cli.kube`); `get.py`, `status.py`, `rayship.joblogs`.
- `completion bash|zsh|fish`: a shell completion script generated from this parser (`completion.py`).
- `generate [--check]`: the CRDs, chart files and manifests from the API models.
- `operator`: the kopf controller.

Bad input never shows a traceback: it exits 1 with one line per problem, each naming the field; a
cluster that cannot be reached exits 5 (`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from rayship import __version__, api
from rayship.api.validation import SpecError, parse
from rayship.cli import apply, completion, get, kube, render, status
from rayship.cli.manifests import InputError, load_documents
from rayship.config import ConfigError

EXIT_INVALID = kube.EXIT_ERROR
EXIT_CODES = f"""exit codes:
  {kube.EXIT_OK}  done
  {kube.EXIT_ERROR}  an error, said in one line: bad input, a missing object, a refused request, no kubeconfig
  {kube.EXIT_USAGE}  usage: an unknown command or flag, a missing argument
  3  rayship logs: the job has written no logs yet;  4: no such process or attempt
  {kube.EXIT_UNREACHABLE}  the API server could not be reached: refused, no answer, unknown host, TLS failed
"""


def _workloads() -> Any:
    try:
        from rayship_workloads import local
    except ImportError as err:
        raise InputError(
            f"the workload stack is not installed ({err.name}): run `make setup` or "
            "`pip install -e '.[workloads]'`"
        ) from None
    return local


def _one(path: str, model: type[api.ApiModel], *, local: bool = False) -> api.ApiModel:
    """The single document in `path`, validated, which must be of `model`'s kind (`local`: for
    local Ray, without the rules only a cluster needs)."""
    docs = list(load_documents(path))
    if len(docs) != 1:
        raise InputError(f"{path}: expected one {model.__name__}, found {len(docs)} documents")
    label, doc = docs[0]
    try:
        obj = parse(doc, local=local)
    except SpecError as err:
        raise SpecError([f"{label}: {p}" for p in err.problems]) from None
    if not isinstance(obj, model):
        raise InputError(f"{label}: expected a {model.__name__}, got {type(obj).__name__}")
    return obj


def _one_trainingjob(path: str) -> api.TrainingJob:
    tj = _one(path, api.TrainingJob, local=True)
    assert isinstance(tj, api.TrainingJob)
    return tj


def _runs_dir(value: str) -> Path:
    """--runs-dir, created now: a bad one is said before Ray starts."""
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"--runs-dir {value}: cannot create it: {err.strerror or err}") from None
    return path


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (1-65535)")
    return port


def _route_prefix(value: str) -> str:
    if not re.fullmatch(api.ROUTE_PREFIX_PATTERN, value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a route prefix: '/' or '/name[/name...]' (letters, digits, '_', '.', '-')"
        )
    return value


# Where `rayship serve` can read a model from (pyarrow's filesystems without a JVM or cloud SDK).
SERVABLE_SCHEMES = ("s3://", "gs://")


def _base_dir(path: str) -> Path:
    """Where relative paths in a YAML file are: its folder (the current one for stdin)."""
    return Path.cwd() if path == "-" else Path(path).resolve().parent


def _job_refusals() -> tuple[type[Exception], ...]:
    """What `rayship run` and `rayship demo` say in one line (`InputError`) rather than a traceback: bad
    data, a job refused before it starts, a training that failed for a reason it names."""
    from rayship_workloads.data import DataError
    from rayship_workloads.local import RunRefused
    from rayship_workloads.train import TrainingFailed

    return DataError, RunRefused, TrainingFailed


VERBOSE_HELP = (
    "also show Ray's own output (every Ray process's lines, Serve's and Ray Data's logs); by default it goes "
    "to the run's ray-output.log"
)


def _on_local_ray(args: argparse.Namespace, demo: bool) -> int:
    """`rayship run` (train) or `rayship demo` (train, serve, predict): the file's one TrainingJob on
    local Ray, what refuses it said in one line."""
    local = _workloads()
    doc = _one_trainingjob(args.file)
    where = {"runs_dir": _runs_dir(args.runs_dir), "base_dir": _base_dir(args.file), "verbose": args.verbose}
    try:
        if demo:
            local.demo(doc, port=args.port, **where)
        else:
            local.run(doc, restart=args.restart, **where)
    except _job_refusals() as err:
        raise InputError(f"{args.file}: {err}") from None
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    return _on_local_ray(args, demo=False)


def cmd_serve(args: argparse.Namespace) -> int:
    local = _workloads()
    from rayship import serve_local
    from rayship.controller.modelservice.engines import engine_of

    if args.file:
        ms = _one(args.file, api.ModelService, local=True)
        assert isinstance(ms, api.ModelService)
        label = args.file
        if (why := engine_of(ms).not_local) is not None:
            raise InputError(f"{label}: {why}")
        try:
            model = local.resolve_models(ms, runs_dir=Path(args.runs_dir))
        except FileNotFoundError as err:
            raise InputError(f"{label}: {err}") from None
        base_dir = Path.cwd() if args.file == "-" else Path(args.file).resolve().parent
    else:
        model, label, base_dir = args.model, f"--model {args.model}", Path.cwd()
        ms = api.ModelService.model_validate(
            {
                "apiVersion": api.API_VERSION,
                "kind": "ModelService",
                "metadata": {"name": "model"},
                "spec": {
                    "model": {"uri": model},
                    "routePrefix": args.route_prefix,
                    "resources": {"gpus": 0, "cpus": 1},
                },
            }
        )
    for uri in [model] if isinstance(model, str) else model.values():
        if "://" in uri and not uri.startswith(SERVABLE_SCHEMES):
            where = f"{label}: {uri}" if args.file else label
            raise InputError(
                f"{where}: rayship serve reads a model from a local path or "
                f"{', '.join(SERVABLE_SCHEMES)}; copy it to one of those"
            )
    try:
        serve_local.serve(ms, model, base_dir=base_dir, port=args.port)
    except (FileNotFoundError, ValueError, serve_local.DeployFailed) as err:  # not a model / app failed
        raise InputError(f"{label}: {err}") from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return _on_local_ray(args, demo=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from rayship import generate

    return generate.main(["--root", str(args.root)] + (["--check"] if args.check else []))


def cmd_operator(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from rayship.controller import handlers  # registers the handlers

    kopf.configure(verbose=args.verbose)  # INFO (DEBUG with --verbose) to stderr, one line per record
    if not args.verbose:
        # kopf says "Handler 'rayjob_changed' succeeded." at INFO for every event it hands a handler:
        # ten lines per TrainingJob (KubeRay updates its RayJob five or six times), which said nothing
        # our own lines do not, at a cost in CPU per event that bench/operator_scale.py shows at scale.
        # kopf's warnings and errors about an object stay.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    handlers.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from rayship import joblogs

    try:
        return joblogs.show(
            args.ref, namespace=args.namespace, attempt=args.attempt, rank=args.rank, follow=args.follow,
            image=args.image, kubeconfig=args.kubeconfig, context=args.context,
        )  # fmt: skip
    except joblogs.LogsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def _logs_parser(sub: Any, cluster: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "logs",
        parents=[cluster],
        help="a TrainingJob's output, kept next to its checkpoints: live while its Ray cluster runs, "
        "from the PVC after it is gone; a ModelService's replica logs while its pods run",
    )
    p.add_argument("ref", help="tj/NAME or ms/NAME")
    p.add_argument("--attempt", type=int, help="which attempt (1, 2, ...; default: the latest)")
    p.add_argument(
        "--rank",
        type=int,
        help="one training worker's own output (default: the driver's, with every worker's)",
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="follow it while the cluster runs (every pod's, for ms/)"
    )
    p.add_argument(
        "--image", help="image of the pod that reads the PVC once the cluster is gone (default: spec.image)"
    )
    p.set_defaults(func=cmd_logs)


def cluster_flags() -> argparse.ArgumentParser:
    """The flags of every command that talks to a cluster, as kubectl's."""
    flags = argparse.ArgumentParser(add_help=False)
    group = flags.add_argument_group("cluster (as kubectl)")
    group.add_argument(
        "-n", "--namespace", help="the namespace (default: the context's namespace, else default)"
    )
    group.add_argument("--context", help="the kubeconfig context (default: the current one)")
    group.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayship",
        description="Distributed ML on Ray, on Kubernetes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rayship {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cluster = cluster_flags()

    render.add_parser(sub)

    p = sub.add_parser("run", help="train a TrainingJob on local Ray (GPUs scaled down to CPU if absent)")
    p.add_argument("-f", "--file", required=True, help="TrainingJob YAML/JSON file, or - for stdin")
    p.add_argument("--runs-dir", default="rayship-runs", help="where checkpoints, metrics and the model go")
    p.add_argument(
        "--restart", action="store_true", help="train a finished job again from scratch (its run is replaced)"
    )
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", help="serve a ModelService or an exported model on local Ray (until Ctrl-C)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-f", "--file", help="ModelService YAML (fromTrainingJob resolves against --runs-dir)"
    )
    source.add_argument("--model", help="model URI: a path, PVC path or s3:// prefix (see `rayship run`)")
    p.add_argument("--runs-dir", default="rayship-runs", help="where `rayship run` left its results")
    p.add_argument("--port", type=_port, default=8000, help="HTTP port on 127.0.0.1")
    p.add_argument("--route-prefix", type=_route_prefix, default="/", help="route prefix, e.g. /mnist")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="train a TrainingJob locally, serve the model, query it once, shut down")
    p.add_argument("-f", "--file", required=True, help="TrainingJob YAML/JSON file")
    p.add_argument("--runs-dir", default="rayship-runs", help="where checkpoints, metrics and the model go")
    p.add_argument("--port", type=_port, default=8000, help="HTTP port on 127.0.0.1 for the demo service")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    p.set_defaults(func=cmd_demo)

    apply.add_parser(sub, cluster)
    get.add_parser(sub, cluster)
    status.add_parser(sub, cluster)
    _logs_parser(sub, cluster)
    completion.add_parser(sub, parser)

    p = sub.add_parser("generate", help="write the CRDs and manifests generated from the API models")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    p.add_argument("--check", action="store_true", help="only check that generated files are up to date")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("operator", help="run the controller (kopf) against the current kube context")
    p.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint")
    p.add_argument("--verbose", action="store_true", help="log every API request and handler (debug)")
    p.set_defaults(func=cmd_operator)
    return parser


def command() -> None:
    """The `rayship` program (its console script, `python -m rayship.cli`): `main()`, then the process
    ends as at a normal exit, less Python's teardown of its modules. A local run has imported torch,
    Ray, Ray Data, Serve and pandas by then: tearing those down took 1.5 s after the demo's last line
    (bench/demo.py's "exit" phase), memory the kernel frees at once anyway. What a normal exit does
    still runs, in its order: other threads are waited for (if one is left, the normal exit is taken),
    then every atexit function (logging's flush, Ray's shutdown), then the streams are flushed."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # CPython's own call at exit (Py_FinalizeEx), made here before _exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (InputError, SpecError, ConfigError) as err:  # ConfigError: RAYSHIP_* environment variables
        print(f"error: {err}".replace("\n", "\nerror: "), file=sys.stderr)
        return EXIT_INVALID
    except kube.ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
