"""Pod stand-in: a real Ray head for each Ray head pod kwok runs (a component of controlplane/cluster.py).

kwok makes a head pod (label ray.io/node-type=head) Running with a pod IP but NOT Ready (the stage
`pod-ray-head` in kwok-stages.yaml); this process plays the kubelet for it:

* in a namespace labelled `rayship.dev/ray-heads=real` (cluster.py labels `default`), for a Ray
  cluster that asks for no GPU, it starts a real `ray start --head` from the project's venv, with
  the pod's IP, in a network namespace and a mount namespace of the pod's own, and marks the pod
  Ready only once Ray's dashboard answers at the pod IP (so KubeRay submits when it can succeed);
* anywhere else (e.g. the operator tier's namespaces) it marks the pod Ready at once: the simulated
  behaviour, nothing answers at the pod IP.

Worker pods stay simulated (kwok's). In a namespace with real heads, a worker that a RayService's
Serve Service selects (label ray.io/serve=true) is made not Ready, as its readiness probe (the Serve
proxy's health) would fail: nothing runs there, so the Service's only endpoint is the head.

The pod's network namespace `rsp-<pod uid>`: a veth pair from `rayship-pods` (`rsp-<uid[:8]>` there,
`eth0` in the pod), the pod IP/32 on eth0 with a default route via 169.254.244.2; in `rayship-pods`
the route `<pod IP>/32 dev rsp-<uid[:8]> table local` (more specific than the local /16 that refuses
every other pod address) and net.ipv4.ip_forward=1. The API server (127.0.0.1 only) is reached at
169.254.244.1:443, the host end of the `rayship-pods` link, through cluster.py's forwarder.

The pod's mount namespace (`ip netns exec` + `unshare --mount --propagation private`): a tmpfs on
/run holding /run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace} (a TokenRequest for
the pod's ServiceAccount, bound to the pod); tmpfs over .cluster/ (and rayship-runs/), /tmp (the
pod's TMPDIR and HOME) and /mnt; then each persistentVolumeClaim volume bound at its mountPath from
the claim's PV hostPath (read-only if the mount or the volume says so). /dev/shm, the venv and the
source stay visible: Ray runs from them.

The head offers the CPUs the job needs although the head pod's rayStartParams say num-cpus "0" (the
worker pods stay simulated): sum over the worker groups of replicas x num-cpus (rayStartParams, else
the container's cpu limit), at least 2, at most 4. A head process that exits is restarted in the
same namespaces, as a kubelet restarts a container (restartCount + 1, Ready False until the dashboard
answers again). When the pod goes, its head's process group is stopped and its netns deleted.

Every head is recorded in <state dir>/run/raypods/heads.json (process group, start time, netns),
so `cluster.py down` stops what a killed stand-in left behind.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a script by cluster.py: the checkout's controlplane package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from controlplane.cluster import LINK_NS_IP, NETNS, _run, _start_ticks  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_BIN = ROOT / ".venv" / "bin"

POD_NETNS = NETNS
GATEWAY = LINK_NS_IP  # the `rayship-pods` end of the host link: the pods' default gateway
API_HOST, API_PORT = "169.254.244.1", 443  # the host end: cluster.py's API server forwarder
RAY_PODS = "ray.io/node-type"  # head and worker pods of KubeRay
NAMESPACE_LABEL, REAL = "rayship.dev/ray-heads", "real"
NETNS_PREFIX = "rsp-"
DASHBOARD_PORT, GCS_PORT = 8265, 6379
OBJECT_STORE_BYTES = 256 * 1024**2
MIN_CPUS, MAX_CPUS = 2, 4
TOKEN_SECONDS = 24 * 3600
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run
_META_KEY = re.compile(r"metadata\.(?P<map>labels|annotations)\['(?P<key>[^']+)'\]")
REPO_HIDDEN = (ROOT / ".cluster", ROOT / "rayship-runs")
SYSTEM_HIDDEN = (Path("/tmp"), Path("/mnt"))
HIDDEN = REPO_HIDDEN + SYSTEM_HIDDEN


def log(msg: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S')} raypods: {msg}", flush=True)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the pod's network namespace -----------------------------------------------------------------------
def netns_name(uid: str) -> str:
    return NETNS_PREFIX + uid


def _veth(uid: str) -> str:
    return NETNS_PREFIX + uid.replace("-", "")[:8]


def create_pod_network(uid: str, ip: str) -> str:
    ns, veth = netns_name(uid), _veth(uid)
    delete_pod_network(uid, ip)  # leftovers of an earlier stand-in
    _run(["ip", "netns", "add", ns])
    _run(["ip", "-n", POD_NETNS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    _run(["ip", "-n", ns, "route", "add", GATEWAY, "dev", "eth0", "scope", "link"])
    _run(["ip", "-n", ns, "route", "add", "default", "via", GATEWAY, "dev", "eth0"])
    _run(["ip", "-n", POD_NETNS, "link", "set", veth, "up"])
    # More specific than `local 10.244.0.0/16` in the same table: this one address is forwarded.
    _run(["ip", "-n", POD_NETNS, "route", "replace", f"{ip}/32", "dev", veth, "table", "local"])
    _run(["ip", "netns", "exec", POD_NETNS, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    return ns


def delete_pod_network(uid: str, ip: str | None) -> None:
    if ip:
        _run(["ip", "-n", POD_NETNS, "route", "del", f"{ip}/32", "table", "local"], check=False)
    _run(["ip", "-n", POD_NETNS, "link", "del", _veth(uid)], check=False)
    _run(["ip", "netns", "del", netns_name(uid)], check=False)


def pod_netns_names() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]


# --- the head process ------------------------------------------------------------------------------
@dataclass
class Head:
    uid: str
    namespace: str
    name: str
    ip: str
    netns: str
    pgid: int = 0
    start_ticks: int = 0
    restarts: int = 0
    ready: bool = False
    started_at: float = 0.0

    def alive(self) -> bool:
        return self.pgid > 0 and _start_ticks(self.pgid) == self.start_ticks


def stop_group(pgid: int, ticks: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL what is left after `timeout`."""

    def alive() -> bool:
        return _start_ticks(pgid) == ticks

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pgid, os.WNOHANG)

    if alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        wait(timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # the rest of the group (Ray's raylet, GCS, workers...)
    wait(5)


class StandIn:
    def __init__(self, kubeconfig: Path, state_dir: Path) -> None:
        import kubernetes

        self.k8s = kubernetes
        self.client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.ca = Path(self.client.configuration.ssl_ca_cert).read_bytes()
        self.run_dir = state_dir / "run" / "raypods"
        self.log_dir = state_dir / "logs" / "raypods"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.heads: dict[str, Head] = {}
        self.simulated: set[str] = set()  # pod uids marked Ready without a Ray head
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stopping = threading.Event()

    # -- records --
    def _save(self) -> None:
        tmp = self.run_dir / "heads.json.tmp"
        tmp.write_text(json.dumps({uid: asdict(h) for uid, h in self.heads.items()}, indent=2))
        tmp.replace(self.run_dir / "heads.json")

    # -- the API --
    def _real_namespace(self, namespace: str) -> bool:
        labels = self.core.read_namespace(namespace).metadata.labels or {}
        return labels.get(NAMESPACE_LABEL) == REAL

    def _ray_cluster(self, pod: Any) -> dict[str, Any] | None:
        name = (pod.metadata.labels or {}).get("ray.io/cluster")
        if not name:
            return None
        try:
            return self.custom.get_namespaced_custom_object(
                "ray.io", "v1", pod.metadata.namespace, "rayclusters", name
            )
        except self.k8s.client.exceptions.ApiException as err:
            if err.status == 404:
                return None
            raise

    def _set_ready(self, pod: Any, ready: bool, restarted: bool = False, why: str = "") -> None:
        """Patch the pod's Ready/ContainersReady conditions and its containers' `ready` (as a kubelet)."""
        now = _now()
        status = "True" if ready else "False"
        conditions = [
            {"type": t, "status": status, "lastTransitionTime": now} for t in ("Ready", "ContainersReady")
        ]
        if not ready:
            for c in conditions:
                c.update(
                    reason="ContainersNotReady",
                    message=why or "the Ray head is starting (controlplane/raypods.py)",
                )
        # containerStatuses has no merge key: the whole list is sent, as kwok wrote it, changed.
        containers = self.client.sanitize_for_serialization(pod.status.container_statuses or [])
        for entry in containers:
            entry["ready"] = ready
            if restarted:
                entry["restartCount"] = entry.get("restartCount", 0) + 1
                entry["lastState"] = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}}
                entry["state"] = {"running": {"startedAt": now}}
        body = {"status": {"conditions": conditions, "containerStatuses": containers}}
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)

    def _token(self, pod: Any) -> str:
        body = {
            "spec": {
                "audiences": [],
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                   "uid": pod.metadata.uid},
            }
        }  # fmt: skip
        sa = pod.spec.service_account_name or "default"
        return self.core.create_namespaced_service_account_token(
            sa, pod.metadata.namespace, body
        ).status.token

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        env: dict[str, str] = {}
        fields = {
            "status.podIP": pod.status.pod_ip,
            "metadata.name": pod.metadata.name,
            "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid,
            "spec.nodeName": pod.spec.node_name or "",
            "status.hostIP": pod.status.host_ip or "",
            "spec.serviceAccountName": pod.spec.service_account_name or "default",
        }
        for var in container.env or []:
            src = var.value_from
            if src is None:
                env[var.name] = var.value or ""
            elif src.secret_key_ref is not None:
                ref = src.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[var.name] = base64.b64decode((secret.data or {})[ref.key]).decode()
            elif src.field_ref is not None and src.field_ref.field_path in fields:
                env[var.name] = fields[src.field_ref.field_path]
            elif src.field_ref is not None and (m := _META_KEY.fullmatch(src.field_ref.field_path)):
                env[var.name] = (getattr(pod.metadata, m["map"]) or {}).get(m["key"], "")
            else:
                log(
                    f"{pod.metadata.namespace}/{pod.metadata.name}: env {var.name} not supported here: skipped"
                )
        return env

    def _claims(self, pod: Any, container: Any) -> list[tuple[str, str, bool]]:
        """(host folder, mountPath, read-only) for each persistentVolumeClaim volume the container mounts."""
        volumes = {v.name: v for v in pod.spec.volumes or [] if v.persistent_volume_claim is not None}
        out = []
        for mount in container.volume_mounts or []:
            vol = volumes.get(mount.name)
            if vol is None:
                continue
            claim = self.core.read_namespaced_persistent_volume_claim(
                vol.persistent_volume_claim.claim_name, pod.metadata.namespace
            )
            if not claim.spec.volume_name:
                raise RuntimeError(f"claim {claim.metadata.name} is not bound")
            pv = self.core.read_persistent_volume(claim.spec.volume_name)
            if pv.spec.host_path is None:
                raise RuntimeError(f"PV {pv.metadata.name} has no hostPath")
            path = mount.mount_path
            if mount.sub_path:
                raise RuntimeError(f"volume {mount.name}: subPath is not supported here")
            read_only = bool(mount.read_only or vol.persistent_volume_claim.read_only)
            out.append((pv.spec.host_path.path, path, read_only))
        return out

    @staticmethod
    def _num_cpus(raycluster: dict[str, Any]) -> int:
        total = 0.0
        for group in raycluster["spec"].get("workerGroupSpecs") or []:
            replicas = group.get("replicas", group.get("minReplicas", 0)) or 0
            cpus = (group.get("rayStartParams") or {}).get("num-cpus")
            if cpus is None:
                container = group["template"]["spec"]["containers"][0]
                cpus = ((container.get("resources") or {}).get("limits") or {}).get("cpu", "1")
            total += replicas * _cpu_quantity(str(cpus))
        return int(min(MAX_CPUS, max(MIN_CPUS, round(total))))

    @staticmethod
    def _gpus(raycluster: dict[str, Any]) -> bool:
        groups = [raycluster["spec"]["headGroupSpec"], *(raycluster["spec"].get("workerGroupSpecs") or [])]
        for group in groups:
            for c in group["template"]["spec"].get("containers") or []:
                limits = (c.get("resources") or {}).get("limits") or {}
                if any(k.endswith("/gpu") and str(v) not in ("0", "") for k, v in limits.items()):
                    return True
        return False

    # -- lifecycle --
    def handle(self, kind: str, pod: Any) -> None:
        uid = pod.metadata.uid
        if kind == "DELETED" or pod.metadata.deletion_timestamp is not None:
            self.simulated.discard(uid)
            if uid in self.heads:
                self.stop(uid)
            return
        if (pod.metadata.labels or {}).get("ray.io/node-type") != "head":
            self.worker(pod)
            return
        if (
            not pod.status.pod_ip
            or pod.status.phase != "Running"
            or uid in self.heads
            or uid in self.simulated
        ):
            return
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        who = f"{pod.metadata.namespace}/{pod.metadata.name}"
        raycluster = self._ray_cluster(pod)
        why_not = None
        if not self._real_namespace(pod.metadata.namespace):
            why_not = f"namespace not labelled {NAMESPACE_LABEL}={REAL}"
        elif raycluster is None:
            why_not = "no RayCluster"
        elif self._gpus(raycluster):
            why_not = "the Ray cluster asks for GPUs"
        if why_not:
            if not ready:
                self._set_ready(pod, True)
                log(f"{who}: simulated ({why_not}): Ready")
            self.simulated.add(uid)
            return
        assert raycluster is not None
        if ready:  # a head of an earlier stand-in: not Ready again until this one answers
            self._set_ready(pod, False)
        head = Head(uid, pod.metadata.namespace, pod.metadata.name, pod.status.pod_ip, netns_name(uid))
        self.heads[uid] = head
        try:
            create_pod_network(uid, head.ip)
            self.start(head, pod, raycluster)
        except Exception as err:  # noqa: BLE001  (reported in the log; the pod stays not Ready)
            log(f"{who}: could not start a Ray head: {err}")
            self.stop(uid)
            self.heads[uid] = head  # remembered: not retried on every event
        self._save()

    def worker(self, pod: Any) -> None:
        """A worker pod stays simulated: no Ray runs in it. One that a RayService's Serve Service selects
        (label ray.io/serve=true) is made not Ready in a namespace with real heads, as its readiness probe
        (Ray's Serve proxy health) would fail: the Serve Service then sends requests to the head only."""
        labels = pod.metadata.labels or {}
        if (
            labels.get("ray.io/serve") != "true"
            or pod.metadata.uid in self.simulated
            or not pod.status.pod_ip
        ):
            return
        if not self._real_namespace(pod.metadata.namespace):
            self.simulated.add(pod.metadata.uid)
            return
        self._set_ready(
            pod, False, why="simulated worker: no Ray, no Serve proxy here (controlplane/raypods.py)"
        )
        self.simulated.add(pod.metadata.uid)
        log(f"{pod.metadata.namespace}/{pod.metadata.name}: simulated Serve worker: not Ready")

    def start(self, head: Head, pod: Any, raycluster: dict[str, Any]) -> None:
        container = next(c for c in pod.spec.containers if c.name == "ray-head") if any(
            c.name == "ray-head" for c in pod.spec.containers) else pod.spec.containers[0]  # fmt: skip
        stage = self.run_dir / head.uid
        stage.mkdir(parents=True, exist_ok=True)
        (stage / "token").write_text(self._token(pod))
        (stage / "ca.crt").write_bytes(self.ca)
        (stage / "namespace").write_text(pod.metadata.namespace)
        env = self._env(pod, container)
        env.update(
            PATH=f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            HOME="/tmp/home", TMPDIR="/tmp", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
            KUBERNETES_SERVICE_HOST=API_HOST, KUBERNETES_SERVICE_PORT=str(API_PORT),
            KUBERNETES_SERVICE_PORT_HTTPS=str(API_PORT), LANG="C.UTF-8",
        )  # fmt: skip
        cpus = self._num_cpus(raycluster)
        ray = [
            str(VENV_BIN / "ray"), "start", "--head", "--block", f"--node-ip-address={head.ip}",
            "--dashboard-host=0.0.0.0", f"--port={GCS_PORT}", f"--dashboard-port={DASHBOARD_PORT}",
            f"--num-cpus={cpus}", "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]  # fmt: skip
        q = shlex.quote
        lines = ["set -eu", "mount -t tmpfs -o mode=755 rayship-run /run", f"mkdir -p {SA_DIR}"]
        lines += [f"cp {q(str(stage / f))} {SA_DIR}/{f}" for f in ("token", "ca.crt", "namespace")]
        claims = self._claims(pod, container)
        # The claims' folders are held open under /run first: the host's data is hidden next, then
        # they are bound where the pod mounts them.
        for i, (src, _, _) in enumerate(claims):
            lines += [f"mkdir -p /run/rayship-claims/{i}", f"mount --bind {q(src)} /run/rayship-claims/{i}"]
        # The checkout (its venv runs Ray) may itself live under a hidden folder (a clone in /tmp):
        # hold it open too, hide the system folders, then put it back and hide its own data again.
        under = next((h for h in SYSTEM_HIDDEN if ROOT.is_relative_to(h)), None)
        if under is not None:
            lines += ["mkdir -p /run/rayship-root", f"mount --bind {q(str(ROOT))} /run/rayship-root"]
        for hidden in SYSTEM_HIDDEN:
            lines.append(
                f"if [ -d {q(str(hidden))} ]; then mount -t tmpfs rayship-hidden {q(str(hidden))}; fi"
            )
        if under is not None:
            lines += [f"mkdir -p {q(str(ROOT))}", f"mount --bind /run/rayship-root {q(str(ROOT))}"]
        for hidden in REPO_HIDDEN:
            lines.append(
                f"if [ -d {q(str(hidden))} ]; then mount -t tmpfs rayship-hidden {q(str(hidden))}; fi"
            )
        lines.append("mkdir -p /tmp/home")
        for i, (_, dst, ro) in enumerate(claims):
            lines += [f"mkdir -p {q(dst)}", f"mount --bind /run/rayship-claims/{i} {q(dst)}"]
            if ro:
                lines.append(f"mount -o remount,bind,ro {q(dst)}")
        lines.append("cd /tmp/home")
        lines.append("exec " + " ".join(q(a) for a in ray))
        script = "\n".join(lines) + "\n"
        (stage / "start.sh").write_text(script)  # for reading only: sh gets it with -c (.cluster is hidden)
        argv = ["ip", "netns", "exec", head.netns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script]  # fmt: skip
        logfile = self.log_dir / f"{head.namespace}.{head.name}.log"
        with open(logfile, "ab") as out:
            out.write(f"\n=== {_now()} {' '.join(ray)} (in {head.netns})\n".encode())
            out.flush()
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)  # fmt: skip
        popen.returncode = 0  # reaped by stop_group / the loop, not by Popen
        head.pgid = popen.pid
        head.start_ticks = _start_ticks(popen.pid) or 0
        head.started_at = time.monotonic()
        head.ready = False
        log(
            f"{head.namespace}/{head.name}: Ray head pgid {head.pgid} at {head.ip} ({cpus} CPUs), log {logfile}"
        )

    def stop(self, uid: str, timeout: float = 10.0) -> None:
        head = self.heads.pop(uid)
        if head.pgid:
            stop_group(head.pgid, head.start_ticks, timeout)
        delete_pod_network(uid, head.ip)
        with contextlib.suppress(OSError):
            for f in ("token", "ca.crt", "namespace"):
                (self.run_dir / uid / f).unlink(missing_ok=True)
            (self.run_dir / uid).rmdir()
        self._save()
        log(f"{head.namespace}/{head.name}: Ray head stopped, netns {head.netns} deleted")

    def tick(self) -> None:
        """Readiness (the dashboard answers at the pod IP) and restarts of heads that exited."""
        for head in list(self.heads.values()):
            if head.pgid == 0:
                continue
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(head.pgid, os.WNOHANG)
            if not head.alive():
                pod = self._read_pod(head)
                if pod is None:
                    continue
                log(f"{head.namespace}/{head.name}: Ray head exited: restarting it (as a kubelet would)")
                stop_group(head.pgid, head.start_ticks, timeout=2)
                head.restarts += 1
                self._set_ready(pod, False, restarted=True)
                raycluster = self._ray_cluster(pod)
                if raycluster is None:
                    continue
                self.start(head, pod, raycluster)
                self._save()
            elif not head.ready and _answers(head.ip, DASHBOARD_PORT):
                pod = self._read_pod(head)
                if pod is None:
                    continue
                self._set_ready(pod, True)
                head.ready = True
                self._save()
                took = time.monotonic() - head.started_at
                log(f"{head.namespace}/{head.name}: dashboard answers after {took:.1f}s: Ready")

    def _read_pod(self, head: Head) -> Any:
        try:
            pod = self.core.read_namespaced_pod(head.name, head.namespace)
        except self.k8s.client.exceptions.ApiException as err:
            if err.status != 404:
                raise
            pod = None
        if pod is None or pod.metadata.uid != head.uid:
            self.stop(head.uid)
            return None
        return pod

    # -- the loop --
    def watch(self) -> None:
        """List, then watch, the head pods; queue every event (a thread: the loop also has to tick)."""
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(label_selector=RAY_PODS)
                self.events.put(("LIST", listed.items))
                w = self.k8s.watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, label_selector=RAY_PODS,
                                   resource_version=listed.metadata.resource_version, timeout_seconds=60):  # fmt: skip
                    self.events.put((ev["type"], ev["object"]))
                    if self.stopping.is_set():
                        break
            except Exception as err:  # noqa: BLE001  (the API server may be restarting: list again)
                log(f"watch: {err}")
                self.stopping.wait(1)

    def loop(self) -> None:
        threading.Thread(target=self.watch, daemon=True).start()
        while not self.stopping.is_set():
            try:
                kind, obj = self.events.get(timeout=0.5)
            except queue.Empty:
                kind, obj = "", None
            try:
                if kind == "LIST":
                    present = {p.metadata.uid for p in obj}
                    for uid in [u for u in self.heads if u not in present]:
                        self.stop(uid)
                    self.simulated &= present
                    for pod in obj:
                        self.handle("ADDED", pod)
                elif kind:
                    self.handle(kind, obj)
                self.tick()
            except Exception as err:  # noqa: BLE001  (logged; the next event or list retries)
                log(f"error: {type(err).__name__}: {err}")
        self.shutdown()

    def shutdown(self) -> None:
        for head in self.heads.values():  # all at once: each takes seconds to stop
            if head.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(head.pgid, signal.SIGTERM)
        for uid in list(self.heads):
            self.stop(uid, timeout=5)


def _cpu_quantity(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _answers(ip: str, port: int) -> bool:
    """True when an HTTP request to ip:port gets any response (the Ray dashboard is up)."""
    try:
        with socket.create_connection((ip, port), timeout=1) as s:
            s.settimeout(2)
            s.sendall(f"GET /api/gcs_healthz HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
            return s.recv(12).startswith(b"HTTP/")
    except OSError:
        return False


def cleanup(state_dir: Path) -> list[str]:
    """Stop the heads and remove the pod netns a stand-in left behind (for `cluster.py down`)."""
    done = []
    record = state_dir / "run" / "raypods" / "heads.json"
    with contextlib.suppress(OSError, ValueError):
        for uid, h in json.loads(record.read_text()).items():
            if h.get("pgid") and _start_ticks(h["pgid"]) == h.get("start_ticks"):
                stop_group(h["pgid"], h["start_ticks"])
                done.append(f"Ray head {h['namespace']}/{h['name']} (pgid {h['pgid']})")
            delete_pod_network(uid, h.get("ip"))
    for ns in pod_netns_names():
        _run(["ip", "netns", "del", ns], check=False)
        done.append(f"netns {ns}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane/raypods.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    for what in cleanup(args.state_dir):  # what a stand-in killed earlier left behind
        log(f"stopped a leftover: {what}")
    standin = StandIn(args.kubeconfig, args.state_dir)
    signal.signal(signal.SIGTERM, lambda *_: standin.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: standin.stopping.set())
    log(f"watching pods {RAY_PODS}; real Ray heads in namespaces labelled {NAMESPACE_LABEL}={REAL}")
    standin.loop()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
