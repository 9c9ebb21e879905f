"""Where the built images are kept: a Docker registry on 127.0.0.1 serving a folder of the cache.

A registry moves only what its client lacks. `docker push` uploads the layers the registry does not
have yet (after a source change: the last layer, a few MB). Before, `docker save` wrote the whole
6.8 GB workload image to an archive after every build. The real node's containerd pulls only the
blobs its content store lacks and unpacks only the new layer (`ctr images pull`). Before,
`ctr images import` read the whole archive again.

The registry is the distribution project's (Debian's docker-registry 2.8). It runs only while a build
pushes or a node pulls, never as a service, in a process group of its own. It listens on 127.0.0.1
only and needs no authentication: nothing but this machine reaches it. Its storage is a plain folder
that the garbage collector trims after each build to what the tags name: the newest build of each
image.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path

from images.processes import (
    LOG,
    BuildError,
    group_members,
    last_line,
    run_logged,
    running,
    start_logged,
    stop_group,
)

BINARY = "docker-registry"
# Fixed, because the registry's address is part of the name docker pushes to, and docker remembers
# which layers it pushed per registry: on another port every layer is compressed and uploaded again.
PORT = 29182
# The manifest types docker 20.10 pushes (one platform, no index), for a digest look-up.
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)
# Loopback never goes through a proxy: a machine's HTTP_PROXY must not see these requests.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def config(data: Path, port: int) -> dict:
    """The registry's configuration (JSON is YAML). Deletes are enabled so that the garbage collector
    can remove what no tag names. Access logs are off: a pull would log a line for every blob."""
    return {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(data)},
            "delete": {"enabled": True},
            "cache": {"blobdescriptor": "inmemory"},
        },
        "http": {"addr": f"127.0.0.1:{port}"},
    }


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the registry binds (Go sets it): a connection of a registry before that waits out its
        # TIME_WAIT on the port does not make it taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Registry:
    """The registry of the cache folder `root` (its data in root/registry)."""

    def __init__(self, root: Path) -> None:
        self.data = root / "registry"
        self.config_file = root / "registry.json"
        self.log_file = root / "logs" / "registry.log"
        self.pgid_file = root / "registry.pgid"  # while it runs: what a run killed outright leaves
        self.port = PORT
        self.pgid: int | None = None

    @property
    def host(self) -> str:
        """What image names start with to be pushed here or pulled from here."""
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(config(self.data, self.port), indent=2) + "\n")

    def _stop_left_over(self, log: LOG) -> None:
        """Stop the registry a run killed outright left serving this folder (it held the port): its
        process group, as recorded, if its leader still runs this folder's config. Only one user of
        the cache runs at a time (images/build.py's lock), so a registry found running is left over."""
        if not self.pgid_file.is_file():
            return
        pgid = int(self.pgid_file.read_text())
        try:
            leader = Path(f"/proc/{pgid}/cmdline").read_bytes()
        except OSError:  # ended
            leader = b""
        if group_members(pgid) and str(self.config_file).encode() in leader:
            log(f"images: stopping the registry a killed run left (process group {pgid})")
            stop_group(pgid, "the left-over registry", log)
        self.pgid_file.unlink()

    def start(self, log: LOG) -> None:
        self._stop_left_over(log)
        if not _port_free(PORT):
            self.port = _free_port()
            log(
                f"images: port {PORT} is taken: the registry serves on {self.port} (a push uploads every layer)"
            )
        self._write_config()
        process = start_logged([BINARY, "serve", str(self.config_file)], self.log_file, new_session=True)
        self.pgid = process.pid
        self.pgid_file.write_text(f"{self.pgid}\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BuildError(
                    f"the registry exited ({process.returncode}): {last_line(self.log_file)} [log: {self.log_file}]"
                )
            try:
                with _DIRECT.open(f"http://{self.host}/v2/", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet
            time.sleep(0.1)
        raise BuildError(f"the registry did not answer on {self.host} within 30 s [log: {self.log_file}]")

    def stop(self, log: LOG) -> None:
        if self.pgid is not None:
            stop_group(self.pgid, "the registry", log)
            self.pgid = None
            self.pgid_file.unlink(missing_ok=True)

    def manifest_digest(self, repository: str, tag: str) -> str:
        """The digest of the manifest `repository:tag` names (what a pull by digest asks for)."""
        request = urllib.request.Request(
            f"http://{self.host}/v2/{repository}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        try:
            with _DIRECT.open(request, timeout=10) as answer:
                digest = str(answer.headers.get("Docker-Content-Digest", ""))
        except urllib.error.HTTPError as error:
            raise BuildError(f"the registry has no {repository}:{tag} (HTTP {error.code})") from error
        if not digest.startswith("sha256:"):
            raise BuildError(f"the registry named no digest for {repository}:{tag}: {digest!r}")
        return digest

    def collect_garbage(self) -> None:
        """Remove the manifests no tag names and the blobs only they used (the registry stopped: the
        collector must not run beside a push)."""
        if self.pgid is not None:
            raise BuildError("the registry's garbage collection needs the registry stopped")
        self._write_config()
        cmd = [BINARY, "garbage-collect", "--delete-untagged", str(self.config_file)]
        gc_log = self.log_file.with_name("registry-gc.log")
        gc_log.unlink(missing_ok=True)  # a line per blob it marks: the last collection's only
        run_logged(cmd, gc_log, "the registry's garbage collection")


def serving(root: Path, log: LOG) -> AbstractContextManager[Registry]:
    """The registry of `root`, listening while the block runs."""
    return running(Registry(root), log)
