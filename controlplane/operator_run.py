"""The rayship operator in the cluster: the chart's Deployment on real-0 (scaled, restarted), or a host
process where real-0 does not run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from controlplane.config import RAYSHIP_NAMESPACE, VENV_BIN, log
from controlplane.objects import api_client, service_account_token, token_kubeconfig
from controlplane.processes import (
    OperatorHandle,
    Paths,
    State,
    clean_env,
    free_port,
    http_ok,
    https_get,
    load_state,
    locked,
    node_running,
    reap,
    save_state,
    spawn_process,
    stop_process,
    wait_until,
)


# --- the rayship operator ---------------------------------------------------------------------------
def operator_deployment(client: Any) -> Any:
    """The chart's operator Deployment, as installed in the cluster."""
    import kubernetes

    apps = kubernetes.client.AppsV1Api(client)
    items = apps.list_namespaced_deployment(
        RAYSHIP_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
    ).items
    if not items:
        raise RuntimeError(f"no rayship operator Deployment in {RAYSHIP_NAMESPACE}: is the chart installed?")
    return items[0]


def start_operator(
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    paths: Paths | None = None,
    wait: bool = True,
    ready_timeout: float = 60,
) -> OperatorHandle:
    """Run the real rayship operator on the host, exactly as the chart's Deployment would run it.

    Its args and env come from the Deployment in the cluster (plus extra_args / extra_env); it
    authenticates as the Deployment's ServiceAccount (a TokenRequest token), so the chart's RBAC
    authorises every request. The liveness and metrics ports move to free loopback ports. If one
    is already running, returns its handle (stop it first to change its args or env). Returns once
    its liveness endpoint answers (within `ready_timeout` s), or (wait=False) as soon as it is spawned.
    """
    paths = paths or Paths()
    with locked(paths):
        state = load_state(paths)
        running = operator_handle(state)
        if running is not None and running.alive():
            return running
        server = f"https://127.0.0.1:{state.ports['apiserver']}"
        client = api_client(paths.kubeconfig)
        if node_running(state):  # the chart's pod runs a real operator there: never two at once
            _scale(client, 0)
        dep = operator_deployment(client)
        pod = dep.spec.template.spec
        container = next(c for c in pod.containers if c.name == "operator")
        token = service_account_token(client, dep.metadata.namespace, pod.service_account_name or "default")
        kc = token_kubeconfig(paths, "rayship-operator", server, token)
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        args = _operator_args(container, liveness, extra_args or [])
        env, metrics_port = _operator_env(container, extra_env or {})
        rayship = VENV_BIN / "rayship"
        argv = (
            [str(rayship), "operator", *args]
            if rayship.exists()
            else [sys.executable, "-m", "rayship.cli", "operator", *args]
        )
        full_env = clean_env(paths, KUBECONFIG=str(kc), PYTHONUNBUFFERED="1", **env)
        if os.environ.get("PYTHONPATH"):  # the caller's sources (a git worktree's), not the venv's install
            full_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        full_env["PATH"] = f"{VENV_BIN}:{full_env['PATH']}"
        proc = spawn_process("rayship-operator", argv, paths, full_env)
        state.procs["rayship-operator"] = proc
        state.operator = {"liveness_url": liveness, "metrics_port": metrics_port, "kubeconfig": str(kc)}
        save_state(state, paths)
        handle = operator_handle(state)
        assert handle is not None
    if not wait:
        return handle
    wait_until("rayship operator liveness", lambda: http_ok(liveness), ready_timeout, proc)
    log(f"rayship operator pid {proc.pid} ({' '.join(args)}), log {proc.log}")
    return handle


def _operator_args(container: Any, liveness: str, extra_args: list[str]) -> list[str]:
    """The Deployment container's args, its liveness endpoint moved to `liveness`."""
    args = list(container.args or [])
    if "--liveness" in args:
        args[args.index("--liveness") + 1] = liveness
    else:
        args += ["--liveness", liveness]
    return args + extra_args


def _operator_env(container: Any, extra_env: dict[str, str]) -> tuple[dict[str, str], int]:
    """The Deployment container's plain env, its metrics port (if on) moved to a free one; and that port."""
    env = {e.name: e.value for e in (container.env or []) if e.value is not None}
    metrics_port = 0
    if env.get("RAYSHIP_METRICS_PORT", "0") != "0":
        metrics_port = free_port()
        env["RAYSHIP_METRICS_PORT"] = str(metrics_port)
    env.update(extra_env)
    return env, metrics_port


def scale_operator(replicas: int, paths: Paths | None = None, timeout: float = 120) -> None:
    """Scale the chart's operator Deployment and wait until that many of its pods are ready (0: gone)."""
    paths = paths or Paths()
    _scale(api_client(paths.kubeconfig), replicas, timeout)


def _scale(client: Any, replicas: int, timeout: float = 120) -> None:
    import kubernetes

    dep = operator_deployment(client)
    apps = kubernetes.client.AppsV1Api(client)
    core = kubernetes.client.CoreV1Api(client)
    name, ns = dep.metadata.name, dep.metadata.namespace
    apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": replicas}})
    selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())

    def settled() -> bool:
        d = apps.read_namespaced_deployment(name, ns)
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        if replicas == 0:
            return not pods
        return (d.status.ready_replicas or 0) == replicas and (d.status.updated_replicas or 0) == replicas

    wait_until(f"operator Deployment at {replicas} ready replicas", settled, timeout)


def operator_handle(state: State) -> OperatorHandle | None:
    proc = state.procs.get("rayship-operator")
    if proc is None or state.operator is None:
        return None
    return OperatorHandle(proc.pid, Path(proc.log), state.operator["liveness_url"], state.operator["metrics_port"],
                          Path(state.operator["kubeconfig"]), proc.argv, proc.start_ticks)  # fmt: skip


def stop_operator(
    handle: OperatorHandle | None = None, paths: Paths | None = None, timeout: float = 10.0
) -> bool:
    """Stop the rayship operator (the one recorded in state.json; `handle` must be it, if given):
    SIGTERM, and SIGKILL if it still runs after `timeout` s. False if it took SIGKILL."""
    paths = paths or Paths()
    with locked(paths):
        state = load_state(paths)
        proc = state.procs.get("rayship-operator")
        if proc is None or (handle is not None and handle.pid != proc.pid):
            return True
        exited = stop_process(proc, timeout)
        del state.procs["rayship-operator"]
        state.operator = None
        save_state(state, paths)
        return exited


def kill_operator(handle: OperatorHandle | None = None, paths: Paths | None = None) -> None:
    """SIGKILL the rayship operator's process group (a crash: no cleanup), and forget it."""
    paths = paths or Paths()
    with locked(paths):
        state = load_state(paths)
        proc = state.procs.get("rayship-operator")
        if proc is None or (handle is not None and handle.pid != proc.pid):
            return
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        wait_until("the operator to die", lambda: not proc.alive(), 10)
        reap(proc.pid)
        del state.procs["rayship-operator"]
        state.operator = None
        save_state(state, paths)


def restart(component: str, paths: Paths | None = None) -> None:
    """Stop one running component (e.g. "kube-apiserver") and start it again with the same arguments,
    as a crash and a restart by its supervisor would; waits until the API server is ready again."""
    paths = paths or Paths()
    with locked(paths):
        state = load_state(paths)
        proc = state.procs[component]
        stop_process(proc)
        state.procs[component] = spawn_process(component, proc.argv, paths, clean_env(paths))
        save_state(state, paths)
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    wait_until("kube-apiserver /readyz", lambda: https_get(f"{server}/readyz", paths)[0] == 200, 90)
    log(f"restarted {component}")
