"""Build the operator and workload images with no container registry (`make images`).

operator/Dockerfile and workloads/Dockerfile are built exactly as a user with internet builds them,
except for their base image: a build arg points it at a stand-in made here from Debian's packages
(mmdebstrap bookworm minbase, Python 3.11) that keeps the upstream base's contract (README, "Images
without a registry"; images/standin/*.Dockerfile). Each product is a `docker save` archive in a cache
OUTSIDE the clone, named by a hash of everything that goes into it:

    ${RAYSHIP_CACHE:-~/.cache/rayship}/images/<image>-<tag>-<hash>.tar   (+ <archive>.complete)

which `ctr -n k8s.io images import` reads (refs docker.io/rayship/<image>:<tag>). A second run with
nothing changed checks the hashes and builds nothing; a change to the Python sources rebuilds only
the last layer of each Dockerfile (Docker's layer cache stays in the cache's data root), as does one
to README.md; one to pyproject.toml reinstalls the dependencies (the Dockerfiles read them from it).

Why Docker: Debian packages dockerd 20.10 (docker.io) with BuildKit built in and the docker CLI
20.10 that drives it without buildx; buildkitd and nerdctl are not packaged in bookworm (they would
be compiled from Go sources on this 2-core machine), and `docker save` writes the Docker archive
format that `ctr images import` reads. dockerd runs only while images are built, in a private mount
namespace (its mounts never reach the host), with everything under the cache, no bridge, no
iptables rules and no IP forwarding; builds use the host's network.

pip in the builds installs from a wheelhouse in the cache (`pip download` on the host, once per set
of pins), served on 127.0.0.1 and passed as PIP_FIND_LINKS with PIP_NO_INDEX=1: the ~3 GB of torch
and CUDA wheels are downloaded once per machine, and no build talks TLS to the package index (so no
CA bundle goes into a build).

    python3 images/build.py            # build what is missing, print sizes and timings
    python3 images/build.py --print    # ref, archive path, built|missing (builds nothing)
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import functools
import hashlib
import http.server
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STANDIN_DIR = HERE / "standin"

# Docker's own CLI from the docker.io package: it drives dockerd 20.10's built-in BuildKit (the
# builder users' Docker runs by default) without the buildx plugin that newer CLIs need for it.
DOCKER = "/usr/bin/docker"
DEBIAN_SUITE = "bookworm"
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# The root filesystem both stand-ins start from: python3 (3.11) and its venv module, useradd and
# groupadd (passwd), and what python:slim also carries (CA certificates, /etc/services, tzdata).
DEBIAN_PACKAGES = ("python3", "python3-venv", "passwd", "ca-certificates", "netbase", "tzdata")
# As Debian's own images are made: merged /usr by debootstrap's method (usr-is-merged, not the
# usrmerge package, which brings Perl), and the "slim" variant's excluded documentation and locales
# (the exclusions stay in the image's dpkg configuration, so later apt installs follow them too).
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    *(
        f"--dpkgopt=path-exclude=/usr/share/{folder}/*"
        for folder in ("man", "info", "doc", "groff", "lintian", "linda", "locale")
    ),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
)
PIP_PIN = "pip==26.3"
# Fixed, so that the wheelhouse URL (a build arg, part of each pip layer's cache key) is the same
# from one build to the next; another port is used if this one is taken (those layers then rebuild).
WHEELHOUSE_PORT = 29181
LOG = Callable[[str], None]


class BuildError(Exception):
    """A step failed; the message is one line saying which and why."""


def _user_home() -> Path:
    """The account's home, not $HOME (tests point $HOME elsewhere), as controlplane/build.py does."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def cache_root() -> Path:
    base = os.environ.get("RAYSHIP_CACHE") or str(_user_home() / ".cache" / "rayship")
    return Path(base) / "images"


def _digest(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


# --- what goes into the images -----------------------------------------------------------------


@functools.cache
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def version() -> str:
    text = (REPO / "operator" / "rayship" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, flags=re.MULTILINE)
    if not match:
        raise BuildError("operator/rayship/__init__.py has no __version__")
    return match.group(1)


def _requirement(requirements: list[str], name: str) -> str:
    found = [r for r in requirements if re.match(rf"{re.escape(name)}(\[[^\]]*\])?==", r)]
    if len(found) != 1:
        raise BuildError(f"pyproject.toml: expected one pinned {name}==..., found {found}")
    return found[0]


def ray_version() -> str:
    return _requirement(pyproject()["project"]["optional-dependencies"]["workloads"], "ray").split("==")[1]


def operator_requirements() -> list[str]:
    """What operator/Dockerfile's first pip install reads from pyproject.toml."""
    return list(pyproject()["project"]["dependencies"])


def workloads_requirements() -> list[str]:
    """What workloads/Dockerfile's first pip installs read from pyproject.toml."""
    project = pyproject()["project"]
    return [
        *pyproject()["build-system"]["requires"],
        *project["dependencies"],
        *project["optional-dependencies"]["workloads"],
    ]


def deepspeed_requirement() -> str:
    """The DeepSpeed pin workloads/Dockerfile installs (tests/unit/test_images.py ties it to make setup)."""
    pins = re.findall(r"\bdeepspeed==[\w.]+", (REPO / "workloads" / "Dockerfile").read_text())
    if len(set(pins)) != 1:
        raise BuildError(f"workloads/Dockerfile: expected one deepspeed==... pin, found {pins}")
    return pins[0]


def wheelhouse_steps() -> list[list[str]]:
    """Each pip install the stand-ins and the Dockerfiles run, as the requirements it resolves.

    One `pip download` a step, so that each step's resolution (with what earlier steps installed)
    finds its versions in the wheelhouse, as it would on the index."""
    workloads = workloads_requirements()
    return [
        [PIP_PIN],
        [f"ray[default]=={ray_version()}"],  # the Ray stand-in
        list(pyproject()["build-system"]["requires"]),  # pip's isolated build of the project
        operator_requirements(),
        [_requirement(workloads, "torch")],
        workloads,
        # with what it is installed beside: alone, its unpinned torch would resolve to the newest
        [*workloads, deepspeed_requirement()],
    ]


# --- the stand-in base images ------------------------------------------------------------------


def debian_key() -> str:
    return _digest(DEBIAN_SUITE, *DEBIAN_SOURCES, *DEBIAN_PACKAGES, *MMDEBSTRAP_OPTIONS)


def debian_rootfs() -> Path:
    return cache_root() / "standin" / f"debian-{DEBIAN_SUITE}-{debian_key()}.tar"


def debian_image() -> str:
    return f"rayship-standin/debian:{DEBIAN_SUITE}-{debian_key()}"


@dataclass(frozen=True)
class StandIn:
    name: str  # images/standin/<name>.Dockerfile
    args: dict[str, str]  # build args besides DEBIAN_IMAGE and the wheelhouse's

    @property
    def dockerfile(self) -> Path:
        return STANDIN_DIR / f"{self.name}.Dockerfile"

    def ref(self) -> str:
        key = _digest(debian_image(), self.dockerfile.read_bytes(), json.dumps(self.args, sort_keys=True))
        return f"rayship-standin/{self.name}:{key}"


def python_standin() -> StandIn:
    return StandIn("python", {"PIP_PIN": PIP_PIN})


def ray_standin() -> StandIn:
    return StandIn("ray", {"PIP_PIN": PIP_PIN, "RAY_PIN": f"ray[default]=={ray_version()}"})


# --- the product images ------------------------------------------------------------------------

# A check runs the image with this entrypoint (None: the image's own) and arguments, and passes when
# the command exits 0 and its output matches the pattern.
Check = tuple[str, str | None, list[str], str]


@dataclass(frozen=True)
class Image:
    name: str
    tag: str
    dockerfile: Path
    base_arg: str  # the Dockerfile's ARG naming its base image
    standin: StandIn
    checks: list[Check] = field(default_factory=list)

    @property
    def local_ref(self) -> str:
        return f"rayship/{self.name}:{self.tag}"

    @property
    def ref(self) -> str:
        """What `ctr images import` names the image (Docker's short names live under docker.io)."""
        return f"docker.io/{self.local_ref}"

    def build_args(self, wheelhouse_url: str) -> dict[str, str]:
        return {
            self.base_arg: self.standin.ref(),
            "PIP_FIND_LINKS": wheelhouse_url,
            "PIP_NO_INDEX": "1",
        }

    def key(self) -> str:
        parts: list[str | bytes] = [self.ref, self.standin.ref(), self.dockerfile.read_bytes()]
        for path in _context_files(self.dockerfile):
            parts += [str(path.relative_to(REPO)), path.read_bytes()]
        parts.append(json.dumps(self.checks))
        return _digest(*parts)

    def archive(self) -> Path:
        return cache_root() / f"{self.name}-{self.tag}-{self.key()}.tar"

    def built(self) -> bool:
        return _marker(self.archive()).is_file()


def images() -> list[Image]:
    ray = re.escape(ray_version())
    return [
        Image(
            "rayship-operator",
            version(),
            REPO / "operator" / "Dockerfile",
            "PYTHON_IMAGE",
            python_standin(),
            [
                ("runs as uid 10001", "id", ["-u"], r"^10001$"),
                ("`rayship --help` exits 0", "rayship", ["--help"], r"usage: rayship"),
            ],
        ),
        Image(
            "rayship-workloads",
            f"{version()}-cpu",
            REPO / "workloads" / "Dockerfile",
            "RAY_IMAGE",
            ray_standin(),
            [
                ("runs as uid 1000", None, ["id", "-u"], r"^1000$"),
                ("its default command (the modules the operator runs) exits 0", None, [], r""),
                (
                    f"imports rayship_workloads, torch, deepspeed and ray {ray_version()} on the CPU",
                    None,
                    [
                        "python",
                        "-c",
                        "import rayship_workloads.job, rayship_workloads.serve, torch, deepspeed, ray; "
                        "print(torch.ones(2).sum().item()); print(ray.__version__)",
                    ],
                    rf"(?m)^2\.0\n{ray}$",
                ),
                (f"`ray --version` is {ray_version()}", None, ["ray", "--version"], rf"\b{ray}$"),
                ("has bash (KubeRay's probes)", None, ["bash", "-c", "echo ok"], r"^ok$"),
                ("has wget (KubeRay's probes)", None, ["wget", "--version"], r"GNU Wget"),
            ],
        ),
    ]


def _marker(archive: Path) -> Path:
    return archive.with_name(archive.name + ".complete")


def _ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        anywhere = pattern.removeprefix("**/")
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatchcase(p, anywhere) for p in parts):
            return True
    return False


def _context_files(dockerfile: Path) -> list[Path]:
    """Every file the Dockerfile's COPY instructions send from the build context (the repo root),
    less what .dockerignore leaves out."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    sources = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() == "COPY":
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    patterns = _ignore_patterns()
    files = []
    for source in sources:
        path = REPO / source
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        files += [p for p in candidates if not _ignored(str(p.relative_to(REPO)), patterns)]
    return files


# --- running things ----------------------------------------------------------------------------


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _start_logged(
    cmd: list[str], log_file: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start cmd with its output appended to log_file."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def _wait_logged(process: subprocess.Popen[bytes], log_file: Path, what: str) -> None:
    """Wait for a command `_start_logged` started; a failure names the step and its last line."""
    code = process.wait()
    if code != 0:
        raise BuildError(f"{what} failed (exit {code}): {_last_line(log_file)} [log: {log_file}]")


def _run_logged(cmd: list[str], log_file: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run cmd with its output appended to log_file; a failure names the step and its last line."""
    _wait_logged(_start_logged(cmd, log_file, env), log_file, what)


def _require_tools() -> None:
    needed = {
        "unshare": "util-linux",
        "mmdebstrap": "mmdebstrap",
        "dockerd": "docker.io",
        "containerd": "containerd",
        DOCKER: "docker.io",
    }
    missing = sorted({pkg for tool, pkg in needed.items() if not shutil.which(tool)})
    if missing:
        raise BuildError(f"not installed: {', '.join(missing)} (`make images` installs them)")
    if os.geteuid() != 0:
        raise BuildError("building the images needs root (dockerd, mmdebstrap)")


# --- the wheelhouse ----------------------------------------------------------------------------


def wheelhouse() -> Path:
    return cache_root() / "wheelhouse"


def ensure_wheelhouse(log: LOG) -> Path:
    """Download every wheel (and sdist) the builds install, once per set of pins.

    One folder for every set: a changed pin downloads only what is new (pip skips a file it finds
    in the folder). The host's Python must be the images' (3.11) for pip to pick their wheels."""
    steps = wheelhouse_steps()
    marker = wheelhouse() / f".complete-{_digest(json.dumps(steps))}"
    if marker.is_file():
        return wheelhouse()
    if sys.version_info[:2] != (3, 11):
        raise BuildError(
            f"the wheelhouse is filled by Python 3.11 (the images'), not {sys.version.split()[0]}"
        )
    started = time.monotonic()
    log(f"images: downloading the wheels the builds install into {wheelhouse()} ...")
    # pip's own settings from the environment (its CA bundle) are kept, a machine's find-links not:
    # what the wheelhouse holds comes from the index.
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX")}
    wheelhouse().mkdir(parents=True, exist_ok=True)
    requirements = wheelhouse() / ".requirements.txt"
    log_file = cache_root() / "logs" / "wheelhouse.log"
    log_file.unlink(missing_ok=True)
    for step in steps:
        requirements.write_text("\n".join(step) + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-cache-dir"]
        cmd += ["--dest", str(wheelhouse()), "-r", str(requirements)]
        _run_logged(cmd, log_file, f"pip download {' '.join(step)}", env)
    _drop_unused_files(log_file)
    for old in wheelhouse().glob(".complete-*"):
        old.unlink()
    marker.write_text(json.dumps(steps) + "\n")
    log(f"images: wheelhouse ready in {time.monotonic() - started:.0f}s")
    return wheelhouse()


def _drop_unused_files(pip_log: Path) -> None:
    """Remove what no step of the current pins uses (pip says "Saved <file>" or "File was already
    downloaded <file>" for each one it uses): a changed pin does not leave its old wheels behind."""
    used = set(
        re.findall(r"^(?:Saved|\s*File was already downloaded) (\S+)$", pip_log.read_text(), re.MULTILINE)
    )
    used_names = {Path(path).name for path in used}
    for path in wheelhouse().iterdir():
        if path.is_file() and not path.name.startswith(".") and path.name not in used_names:
            path.unlink()


@contextmanager
def serve_wheelhouse(folder: Path, log: LOG) -> Iterator[str]:
    """Serve folder's listing on 127.0.0.1 (pip reads it as a find-links page); yields its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per wheel fetched: the build logs say what pip installed

    handler = functools.partial(Quiet, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELHOUSE_PORT), handler)
    except OSError as error:
        log(f"images: port {WHEELHOUSE_PORT} is taken ({error.strerror}): pip layers will rebuild")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# --- the Debian root filesystem ----------------------------------------------------------------


def ensure_debian_rootfs(log: LOG) -> Path:
    """mmdebstrap's bookworm minbase with DEBIAN_PACKAGES, as a tar (once per package list)."""
    final = debian_rootfs()
    if _marker(final).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.stem + ".partial.tar")
    partial.unlink(missing_ok=True)
    started = time.monotonic()
    log(f"images: mmdebstrap {DEBIAN_SUITE} minbase + {' '.join(DEBIAN_PACKAGES)} ...")
    # In its own mount namespace: the /proc, /sys and /dev that mmdebstrap mounts into its chroot
    # go away with the namespace, whatever happens to mmdebstrap.
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "mmdebstrap", *MMDEBSTRAP_OPTIONS]
    cmd += ["--mode=root", "--format=tar", f"--include={','.join(DEBIAN_PACKAGES)}"]
    cmd += [DEBIAN_SUITE, str(partial), *DEBIAN_SOURCES]
    _run_logged(cmd, cache_root() / "logs" / "mmdebstrap.log", "mmdebstrap")
    partial.rename(final)
    _marker(final).write_text(debian_key() + "\n")
    log(f"images: Debian root filesystem in {time.monotonic() - started:.0f}s -> {final}")
    return final


# --- dockerd for the build only ----------------------------------------------------------------


class Docker:
    """A private dockerd (with its own containerd) whose state lives under the cache."""

    def __init__(self, root: Path) -> None:
        self.root = root / "docker"  # data: layers, BuildKit's cache, containerd's content
        self.run_dir = root / "run"  # sockets and runtime state (short: unix socket paths)
        self.logs = root / "logs"
        self.socket = self.run_dir / "docker.sock"
        self.cgroup = "rayship-images"
        self.process: subprocess.Popen[bytes] | None = None
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
        daemon_json.write_text(json.dumps({"deprecated-key-path": str(self.root / "key.json")}) + "\n")
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
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]
        q = shlex.quote
        return (
            "set -e\n"
            "mount -t tmpfs -o mode=0755,size=64m rayship-images /run\n"
            f"containerd --config {q(str(self._containerd_config()))} >> {q(str(self.logs / 'containerd.log'))} 2>&1 &\n"
            f"for i in $(seq 300); do [ -S {q(str(containerd_sock))} ] && break; sleep 0.1; done\n"
            f"exec {shlex.join(dockerd)} >> {q(str(self.logs / 'dockerd.log'))} 2>&1\n"
        )

    def start(self, log: LOG) -> None:
        if len(str(self.run_dir)) > 60:  # unix socket paths under it must fit in 108 bytes
            raise BuildError(f"{self.run_dir}: too long a path for unix sockets; set a shorter RAYSHIP_CACHE")
        for folder in (self.root, self.run_dir, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        # nice: the builds share the 2 cores with whatever else runs here (as the Go builds do)
        cmd = ["nice", "-n", "10", "unshare", "--mount", "--propagation", "private", "--"]
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
        return f"{_last_line(self.logs / 'dockerd.log')} [log: {self.logs / 'dockerd.log'}]"

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DOCKER, *args], env=self.env, capture_output=True, text=True)

    def docker_logged(self, args: list[str], log_file: Path, what: str) -> None:
        _run_logged([DOCKER, *args], log_file, what, self.env)

    def docker_started(self, args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
        return _start_logged([DOCKER, *args], log_file, self.env)

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
        _stop_group(pgid, log)
        for pid in _processes_mentioning(str(self.run_dir)):  # e.g. a container's shim
            log(f"images: stopping leftover process {pid}")
            os.kill(pid, signal.SIGKILL)
        self.process = None
        mounted = [
            line for line in Path("/proc/mounts").read_text().splitlines() if str(cache_root()) in line
        ]
        if mounted:
            raise BuildError(f"still mounted after dockerd stopped: {mounted[0]}")
        _remove_cgroups(self.cgroup, log)


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended while the list was read
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _stop_group(pgid: int, log: LOG) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if not _group_members(pgid):
            break
        os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if _group_members(pgid):
        raise BuildError(f"processes of dockerd's group {pgid} survived SIGKILL: {_group_members(pgid)}")
    log(f"images: dockerd and containerd stopped (process group {pgid})")


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # the process ended while the list was read
            continue
    return [pid for pid in found if pid != os.getpid()]


def _remove_cgroups(name: str, log: LOG) -> None:
    """The cgroup folders dockerd and runc created under each controller (empty once they stop)."""
    for top in Path("/sys/fs/cgroup").glob(f"*/{name}"):
        folders = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for folder in [*folders, top]:
            try:
                folder.rmdir()
            except OSError as error:  # still has a process: said, and left for the next run
                log(f"images: cgroup {folder} left behind: {error.strerror}")


@contextmanager
def docker_daemon(log: LOG) -> Iterator[Docker]:
    docker = Docker(cache_root())
    try:
        docker.start(log)
        yield docker
    finally:
        docker.stop(log)


# --- building ----------------------------------------------------------------------------------


def ensure_standins(docker: Docker, todo: list[Image], wheelhouse_url: str, log: LOG) -> None:
    if not docker.has_image(debian_image()):
        change = ["--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        change += ["--change", 'CMD ["bash"]']
        docker.docker_logged(
            ["import", *change, str(debian_rootfs()), debian_image()],
            docker.logs / "standin.log",
            "docker import of the Debian root filesystem",
        )
    for standin in {image.standin.ref(): image.standin for image in todo}.values():
        if docker.has_image(standin.ref()):
            continue
        started = time.monotonic()
        log(f"images: building the {standin.name} stand-in {standin.ref()} ...")
        args = {"DEBIAN_IMAGE": debian_image(), "PIP_FIND_LINKS": wheelhouse_url, "PIP_NO_INDEX": "1"}
        cmd = ["build", "--network", "host", "--progress", "plain", "-f", str(standin.dockerfile)]
        for name, value in {**args, **standin.args}.items():
            cmd += ["--build-arg", f"{name}={value}"]
        cmd += ["-t", standin.ref(), str(STANDIN_DIR)]
        docker.docker_logged(cmd, docker.logs / f"standin-{standin.name}.log", f"the {standin.name} stand-in")
        log(f"images: {standin.name} stand-in built in {time.monotonic() - started:.0f}s")


def check_image(docker: Docker, image: Image) -> None:
    """Run each of the image's checks; the first that fails stops the build, saying which."""
    for what, entrypoint, args, pattern in image.checks:
        cmd = ["run", "--rm", "--network", "none"]
        cmd += ["--entrypoint", entrypoint] if entrypoint else []
        result = docker.docker(*cmd, image.local_ref, *args)
        output = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            last = output.splitlines()[-1] if output else "(no output)"
            raise BuildError(f"{image.ref}: check failed: {what}: exit {result.returncode}: {last}")
        if not re.search(pattern, result.stdout.strip()):
            raise BuildError(f"{image.ref}: check failed: {what}: output {result.stdout.strip()[-200:]!r}")


def _archive_refs(archive: Path) -> list[str]:
    """The image names `ctr images import` will give the archive's images (its manifest.json)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise BuildError(f"{archive}: no manifest.json")
        manifest = json.load(member)
    return [f"docker.io/{tag}" for entry in manifest for tag in entry.get("RepoTags") or []]


def build_image(docker: Docker, image: Image, wheelhouse_url: str, log: LOG) -> dict[str, float]:
    """Build, check and save one image; returns what its .complete marker records."""
    log_file = docker.logs / f"{image.name}.log"
    log_file.unlink(missing_ok=True)
    log(f"images: building {image.ref} ({image.dockerfile.relative_to(REPO)}) [log: {log_file}] ...")
    started = time.monotonic()
    cmd = ["build", "--network", "host", "--progress", "plain", "-f", str(image.dockerfile)]
    for name, value in image.build_args(wheelhouse_url).items():
        cmd += ["--build-arg", f"{name}={value}"]
    cmd += ["-t", image.local_ref, str(REPO)]
    docker.docker_logged(cmd, log_file, f"docker build of {image.ref}")
    built = time.monotonic()
    archive = image.archive()
    for old in archive.parent.glob(f"{image.name}-{image.tag}-*.tar*"):
        old.unlink()  # the archives of earlier sources (and a save cut short): only one is kept
    partial = archive.with_name(archive.name + ".partial")
    # The checks run while Docker writes the archive (the workload image's ~7 GB: most of a rebuild
    # after a source change); an image that fails one is not kept.
    saving = docker.docker_started(["save", "-o", str(partial), image.local_ref], log_file)
    try:
        check_image(docker, image)
    except BuildError:
        saving.kill()
        saving.wait()
        partial.unlink(missing_ok=True)
        raise
    checked = time.monotonic()
    _wait_logged(saving, log_file, f"docker save of {image.ref}")
    if _archive_refs(partial) != [image.ref]:
        raise BuildError(f"{partial}: names {_archive_refs(partial)}, not {image.ref}")
    partial.rename(archive)
    size = int(docker.docker("image", "inspect", "--format", "{{.Size}}", image.local_ref).stdout.strip())
    record = {
        "size_mb": round(size / 1e6),
        "build_s": round(built - started, 1),
        "check_s": round(checked - built, 1),
        "save_s": round(time.monotonic() - built, 1),  # beside the checks
        "total_s": round(time.monotonic() - started, 1),
    }
    _marker(archive).write_text(json.dumps({"ref": image.ref, "key": image.key(), **record}) + "\n")
    return record


def _prune(docker: Docker) -> None:
    """Drop what earlier sources left (stand-ins of other pins, untagged images, old build cache) but
    keep the current layers: the next source change rebuilds only the last one. Run before a build
    too: a build cut short (a full disk) leaves the old versions for the next one to clear. The build
    cache keeps 12 GB: the current stand-ins' and dependency layers (the workload image's are ~6 GB),
    not the versions before them."""
    current = {debian_image(), python_standin().ref(), ray_standin().ref()}
    listed = docker.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "rayship-standin/*")
    stale = sorted(set(listed.stdout.split()) - current)
    if stale:
        docker.docker_logged(["rmi", *stale], docker.logs / "prune.log", "docker rmi of old stand-ins")
    docker.docker_logged(["image", "prune", "--force"], docker.logs / "prune.log", "docker image prune")
    docker.docker_logged(
        ["builder", "prune", "--force", "--keep-storage", "12gb"],
        docker.logs / "prune.log",
        "docker builder prune",
    )


# --- the API -----------------------------------------------------------------------------------


def archives() -> dict[str, Path]:
    """Image ref (as `ctr images import` names it) -> its archive in the cache, built or not."""
    return {image.ref: image.archive() for image in images()}


def _describe(image: Image, record: dict) -> str:
    return (
        f"{image.ref}: {record['size_mb']} MB, built in {record['total_s']:.0f}s "
        f"(build {record['build_s']:.0f}s, then checks {record['check_s']:.0f}s beside save {record['save_s']:.0f}s)"
        f" -> {image.archive()}"
    )


@contextmanager
def _build_lock(log: LOG) -> Iterator[None]:
    """One build at a time per machine (one data root, one dockerd): a second caller waits."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("images: another build of the images is running: waiting for it ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _missing() -> list[Image]:
    return [image for image in images() if not image.built()]


def _build(todo: list[Image], log: LOG) -> None:
    folder = ensure_wheelhouse(log)
    ensure_debian_rootfs(log)
    with docker_daemon(log) as docker, serve_wheelhouse(folder, log) as url:
        _prune(docker)
        ensure_standins(docker, todo, url, log)
        for image in todo:
            log(f"images: built {_describe(image, build_image(docker, image, url, log))}")
        _prune(docker)


def ensure_built(log: LOG = print) -> dict[str, Path]:
    """Build, check and save whatever image is missing from the cache; returns archives()."""
    started = time.monotonic()
    todo = _missing()
    if todo:
        _require_tools()
        with _build_lock(log):
            todo = _missing()  # less what a build that held the lock finished
            if todo:
                _build(todo, log)
    for image in images():
        if image not in todo:
            record = json.loads(_marker(image.archive()).read_text())
            log(f"images: cached {_describe(image, record)}")
    log(f"images: {'built' if todo else 'checked'} in {time.monotonic() - started:.1f}s")
    return archives()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--print", action="store_true", help="print ref, archive, built|missing; build nothing"
    )
    args = parser.parse_args(argv)
    try:
        if args.print:
            for image in images():
                print(f"{image.ref}\t{image.archive()}\t{'built' if image.built() else 'missing'}")
            return 0
        ensure_built()
    except BuildError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
