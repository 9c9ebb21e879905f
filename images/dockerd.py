"""A private dockerd (with its own containerd) that runs only while the images are built.

It runs in a private mount namespace (its mounts never reach the host), with everything under the
cache, no bridge, no iptables rules and no IP forwarding; builds use the host's network. Stopped by its
process group, then checked: no process, mount or cgroup of it stays."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path

from images.processes import (
    LOG,
    BuildError,
    last_line,
    processes_mentioning,
    remove_cgroups,
    run_logged,
    running,
    start_logged,
    stop_group,
)

# Docker's own CLI from the docker.io package: it drives dockerd 20.10's built-in BuildKit (the
# builder users' Docker runs by default) without the buildx plugin that newer CLIs need for it.
DOCKER = "/usr/bin/docker"


class Docker:
    """A private dockerd (with its own containerd) whose state lives under the cache."""

    def __init__(self, root: Path) -> None:
        self.base = root  # nothing under it may stay mounted once dockerd stops
        self.root = root / "docker"  # data: layers, BuildKit's cache, containerd's content
        self.run_dir = root / "run"  # sockets and runtime state (short: unix socket paths)
        self.logs = root / "logs"
        self.socket = self.run_dir / "docker.sock"
        self.cgroup = "rayship-images"
        self.process: subprocess.Popen[bytes] | None = None
        # For a dockerd with a network (controlplane/kindcluster.py): a command it runs under (a network
        # namespace), daemon.json settings, shell lines run first in its mount namespace, and its
        # network flags. Building images needs none: no bridge, no iptables rules, no IP forwarding.
        self.prefix: list[str] = []
        self.daemon_settings: dict[str, object] = {}
        self.setup: list[str] = []
        self.network_flags = [
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]
        self.env = dict(
            os.environ,
            DOCKER_HOST=f"unix://{self.socket}",
            DOCKER_BUILDKIT="1",
            DOCKER_CONFIG=str(self.root / "cli"),
        )

    def _containerd_config(self) -> Path:
        # CRI off (no Kubernetes here); the opt plugin off (it would create /opt/containerd).
        config = self.root / "containerd.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{self.root / "containerd"}"\n'
            f'state = "{self.run_dir / "containerd"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt"]\n'
            f'[grpc]\n  address = "{self.run_dir / "containerd.sock"}"\n'
            f'[ttrpc]\n  address = "{self.run_dir / "containerd-ttrpc.sock"}"\n'
        )
        return config

    def _script(self) -> str:
        """Run inside the private mount namespace: a tmpfs over /run (containerd's shims put their
        sockets in /run/containerd/s whatever its state folder says), containerd, then dockerd."""
        containerd_sock = self.run_dir / "containerd.sock"
        daemon_json = self.root / "daemon.json"
        # Not /etc/docker/daemon.json; and the trust key, whose path dockerd 20.10 takes from its
        # configuration file only, not in /etc/docker/key.json.
        settings = {"deprecated-key-path": str(self.root / "key.json"), **self.daemon_settings}
        daemon_json.write_text(json.dumps(settings) + "\n")
        dockerd = [
            "dockerd",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.run_dir / 'docker'}",
            f"--pidfile={self.run_dir / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            f"--containerd={containerd_sock}",
            f"--config-file={daemon_json}",
            f"--cgroup-parent={self.cgroup}",
            "--storage-driver=overlay2",
            *self.network_flags,
        ]
        q = shlex.quote
        return (
            "set -e\n"
            + "".join(f"{line}\n" for line in self.setup)
            + "mount -t tmpfs -o mode=0755,size=64m rayship-images /run\n"
            + f"containerd --config {q(str(self._containerd_config()))} >> {q(str(self.logs / 'containerd.log'))} 2>&1 &\n"
            + f"for i in $(seq 300); do [ -S {q(str(containerd_sock))} ] && break; sleep 0.1; done\n"
            + f"exec {shlex.join(dockerd)} >> {q(str(self.logs / 'dockerd.log'))} 2>&1\n"
        )

    def start(self, log: LOG) -> None:
        if len(str(self.run_dir)) > 60:  # unix socket paths under it must fit in 108 bytes
            raise BuildError(f"{self.run_dir}: too long a path for unix sockets; set a shorter RAYSHIP_CACHE")
        for folder in (self.root, self.run_dir, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        # nice: the builds share the 2 cores with whatever else runs here (as the Go builds do)
        cmd = [*self.prefix, "nice", "-n", "10", "unshare", "--mount", "--propagation", "private", "--"]
        cmd += ["sh", "-c", self._script()]
        self.process = subprocess.Popen(cmd, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BuildError(f"dockerd exited ({self.process.returncode}): {self._log_tail()}")
            ping = self.docker("version", "--format", "{{.Server.Version}}")
            if ping.returncode == 0:
                log(
                    f"images: dockerd {ping.stdout.strip()} up (pid {self.process.pid}, state in {self.root})"
                )
                return
            time.sleep(0.5)
        raise BuildError(f"dockerd did not answer within 90 s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return f"{last_line(self.logs / 'dockerd.log')} [log: {self.logs / 'dockerd.log'}]"

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DOCKER, *args], env=self.env, capture_output=True, text=True)

    def docker_logged(self, args: list[str], log_file: Path, what: str) -> None:
        run_logged([DOCKER, *args], log_file, what, self.env)

    def docker_started(self, args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
        return start_logged([DOCKER, *args], log_file, self.env)

    def has_image(self, ref: str) -> bool:
        return self.docker("image", "inspect", ref).returncode == 0

    def stop(self, log: LOG) -> None:
        """dockerd first (it unmounts its layers), then containerd; then make sure that nothing of
        theirs is left: processes, mounts seen from the host, cgroups."""
        if self.process is None:
            return
        pgid = self.process.pid  # start_new_session: the group of dockerd and containerd
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log("images: dockerd did not stop within 60 s: killing it")
            self.process.kill()
            self.process.wait()
        self.process = None
        self.check_stopped(pgid, log)

    def check_stopped(self, pgid: int, log: LOG) -> None:
        """Once dockerd has exited: its process group, any process still naming its run folder (a
        container's shim), its mounts and its cgroups are gone, or BuildError says which is not."""
        stop_group(pgid, "dockerd and containerd", log)
        for pid in processes_mentioning(str(self.run_dir)):  # e.g. a container's shim
            log(f"images: stopping leftover process {pid}")
            os.kill(pid, signal.SIGKILL)
        mounted = [line for line in Path("/proc/mounts").read_text().splitlines() if str(self.base) in line]
        if mounted:
            raise BuildError(f"still mounted after dockerd stopped: {mounted[0]}")
        remove_cgroups(self.cgroup, log)


def docker_daemon(root: Path, log: LOG) -> AbstractContextManager[Docker]:
    """A private dockerd with its state under `root`, running while the block runs."""
    return running(Docker(root), log)
