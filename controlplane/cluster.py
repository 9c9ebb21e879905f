"""A real Kubernetes control plane on loopback, without Docker (`make cluster-up` / `make cluster-down`).

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from pinned modules by
controlplane/build.py), kwok simulating the GPU and CPU nodes and their pods, a real node real-0
(controlplane/node.py: containerd, kubelet, kube-proxy, CoreDNS) running real pods from our images,
the real KubeRay operator and the real rayship operator (the chart's pod on real-0; a host process
where real-0 does not run), each authenticated and authorised as it would be on a cluster:

    component                 identity                                   authorised by
    kube-apiserver            serving cert for 127.0.0.1 / kubernetes.default.svc
    kube-controller-manager   client cert CN=system:kube-controller-manager  bootstrap RBAC, and one
                              (--use-service-account-credentials)            ServiceAccount per controller
    kube-scheduler            client cert CN=system:kube-scheduler       bootstrap RBAC
    kwok                      client cert CN=rayship:kwok                ClusterRole rayship:kwok (kwok's own rules)
    PV provisioner            client cert CN=rayship:provisioner         ClusterRole rayship:provisioner
    KubeRay operator          ServiceAccount kuberay-system/kuberay-operator, TokenRequest token
                                                                         ClusterRole kuberay-operator (KubeRay's chart rules)
    rayship operator          the chart's ServiceAccount (its pod's token, or a TokenRequest token)
                                                                         the chart's own RBAC
    kubelet (real-0)          client cert O=system:nodes/CN=system:node:real-0   the Node authorizer
    kube-proxy                client cert CN=system:kube-proxy           bootstrap system:node-proxier
    CoreDNS                   client cert CN=rayship:coredns             ClusterRole rayship:coredns
    API server -> kubelet     client cert CN=kube-apiserver-kubelet-client   system:kubelet-api-admin
                              (the kubelet's serving cert is checked against the cluster CA)
    API server forwarders     none (TCP, TLS passes through)
    you (.cluster/kubeconfig) client cert O=system:masters

Address plan (nothing a component dials can leave this machine):

    127.0.0.1            every listener: etcd, apiserver, controller/scheduler health ports, the
                         operators' probe and metrics ports (free ports, recorded in .cluster/state.json)
    10.244.0.0/16        POD_CIDR. The host routes it into the network namespace `rayship-pods` (veth
                         rs-pods0 <-> rs-pods1, link 169.254.244.0/30). There a `local` route (table
                         local) makes every address of it local; as nothing listens, a connection to
                         any pod IP (the apiserver's pod/service proxy, KubeRay's dashboard client
                         through it) is refused at once by this machine's own kernel.
        10.244.0.0/24    node InternalIPs (10.244.0.11-14; .14 is real-0), the API server's advertise
                         address .1 and the cluster DNS .10 (controlplane/node.py); pods never get these
        10.244.1.0/24    podCIDR of node kwok-cpu-0
        10.244.2.0/24    podCIDR of node kwok-gpu-l4-0
        10.244.3.0/24    podCIDR of node kwok-gpu-a100-0
        10.244.4.0/24    real-0's pods, on its bridge in `rayship-pods` (a more specific route there)
    10.96.0.0/16         SERVICE_CIDR (ClusterIPs), routed into the same namespace: kube-proxy's rules
                         there lead a ClusterIP to its pods; any other is refused the same way.
    169.254.244.1:443    (LINK_HOST_IP) the API server as the node reaches it: a TCP forwarder to
                         127.0.0.1:<apiserver>; the IP is a SAN of its certificate.

Nothing here resolves a name: every address is a literal IP (the machine's resolver is not on
loopback), and proxy variables are removed from every component's environment.

CLI:  python controlplane/cluster.py up [--no-operator] [--no-node] | down | status | operator start|stop
API:  up(operator=, node=) -> Cluster, down(), leftovers(), status(), start_operator() -> OperatorHandle,
      stop_operator() -> bool, scale_operator(n), operator_deployment(client), real_node_namespace(name),
      service_account_kubeconfig(namespace, name) -> Path
"""
# ruff: noqa: E402  (the imports below follow the script path set-up)

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: python controlplane/cluster.py ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane import build
from controlplane.certs import cert_kubeconfig, ensure_pki
from controlplane.components import (
    KWOK_STAGES,
    audit_offset,
    audit_since,
    start_api_forward,
    start_apiserver,
    start_controller_manager,
    start_etcd,
    start_kwok,
    start_provisioner,
    start_scheduler,
)
from controlplane.config import (
    API_FORWARD_PORT,
    KUBERAY_CRDS,
    LINK_HOST_IP,
    NETNS,
    NETNS_DIR,
    NODE_PROCS,
    NODES,
    SERVICE_IP,
    STORAGE_CLASS,
    VENV_BIN,
    VETH_HOST,
    log,
)
from controlplane.leftovers import leftovers
from controlplane.network import (
    api_forward,
    ensure_netns,
    netns_exists,
    note_netns_dir,
    release_netns_dir,
    remove_netns,
)
from controlplane.node_lifecycle import (
    load_images,
    node_images,
    node_missing,
    node_paths,
    real_node_namespace,
    start_node,
    stop_node,
)
from controlplane.objects import (
    ChartError,
    api_client,
    apply_kuberay_crds,
    bootstrap_objects,
    create_nodes,
    helm_install_rayship,
    kubectl_apply,
    service_account_kubeconfig,
    start_kuberay,
)
from controlplane.operator_run import (
    kill_operator,
    operator_deployment,
    operator_handle,
    restart,
    scale_operator,
    start_operator,
    stop_operator,
)
from controlplane.processes import (
    Background,
    Cluster,
    Paths,
    Proc,
    State,
    clean_env,
    file_digest,
    free_port,
    http_ok,
    https_get,
    load_state,
    locked,
    node_running,
    save_state,
    spawn_process,
    stop_process,
    wait_until,
)
from controlplane.storage import provisioner

# --- up / down / status -----------------------------------------------------------------------------
CORE = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "provisioner",
    "kuberay-operator",
)
# Started after CORE; `up` on a running cluster starts one that is missing (or restarts kwok / the API
# server when its stages / certificate changed) in place, without restarting the rest.
ADDONS = ("kube-apiserver-forward",)


def _ready(paths: Paths, state: State) -> bool:
    if not state.procs or not all(name in state.procs and state.procs[name].alive() for name in CORE):
        return False
    try:
        code, _ = https_get(f"https://127.0.0.1:{state.ports['apiserver']}/readyz", paths)
    except OSError:
        return False
    return code == 200


def _cluster(paths: Paths, state: State, started: bool) -> Cluster:
    return Cluster(
        server=f"https://127.0.0.1:{state.ports['apiserver']}",
        kubeconfig=paths.kubeconfig,
        ca_file=paths.pki / "ca.crt",
        state_dir=paths.base,
        ports=dict(state.ports),
        kuberay_kubeconfig=paths.kubeconfig_for("kuberay-operator"),
        operator=operator_handle(state) if "rayship-operator" in state.procs else None,
        started=started,
        chart_error=state.chart_error,
    )


def up(operator: bool | None = True, paths: Paths | None = None, node: bool | None = None) -> Cluster:
    """Start the cluster, or return the running one. Harmless and fast when it already runs.

    node: True starts the real node real-0 (controlplane/node.py) if it does not run, False stops
    it, None leaves it as it is. The rayship chart is helm-installed (again, if an earlier install
    failed; upgraded when the node came or went: its operator pod runs on real-0 then).
    operator: True runs the rayship operator if it does not run: the chart's pod where real-0 runs,
    a host process elsewhere; False stops the host process (for tests that start their own); None
    leaves it as it is. If the chart does not install, the cluster stays up, the reason is in
    `Cluster.chart_error`, and with operator=True ChartError is raised.
    """
    paths = paths or Paths()
    t0 = time.monotonic()
    with locked(paths):
        state = load_state(paths)
        started = False
        if _ready(paths, state):
            log(f"already running: {paths.kubeconfig} (checked in {time.monotonic() - t0:.1f}s)")
            _ensure_addons(paths, state)
        else:
            if state.procs or state.netns:
                log("a previous cluster is partly running: stopping it first")
                _down(paths)
            state = _start(paths)
            started = True
        _node_as_asked(node, paths, state)
        t1 = time.monotonic()
        try:
            helm_install_rayship(paths, state)
            state.chart_error = None
        except ChartError as err:
            state.chart_error = str(err)
            log(str(err))
        save_state(state, paths)
        if started:
            log(f"helm install rayship: {time.monotonic() - t1:.1f}s")
    if operator is True and state.chart_error is None:
        if node_running(state):
            stop_operator(paths=paths)
            scale_operator(1, paths=paths)
        else:
            start_operator(paths=paths)
    elif operator is False:
        stop_operator(paths=paths)
    cluster = _cluster(paths, load_state(paths), started)
    if started:
        log(
            f"cluster started in {time.monotonic() - t0:.1f}s: kubectl --kubeconfig {paths.kubeconfig} get nodes"
        )
    if operator is True and cluster.chart_error:
        raise ChartError(f"the cluster is up, but the rayship chart did not install: {cluster.chart_error}")
    return cluster


def _node_as_asked(node: bool | None, paths: Paths, state: State) -> None:
    """`up`'s node=: True starts real-0 (or, running, imports the images that changed), False stops it."""
    if node is True and not node_running(state):
        stop_node(paths, state)  # what a half-started node left
        try:
            start_node(paths, state, build.binaries())
        except BaseException:
            log("the real node did not start: stopping what of it was started")
            stop_node(paths, state)
            save_state(state, paths)
            raise
        save_state(state, paths)
    elif node is True:  # running: the images as they are now (rebuilt and pulled if a source changed)
        npaths = node_paths(paths)
        load_images(npaths, *node_images(npaths))
    elif node is False and any(name in state.procs for name in NODE_PROCS):
        log(f"stopping the real node: {', '.join(stop_node(paths, state))}")
        save_state(state, paths)


def _ensure_addons(paths: Paths, state: State) -> None:
    """Bring a running cluster up to this file: the API server's certificate and kwok's stages as they
    are now (restarting the one whose input changed), the ADDONS running."""
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    ensure_pki(paths)
    for name, source in (("kube-apiserver", paths.pki / "apiserver.crt"), ("kwok", KWOK_STAGES)):
        if state.digests.get(name) == file_digest(source):
            continue
        log(f"{source.name} changed since {name} started: restarting {name}")
        proc = state.procs[name]
        stop_process(proc)
        state.procs[name] = spawn_process(name, proc.argv, paths, clean_env(paths))
        state.digests[name] = file_digest(source)
        save_state(state, paths)
        if name == "kube-apiserver":
            wait_until("kube-apiserver /readyz", lambda: https_get(f"{server}/readyz", paths)[0] == 200, 90)
    for name in ADDONS:
        proc = state.procs.get(name)
        if proc is not None and proc.alive():
            continue
        if proc is not None:
            stop_process(proc)
        log(f"{name} is not running: starting it")
        state.procs[name] = start_api_forward(paths, state)
        save_state(state, paths)
    _wait_api_forward(state.procs["kube-apiserver-forward"])


def _wait_api_forward(proc: Proc) -> None:
    def listening() -> bool:
        with socket.create_connection((LINK_HOST_IP, API_FORWARD_PORT), timeout=1):
            return True

    wait_until("the API server forwarder", listening, 30, proc)


def _prepare(paths: Paths, lap: Any) -> tuple[State, dict[str, Path]]:
    """What the components need before the first starts: the binaries, fresh folders, certificates, free
    ports and the network namespace (recorded in the state at once, so that `down` removes it)."""
    if os.geteuid() != 0:
        raise RuntimeError("cluster-up needs root (it creates the network namespace for the pod network)")
    bins = build.binaries()
    absent = [name for name, path in bins.items() if not path.exists()]
    if absent:
        log(f"binaries missing ({', '.join(absent)}): building them (make cluster-build)")
        build.ensure_built(log=log)
    lap("build check")
    shutil.rmtree(paths.logs, ignore_errors=True)  # a fresh cluster, fresh logs (down keeps the last ones)
    for d in (paths.logs, paths.run, paths.volumes, paths.run / "home"):
        d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(paths.etcd, ignore_errors=True)
    ensure_pki(paths)
    lap("certificates")
    netns_dir = Path(NETNS_DIR)
    made_netns_dir, made_netns_mount = note_netns_dir(netns_dir)  # `ip netns add` makes them for good
    state = State(ports={name: free_port() for name in (
        "etcd-client", "etcd-peer", "apiserver", "kube-controller-manager", "kube-scheduler", "kuberay-metrics", "kuberay-probe",
    )})  # fmt: skip
    ensure_netns()
    state.netns = True
    if made_netns_dir:
        state.made_dirs.append(str(netns_dir))
    if made_netns_mount:
        state.made_mounts.append(str(netns_dir))
    save_state(state, paths)
    lap("network namespace")
    return state, bins


def _start(paths: Paths) -> State:
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[name] = now - mark
        mark = now

    state, bins = _prepare(paths, lap)
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    cert_kubeconfig(paths, "admin", server, paths.kubeconfig)

    def spawn(proc: Proc) -> Proc:
        state.procs[proc.name] = proc
        save_state(state, paths)
        return proc

    try:
        etcd = spawn(start_etcd(paths, state, bins))
        wait_until("etcd", lambda: http_ok(f"http://127.0.0.1:{state.ports['etcd-client']}/health"), 30, etcd)
        lap("etcd")
        apiserver = spawn(start_apiserver(paths, state, bins))
        wait_until(
            "kube-apiserver /readyz", lambda: https_get(f"{server}/readyz", paths)[0] == 200, 90, apiserver
        )
        lap("kube-apiserver")
        # The KubeRay CRDs (3 MB) are the apiserver's biggest job here: start them first, meanwhile
        # bring up the rest.
        crds = Background(apply_kuberay_crds, paths.kubeconfig)
        kcm = spawn(start_controller_manager(paths, state, bins, server))
        sched = spawn(start_scheduler(paths, state, bins, server))
        client = api_client(paths.kubeconfig)
        kubectl_apply(paths, bootstrap_objects())
        lap("RBAC, StorageClass, namespaces")
        kwok = spawn(start_kwok(paths, bins, server))
        spawn(start_provisioner(paths, server))
        forward = spawn(start_api_forward(paths, state))
        state.digests = {
            "kube-apiserver": file_digest(paths.pki / "apiserver.crt"),
            "kwok": file_digest(KWOK_STAGES),
        }
        create_nodes(client)
        _wait_api_forward(forward)
        lap("nodes, forwarder")
        crds.join()
        lap("KubeRay CRDs established")
        kuberay = spawn(start_kuberay(paths, state, bins, client, server))
        _wait_ready(state, client, {"kube-controller-manager": kcm, "kube-scheduler": sched}, kwok, kuberay)
        lap("controllers + nodes Ready")
    except BaseException:
        log("start failed: stopping what was started")
        _down(paths)
        raise
    log("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return state


def _wait_ready(state: State, client: Any, controllers: dict[str, Proc], kwok: Proc, kuberay: Proc) -> None:
    """The controllers healthy (their ports are named as they are), the nodes Ready, KubeRay ready."""
    for name, proc in controllers.items():
        wait_until(
            f"{name} /healthz",
            lambda p=name: http_ok(f"https://127.0.0.1:{state.ports[p]}/healthz", insecure_tls=True),
            60,
            proc,
        )
    wait_until("nodes Ready", lambda: _nodes_ready(client), 60, kwok)
    wait_until(
        "KubeRay operator /readyz",
        lambda: http_ok(f"http://127.0.0.1:{state.ports['kuberay-probe']}/readyz"),
        60,
        kuberay,
    )


def _nodes_ready(client: Any) -> bool:
    import kubernetes

    nodes = kubernetes.client.CoreV1Api(client).list_node().items
    ready = {
        n.metadata.name
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        and not any(t.key == "node.kubernetes.io/not-ready" for t in (n.spec.taints or []))
    }
    return ready >= {n.name for n in NODES}


def _down(paths: Paths) -> list[str]:
    state = load_state(paths)
    stopped = stop_node(paths, state)
    # Reverse start order: the operators first, etcd last.
    for name in reversed(list(state.procs)):
        proc = state.procs[name]
        if proc.alive():
            stopped.append(f"{name} (pgid {proc.pid})")
        stop_process(proc)
    if remove_netns():
        stopped.append(f"netns {NETNS} with its routes")
    netns_dir = Path(NETNS_DIR)
    made_dir = str(netns_dir) in state.made_dirs
    for problem in release_netns_dir(
        netns_dir, made_dir=made_dir, made_mount=made_dir or str(netns_dir) in state.made_mounts
    ):
        log(problem)
    for path in (paths.etcd, paths.volumes, paths.run):
        shutil.rmtree(path, ignore_errors=True)
    for path in (paths.state, paths.kubeconfig):
        path.unlink(missing_ok=True)
    return stopped


def down(paths: Paths | None = None) -> None:
    """Stop every process `up` started (by process group), remove the netns, routes and cluster data.

    Keeps the certificates (.cluster/pki), the logs and the build cache. Harmless when nothing runs.
    """
    paths = paths or Paths()
    if not paths.base.exists():
        log(f"removed a leftover netns {NETNS}" if remove_netns() else "nothing to stop")
        return
    with locked(paths):
        stopped = _down(paths)
    log(("stopped and removed " + ", ".join(stopped)) if stopped else "nothing to stop")


def status(paths: Paths | None = None) -> dict[str, Any]:
    paths = paths or Paths()
    state = load_state(paths)
    procs = {name: {"pid": p.pid, "alive": p.alive(), "log": p.log} for name, p in state.procs.items()}
    ready = False
    if "apiserver" in state.ports and paths.pki.exists():
        with contextlib.suppress(OSError):
            ready = https_get(f"https://127.0.0.1:{state.ports['apiserver']}/readyz", paths)[0] == 200
    return {
        "apiserver_ready": ready,
        "kubeconfig": str(paths.kubeconfig) if paths.kubeconfig.exists() else None,
        "ports": state.ports,
        "processes": procs,
        "netns": netns_exists(),
        "operator": state.operator,
        "chart_error": state.chart_error,
    }


# --- CLI --------------------------------------------------------------------------------------------
def _up_command(args: argparse.Namespace) -> int:
    if args.started_file and not status()["apiserver_ready"]:
        # Before `up`: a start that fails half-way (the chart) leaves a cluster that is ours to stop.
        args.started_file.write_text("started by `controlplane/cluster.py up --started-file`\n")
    try:
        cluster = up(operator=not args.no_operator, node=not args.no_node)
    except ChartError:
        log(
            "the cluster is up, but the rayship chart did not install (see above); `make cluster-down` stops it"
        )
        return 1
    if cluster.operator:
        log(f"rayship operator: pid {cluster.operator.pid}, log {cluster.operator.log_path}")
    log(f"ready: kubectl --kubeconfig {cluster.kubeconfig} get nodes")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane/cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start the cluster (or check the running one)")
    p.add_argument(
        "--no-operator", action="store_true", help="do not run the rayship operator (stop it if it runs)"
    )
    p.add_argument("--no-node", action="store_true", help="without the real node real-0 (kwok nodes only)")
    p.add_argument(
        "--started-file",
        type=Path,
        help="write this file if this call started the cluster (not when it found one running): "
        "`make test` stops only a cluster it started",
    )
    p = sub.add_parser("down", help="stop everything and remove the netns and cluster data")
    p.add_argument(
        "--check",
        action="store_true",
        help="then exit 1, naming them, if processes, mounts or rules are left",
    )
    sub.add_parser("status", help="what runs, as JSON")
    p = sub.add_parser("operator", help="start or stop the rayship operator alone")
    p.add_argument("action", choices=("start", "stop"))
    p = sub.add_parser("provisioner", help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--volumes", type=Path, required=True)
    p = sub.add_parser("api-forward", help=argparse.SUPPRESS)
    p.add_argument("--listen", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--to", type=int, required=True)
    p.add_argument("--to-host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up_command(args)
    elif args.command == "down":
        down()
        left = leftovers() if args.check else []
        if left:
            log(f"`down` left these on the machine: {left}")
            return 1
    elif args.command == "status":
        print(json.dumps(status(), indent=2))
    elif args.command == "operator":
        if args.action == "start":
            handle = start_operator()
            log(f"rayship operator: pid {handle.pid}, log {handle.log_path}")
        else:
            stop_operator()
    elif args.command == "provisioner":
        provisioner(args.kubeconfig, args.volumes)
    elif args.command == "api-forward":
        api_forward(args.listen, args.port, args.to, args.to_host)
    return 0


# What tests and benches use as `cluster.X` (the package's API; the rest lives beside it, by component).
__all__ = [
    "Cluster",
    "KUBERAY_CRDS",
    "NODES",
    "SERVICE_IP",
    "STORAGE_CLASS",
    "VENV_BIN",
    "VETH_HOST",
    "audit_offset",
    "audit_since",
    "down",
    "kill_operator",
    "leftovers",
    "main",
    "node_missing",
    "operator_deployment",
    "real_node_namespace",
    "restart",
    "scale_operator",
    "service_account_kubeconfig",
    "start_operator",
    "status",
    "stop_operator",
    "up",
]

if __name__ == "__main__":
    sys.exit(main())
