"""Build the operator and workload images with no registry but our own (`make images`).

operator/Dockerfile and workloads/Dockerfile are built exactly as a user with internet builds them,
except for their base image: a build arg points it at a stand-in made here from Debian's packages
(mmdebstrap bookworm minbase, Python 3.11) that keeps the upstream base's contract (README, "Images
without an outside registry"; images/standin/*.Dockerfile). Each product is pushed to a registry on
127.0.0.1 that serves a folder of the cache OUTSIDE the clone (images/registry.py), and recorded by
a hash of everything that goes into it:

    ${RAYSHIP_CACHE:-~/.cache/rayship}/images/registry/             the registry's storage
    ${RAYSHIP_CACHE:-~/.cache/rayship}/images/<image>-<tag>-<hash>.json   its digest, layers, timings

from which the real node's containerd pulls it (`ctr images pull`; refs docker.io/rayship/<image>:<tag>).
A second run with nothing changed checks the hashes and builds nothing; a change to the Python
sources rebuilds only the last layer of each Dockerfile (Docker's layer cache stays in the cache's
data root), as does one to README.md, and the push and the node's pull move only that layer; one to
pyproject.toml reinstalls the dependencies (the Dockerfiles read them from it).

Why Docker: Debian packages dockerd 20.10 (docker.io) with BuildKit built in and the docker CLI
20.10 that drives it without buildx; buildkitd and nerdctl are not packaged in bookworm (they would
be compiled from Go sources on this 2-core machine). dockerd runs only while images are built
(images/dockerd.py). Why a registry: docker 20.10 exports only whole images (`docker save` wrote the
6.8 GB workload image after every build, most of a rebuild's time); a push and a pull move only what
the other side lacks.

pip in the builds installs from a wheelhouse in the cache (`pip download` on the host, once per set
of pins), served on 127.0.0.1 and passed as PIP_FIND_LINKS with PIP_NO_INDEX=1: the ~3 GB of torch
and CUDA wheels are downloaded once per machine, and no build talks TLS to the package index (so no
CA bundle goes into a build).

    python3 images/build.py              # build what is missing, print sizes and timings
    python3 images/build.py --print      # ref, digest or "missing" (builds nothing)
    python3 images/build.py --save DIR   # each image as a `docker save` archive in DIR (kind load)
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
import shutil
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script: python3 images/build.py ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from images import registry as image_registry
from images.dockerd import DOCKER, Docker, docker_daemon
from images.processes import LOG, BuildError, run_logged, start_logged, wait_logged

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STANDIN_DIR = HERE / "standin"

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
# Where the RayService tells Serve its HAProxy is (rayship.api.names.SERVE_HAPROXY_LAUNCHER; this script
# runs on the host's python3, without the project's dependencies; tests/unit/test_images.py holds the two
# equal).
SERVE_HAPROXY_LAUNCHER = "/home/ray/anaconda3/bin/rayship-haproxy"
# Fixed, so that the wheelhouse URL (a build arg, part of each pip layer's cache key) is the same
# from one build to the next; another port is used if this one is taken (those layers then rebuild).
WHEELHOUSE_PORT = 29181


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
    return str(pins[0])


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
    def repository(self) -> str:
        return f"rayship/{self.name}"

    @property
    def local_ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def ref(self) -> str:
        """What the node's containerd names the image (Docker's short names live under docker.io)."""
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

    def record_file(self) -> Path:
        """What the build of these inputs recorded once pushed: its digest, layers and timings."""
        return cache_root() / f"{self.name}-{self.tag}-{self.key()}.json"

    def built(self) -> bool:
        return self.record_file().is_file()

    def record(self) -> dict:
        found: dict = json.loads(self.record_file().read_text())
        return found


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
                (
                    "has the HAProxy launcher where the RayService names it, and it finds HAProxy",
                    None,
                    [SERVE_HAPROXY_LAUNCHER, "-v"],
                    r"HAProxy version 2\.",
                ),
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


def _require_tools() -> None:
    needed = {
        "unshare": "util-linux",
        "mmdebstrap": "mmdebstrap",
        "dockerd": "docker.io",
        "containerd": "containerd",
        DOCKER: "docker.io",
        image_registry.BINARY: "docker-registry",
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
        run_logged(cmd, log_file, f"pip download {' '.join(step)}", env)
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
    run_logged(cmd, cache_root() / "logs" / "mmdebstrap.log", "mmdebstrap")
    partial.rename(final)
    _marker(final).write_text(debian_key() + "\n")
    log(f"images: Debian root filesystem in {time.monotonic() - started:.0f}s -> {final}")
    return final


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


def layers(docker: Docker, image: Image) -> list[tuple[int, str]]:
    """(bytes, the instruction that made it) of each step of the image, oldest first: its layers as
    Docker keeps them, uncompressed (a step that adds no layer has 0 bytes)."""
    fmt = "{{.Size}}\t{{.CreatedBy}}"
    found = docker.docker("history", "--no-trunc", "--human=false", "--format", fmt, image.local_ref)
    if found.returncode != 0:
        raise BuildError(f"docker history of {image.ref} failed: {found.stderr.strip()}")
    rows = [line.split("\t", 1) for line in found.stdout.splitlines() if line.strip()]
    return [(int(size), made) for size, made in reversed(rows)]


def registry_ref(host: str, ref: str, digest: str) -> str:
    """The name that pulls the build `digest` of `ref` from the registry at `host`."""
    repository = {image.ref: image.repository for image in images()}[ref]
    return f"{host}/{repository}@{digest}"


def build_image(
    docker: Docker, registry: image_registry.Registry, image: Image, wheelhouse_url: str, log: LOG
) -> dict:
    """Build, check and push one image; returns what its record holds."""
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
    for old in cache_root().glob(f"{image.name}-{image.tag}-*.json"):
        old.unlink()  # the record of earlier sources: the image's tag in the registry is about to move
    remote = f"{registry.host}/{image.local_ref}"
    docker.docker_logged(["tag", image.local_ref, remote], log_file, f"docker tag of {image.ref}")
    # The checks run while docker pushes the layers the registry lacks (every layer on a fresh machine,
    # the last one after a source change). An image that fails one gets no record.
    pushing = start_logged([DOCKER, "push", remote], log_file, docker.env)
    try:
        check_image(docker, image)
    except BuildError:
        pushing.kill()
        pushing.wait()
        raise
    checked = time.monotonic()
    wait_logged(pushing, log_file, f"docker push of {image.ref} to {registry.host}")
    pushed = time.monotonic()
    docker.docker_logged(["image", "rm", remote], log_file, f"docker untag of {remote}")
    found = layers(docker, image)
    record = {
        "ref": image.ref,
        "key": image.key(),
        "digest": registry.manifest_digest(image.repository, image.tag),
        "size_mb": round(sum(size for size, _ in found) / 1e6),
        "build_s": round(built - started, 1),
        "check_s": round(checked - built, 1),
        "push_s": round(pushed - built, 1),  # beside the checks
        "total_s": round(pushed - started, 1),
        "layers": found,
    }
    image.record_file().write_text(json.dumps(record, indent=1) + "\n")
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


def _describe(image: Image, record: dict) -> str:
    return (
        f"{image.ref}: {record['size_mb']} MB, built in {record['total_s']:.0f}s "
        f"(build {record['build_s']:.0f}s, then checks {record['check_s']:.0f}s beside the push "
        f"{record['push_s']:.0f}s) -> {record['digest']}"
    )


@contextmanager
def _build_lock(log: LOG) -> Iterator[None]:
    """One user of the cache at a time per machine (one data root, one dockerd, one registry): a
    second caller waits."""
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
    for old in cache_root().glob("rayship-*.tar*"):
        old.unlink()  # a `docker save` archive of the builds before the registry (6.8 GB) and its marker
    folder = ensure_wheelhouse(log)
    ensure_debian_rootfs(log)
    with (
        docker_daemon(cache_root(), log) as docker,
        serve_wheelhouse(folder, log) as url,
        image_registry.serving(cache_root(), log) as registry,
    ):
        _prune(docker)
        ensure_standins(docker, todo, url, log)
        for image in todo:
            log(f"images: built {_describe(image, build_image(docker, registry, image, url, log))}")
        _prune(docker)
    started = time.monotonic()
    registry.collect_garbage()  # the builds the tags no longer name
    log(f"images: the registry's unnamed builds removed in {time.monotonic() - started:.1f}s")


def ensure_built(log: LOG = print) -> dict[str, str]:
    """Build, check and push whatever image is missing; returns each image's ref -> its digest in
    the registry."""
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
            log(f"images: cached {_describe(image, image.record())}")
    log(f"images: {'built' if todo else 'checked'} in {time.monotonic() - started:.1f}s")
    return {image.ref: image.record()["digest"] for image in images()}


@contextmanager
def registry_served(log: LOG) -> Iterator[str]:
    """The registry the images are pushed to, listening on 127.0.0.1 while the block runs (builds
    wait meanwhile); yields its host for `registry_ref`."""
    _require_tools()
    with _build_lock(log), image_registry.serving(cache_root(), log) as registry:
        yield registry.host


def save_archives(folder: Path, log: LOG = print) -> list[Path]:
    """Each image as a `docker save` archive in folder (what `kind load image-archive` reads)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuildError(
            f"--save {folder}: {error.strerror}: name a folder to write the archives in"
        ) from error
    digests = ensure_built(log)
    saved = []
    with (
        _build_lock(log),
        docker_daemon(cache_root(), log) as docker,
        image_registry.serving(cache_root(), log) as registry,
    ):
        log_file = docker.logs / "save.log"
        for image in images():
            remote = registry_ref(registry.host, image.ref, digests[image.ref])
            docker.docker_logged(["pull", remote], log_file, f"docker pull of {remote}")
            docker.docker_logged(["tag", remote, image.local_ref], log_file, f"docker tag of {remote}")
            archive = folder / f"{image.name}-{image.tag}.tar"
            docker.docker_logged(
                ["save", "-o", str(archive), image.local_ref], log_file, f"docker save of {image.ref}"
            )
            log(f"images: saved {image.ref} -> {archive}")
            saved.append(archive)
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--print", action="store_true", help="print ref, digest or missing; build nothing")
    what.add_argument("--save", metavar="DIR", type=Path, help="also save each image as an archive in DIR")
    args = parser.parse_args(argv)
    try:
        if args.print:
            for image in images():
                print(f"{image.ref}\t{image.record()['digest'] if image.built() else 'missing'}")
            return 0
        if args.save:
            save_archives(args.save)
        else:
            ensure_built()
    except BuildError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
