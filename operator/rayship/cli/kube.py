"""How the CLI reaches a cluster, as kubectl does: the kubeconfig (`--kubeconfig`, else $KUBECONFIG, else
~/.kube/config; in a pod without one, the pod's own ServiceAccount), its context (`--context`, else the
current one) and that context's namespace (`-n` overrides it, else "default").

The one place the CLI builds its API client (`connect`) and turns what goes wrong into one line
(`ClusterError`, with its exit code): no kubeconfig, a context it lacks, an API server that does not
answer (no retries: urllib3 would otherwise retry three times, logging each), a refused or missing
object. `rayship get`, `rayship status` and `rayship logs` stand on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

from rayship import api
from rayship.api import yamlio

EXIT_OK = 0
EXIT_ERROR = 1  # bad input, a missing object, a refused request, a kubeconfig that cannot be used
EXIT_USAGE = 2  # argparse: an unknown command or flag, a missing argument
EXIT_UNREACHABLE = 5  # the API server could not be reached (refused, no answer, unknown host, TLS failed)
# (`rayship logs` also exits 3, no logs written yet, and 4, no such process or attempt: joblogs.)

TIMEOUT = (5.0, 30.0)  # seconds for each request: to connect, then for the answer
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterError(Exception):
    """One line naming what went wrong and what to do; `code` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Connection:
    client: Any  # kubernetes.client.ApiClient
    namespace: str  # the context's namespace ("default" when it names none)
    context: str  # the context used ("in-cluster" inside a pod without a kubeconfig)
    host: str  # the API server's address

    def namespace_or_default(self, namespace: str | None) -> str:
        return namespace or self.namespace


def _text_of(err: yaml.YAMLError) -> str | None:
    """The text of the file a YAML error is in (the kubernetes client reads the file as a stream
    named by its path), to show the line it points at."""
    name = str(getattr(getattr(err, "problem_mark", None), "name", "") or "")
    with contextlib.suppress(OSError, ValueError):
        return Path(name).read_text(errors="replace") if name and Path(name).is_file() else None
    return None


def kubeconfig_paths(flag: str | None) -> list[str]:
    """The kubeconfig files kubectl would read: --kubeconfig, else $KUBECONFIG (a list joined by
    ':'), else ~/.kube/config."""
    where = flag or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [os.path.expanduser(p) for p in where.split(os.pathsep) if p]


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """The API client of the kubeconfig's context, without retries (a dead server is said at once)."""
    import kubernetes

    paths = kubeconfig_paths(kubeconfig)
    configuration = kubernetes.client.Configuration()
    if not any(Path(p).is_file() for p in paths):
        if (
            kubeconfig is None
            and "KUBECONFIG" not in os.environ
            and os.environ.get("KUBERNETES_SERVICE_HOST")
        ):
            return _in_cluster(configuration, context)
        raise ClusterError(
            f"no kubeconfig at {':'.join(paths)}: name one with --kubeconfig FILE or KUBECONFIG=FILE "
            "(the file kubectl uses for the cluster)"
        )
    where = ":".join(paths)
    try:
        contexts, current = kubernetes.config.list_kube_config_contexts(config_file=where)
        names = sorted(c["name"] for c in contexts)
        if context is not None and context not in names:
            raise ClusterError(
                f"--context {context}: no such context in {where} (it has: {', '.join(names) or 'none'})"
            )
        if context is None and not current:
            raise ClusterError(
                f"{where} names no current context: pass --context NAME (it has: {', '.join(names) or 'none'})"
            )
        chosen = next(c for c in contexts if c["name"] == (context or current["name"]))
        kubernetes.config.load_kube_config(
            config_file=where, context=chosen["name"], client_configuration=configuration
        )
    except kubernetes.config.ConfigException as err:
        raise ClusterError(f"kubeconfig {where}: {_config_problem(err)}") from None
    except yaml.YAMLError as err:
        raise ClusterError(f"kubeconfig {where}: {yamlio.explain(err, _text_of(err))}") from None
    except (AttributeError, TypeError, KeyError) as err:  # YAML, not of a kubeconfig's shape
        raise ClusterError(
            f"kubeconfig {where}: not a valid kubeconfig ({type(err).__name__}: {err})"
        ) from None
    namespace = (chosen.get("context") or {}).get("namespace") or "default"
    return Connection(_client(configuration), namespace, chosen["name"], configuration.host)


def _in_cluster(configuration: Any, context: str | None) -> Connection:
    import kubernetes

    if context is not None:
        raise ClusterError(
            f"--context {context}: there is no kubeconfig here, only this pod's ServiceAccount"
        )
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException as err:
        raise ClusterError(f"in-cluster config: {err}") from None
    try:
        namespace = IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        namespace = "default"
    return Connection(_client(configuration), namespace, "in-cluster", configuration.host)


def _client(configuration: Any) -> Any:
    import kubernetes

    configuration.retries = False  # urllib3's default retries a refused connection 3 times, logging each
    return kubernetes.client.ApiClient(configuration)


def _config_problem(err: Exception) -> str:
    """The kubeconfig library's complaint, without its "Invalid kube-config file." preamble."""
    said = re.sub(r"^Invalid kube-config file\.\s*", "", str(err)).strip()
    return said or "not a valid kubeconfig"


@contextlib.contextmanager
def talking(conn: Connection, what: str, resource: str | None = None) -> Iterator[None]:
    """Requests about `what` (e.g. "trainingjob mlp in namespace team-a") of `resource` (e.g.
    trainingjobs.rayship.dev): what the API server or the network says, in one line."""
    from kubernetes.client import ApiException

    try:
        yield
    except ApiException as err:
        raise api_error(err, conn, what, resource) from None
    except urllib3.exceptions.HTTPError as err:
        raise unreachable(conn, err) from None


def unreachable(conn: Connection, err: Exception) -> ClusterError:
    return ClusterError(
        f"cannot reach the API server at {conn.host} (context {conn.context}): {network_problem(err)}; "
        "is the cluster up, and is this the kubeconfig and context you meant (--kubeconfig, --context)?",
        EXIT_UNREACHABLE,
    )


def network_problem(err: Exception) -> str:
    """urllib3's error in a few words: no connection-object reprs, no retry counts."""
    if isinstance(err, urllib3.exceptions.MaxRetryError) and err.reason is not None:
        err = err.reason
    if isinstance(err, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        err,
        urllib3.exceptions.NewConnectionError,  # a subclass of it, for history's sake: refused, no route
    ):
        return f"no connection within {TIMEOUT[0]:.0f} s"
    if isinstance(err, urllib3.exceptions.ReadTimeoutError):
        return "it took the connection but did not answer in time"
    said = _plain(str(err))
    if isinstance(err, urllib3.exceptions.SSLError):
        return f"TLS failed: {said}"
    return said or type(err).__name__


def _plain(said: str) -> str:
    """urllib3's and ssl's words without the connection object, errno and source line."""
    said = re.sub(r"<[^>]*>:?\s*|\w+Connection\(host=[^)]*\):\s*", "", said)
    said = re.sub(
        r"Failed to establish a new connection:\s*|\[Errno -?\d+\]\s*|\[SSL: [A-Z_]+\]\s*", "", said
    )
    said = re.sub(r"\s*\(_ssl\.c:\d+\)", "", said).strip().rstrip(".")
    return said[:1].lower() + said[1:]


def api_error(err: Any, conn: Connection, what: str, resource: str | None = None) -> ClusterError:
    """An ApiException as one line: not found, not installed, refused credentials, forbidden."""
    message, details = status_body(err.body)
    if err.status == 0:  # the client's own: TLS failed (its reason "SSLError\n<what ssl said>")
        return ClusterError(
            f"cannot reach the API server at {conn.host} (context {conn.context}): TLS failed: "
            f"{_plain(str(err.reason).partition(chr(10))[2] or str(err.reason))}; check the kubeconfig's "
            "server address and certificate-authority",
            EXIT_UNREACHABLE,
        )
    if err.status == 404 and details.get("kind") == "namespaces":
        return ClusterError(
            f"namespace {details.get('name')} not found (kubectl create namespace {details.get('name')})"
        )
    if err.status == 404 and details.get("name"):
        return ClusterError(f"{what} not found")
    if err.status == 404:
        return not_served(conn, resource or what)
    if err.status == 401:
        return ClusterError(
            f"the API server at {conn.host} did not accept the credentials of context {conn.context} "
            "(401 Unauthorized): log in again or refresh the kubeconfig"
        )
    if err.status == 403:
        return ClusterError(
            f"forbidden: {message or what}: ask a cluster admin for that permission (a Role or ClusterRole "
            f"bound to you), or use a context that has it (--context)"
        )
    return ClusterError(f"{what}: the API server said {err.status} {err.reason}: {message or err.body or ''}")


def not_served(conn: Connection, what: str) -> ClusterError:
    """A 404 that names no object: the API server does not serve the resource at all."""
    return ClusterError(
        f"the API server at {conn.host} does not serve {what}: are rayship's CRDs installed there? "
        "(helm install rayship charts/rayship, or kubectl apply -f manifests/)"
    )


def status_body(body: Any) -> tuple[str, dict[str, Any]]:
    """A metav1.Status body's (message, details); ("", {}) for anything else."""
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return str(body or "")[:300], {}
    if not isinstance(status, dict):
        return "", {}
    return str(status.get("message") or ""), status.get("details") or {}


def resource_of(kind: api.Kind) -> str:
    """`trainingjobs.rayship.dev`: how kubectl names the resource."""
    return kind.crd_name
