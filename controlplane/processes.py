"""What the cluster's processes share: its paths and state file (`.cluster/state.json`, under a lock),
and the small helpers that run, spawn, wait for and stop a component."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from controlplane.config import (
    NETNS,
    NODE_PROCS,
    NODES,
    POD_CIDR,
    SERVICE_CIDR,
    STATE_DIR,
    VENV_BIN,
    NodeSpec,
    log,
)


# --- paths and state --------------------------------------------------------------------------------
class Paths:
    def __init__(self, base: Path = STATE_DIR) -> None:
        self.base = base
        self.pki = base / "pki"
        self.logs = base / "logs"
        self.etcd = base / "etcd"
        self.volumes = base / "volumes"
        self.run = base / "run"  # per-start files: kubeconfigs with tokens, kwok config, cert dirs
        self.state = base / "state.json"
        self.lock = base / ".lock"
        self.kubeconfig = base / "kubeconfig"  # admin

    def kubeconfig_for(self, who: str) -> Path:
        return self.run / f"{who}.kubeconfig"


@dataclass
class Proc:
    name: str
    pid: int  # == its process group id (started with start_new_session=True)
    start_ticks: int  # /proc/<pid>/stat starttime: tells our process from a recycled pid
    log: str
    argv: list[str]

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


@dataclass
class OperatorHandle:
    """The rayship operator running on the host as the chart's ServiceAccount."""

    pid: int
    log_path: Path
    liveness_url: str
    metrics_port: int
    kubeconfig: Path  # the chart ServiceAccount's token
    argv: list[str]
    start_ticks: int = 0

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks

    def pause(self) -> None:
        """SIGSTOP its process group: it does nothing until SIGCONT (`stop_operator` sends one)."""
        if self.alive():
            os.killpg(self.pid, signal.SIGSTOP)


@dataclass
class Cluster:
    """What `up()` returns: where to reach the cluster and as whom."""

    server: str
    kubeconfig: Path  # admin (O=system:masters)
    ca_file: Path
    state_dir: Path
    ports: dict[str, int]
    kuberay_kubeconfig: Path
    operator: OperatorHandle | None = None
    started: bool = False  # False when up() found it already running
    chart_error: str | None = None  # set when `helm install` of the rayship chart failed
    nodes: tuple[NodeSpec, ...] = NODES

    def kubeconfig_for(self, who: str) -> Path:
        return Paths(self.state_dir).kubeconfig_for(who)

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient authenticated as the admin."""
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_command(
            [str(VENV_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], check=check, input=input
        )


@dataclass
class State:
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    netns: bool = False
    operator: dict[str, Any] | None = None
    chart_error: str | None = None  # why `helm install` of the rayship chart failed, if it did
    # What the running components were started with (kwok's stages, the API server's certificate):
    # when a file changed, `up` restarts the component that reads it.
    digests: dict[str, str] = field(default_factory=dict)
    # Host paths that the real node's mount namespace binds over and that `up` had to create.
    made_dirs: list[str] = field(default_factory=list)
    # Host mounts `up` caused that were not there (the one `ip netns add` makes of /run/netns).
    made_mounts: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ports": self.ports,
                "procs": {k: asdict(v) for k, v in self.procs.items()},
                "netns": self.netns,
                "operator": self.operator,
                "chart_error": self.chart_error,
                "digests": self.digests,
                "made_dirs": self.made_dirs,
                "made_mounts": self.made_mounts,
                "plan": {"pod_cidr": POD_CIDR, "service_cidr": SERVICE_CIDR, "netns": NETNS},
            },
            indent=2,
        )


def load_state(paths: Paths | None = None) -> State:
    paths = paths or Paths()
    try:
        raw = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return State()
    return State(
        ports=raw.get("ports", {}),
        procs={k: Proc(**v) for k, v in raw.get("procs", {}).items()},
        netns=raw.get("netns", False),
        operator=raw.get("operator"),
        chart_error=raw.get("chart_error"),
        digests=raw.get("digests", {}),
        made_dirs=raw.get("made_dirs", []),
        made_mounts=raw.get("made_mounts", []),
    )


def save_state(state: State, paths: Paths) -> None:
    tmp = paths.state.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(paths.state)


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    paths.base.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- small helpers ----------------------------------------------------------------------------------
def run_command(
    argv: list[str], check: bool = True, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, input=input, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return res


def _start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(paths: Paths, **extra: str) -> dict[str, str]:
    """A minimal environment: no proxy settings, no kubeconfig or in-cluster variables of the caller."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME")}
    keep.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    keep["HOME"] = str(paths.run / "home")
    keep.update(extra)
    return keep


def wait_until(what: str, check, timeout: float, proc: Proc | None = None, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: {proc.name} exited; see {proc.log}:\n{_tail(proc.log)}")
        try:
            result = check()
            if result:
                return result
        except Exception as err:  # noqa: BLE001  (polling: any failure means "not yet")
            last = err
        time.sleep(interval)
    tail = f"\n{_tail(proc.log)}" if proc else ""
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s (last error: {last}){tail}")


def _tail(path: str | Path, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def https_get(
    url: str, paths: Paths, client: str | None = "admin", token: str | None = None
) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(paths.pki / f"{client}.crt"), str(paths.pki / f"{client}.key"))
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_ok(url: str, insecure_tls: bool = False) -> bool:
    ctx = ssl._create_unverified_context() if insecure_tls else None  # self-signed health ports
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    if ctx:
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


# --- processes --------------------------------------------------------------------------------------
def spawn_process(name: str, argv: list[str], paths: Paths, env: dict[str, str]) -> Proc:
    paths.logs.mkdir(parents=True, exist_ok=True)
    log_path = paths.logs / f"{name}.log"
    with open(log_path, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=str(paths.base), start_new_session=True,
        )  # fmt: skip
    popen.returncode = 0  # never waited on here; silence the "still running" warning at exit
    ticks = _start_ticks(popen.pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited at once; see {log_path}:\n{_tail(log_path)}")
    return Proc(name, popen.pid, ticks, str(log_path), argv)


def stop_process(proc: Proc, timeout: float = 10.0) -> bool:
    """SIGTERM the process group, SIGKILL it after `timeout`; reap the leader if it is our child.
    True if the leader exited on SIGTERM (or was gone already), False if it took SIGKILL.

    The leader is reaped only at the end: until then its pid, and so the group id, stays ours.
    """

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    if not proc.alive():
        reap(proc.pid)  # gone already: its pid may belong to someone else by now
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGCONT)  # a paused (SIGSTOPped) group acts on it only once resumed
    wait(timeout)
    exited = not proc.alive()
    if not exited:
        log(f"{proc.name} (pgid {proc.pid}) ignored SIGTERM for {timeout:.0f}s: SIGKILL")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group (e.g. the leader's children)
    wait(5)
    reap(proc.pid)
    return exited


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def node_running(state: State) -> bool:
    return all(name in state.procs and state.procs[name].alive() for name in NODE_PROCS)


def file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class Background(threading.Thread):
    """Run fn(*args) in a thread; join() re-raises its exception."""

    def __init__(self, fn: Any, *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args, self.error = fn, args, None
        self.start()

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as err:  # noqa: BLE001  (handed to join())
            self.error = err

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
