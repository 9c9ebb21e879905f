"""The two Dockerfiles against the code that relies on them (no Docker needed: the files are parsed).

operator/Dockerfile must run `rayship operator` as a numeric non-root user with kopf's liveness port
exposed; workloads/Dockerfile must be the Ray image the renderer's default rayVersion names, run as
the UID the renderer puts in `runAsUser`, and contain the modules the rendered objects run. Every
expected value comes from the code, pyproject.toml or the Makefile, never from this file.

`test_check_catches_a_broken_dockerfile` runs each check on an edited copy of a Dockerfile, so a
check that could never fail (a parser that finds nothing, say) fails the suite.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from images import build as image_build
from rayship import __version__, cli
from rayship.config import OperatorConfig
from rayship.controller import modelservice, trainingjob

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = REPO / "operator" / "Dockerfile"
WORKLOADS_DOCKERFILE = REPO / "workloads" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
MAKEFILE = (REPO / "Makefile").read_text()
RAY_REPOSITORY = "rayproject/ray"


@pytest.fixture(autouse=True)
def _built_in_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The images must match the operator's built-in defaults, whatever RAYSHIP_* says here."""
    for name in [n for n in os.environ if n.upper().startswith("RAYSHIP_")]:
        monkeypatch.delenv(name)


# --- a tiny Dockerfile parser ------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    value: str  # the rest of the instruction, continuations joined
    line: int  # 1-based line where it starts

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON-array form (`["a", "b"]`) as a list, None for the shell form."""
        if not self.value.startswith("["):
            return None
        parsed = json.loads(self.value)
        assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), self
        return parsed


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: list[Instruction]
    comments: str

    @classmethod
    def load(cls, path: Path) -> Dockerfile:
        instructions: list[Instruction] = []
        comments: list[str] = []
        parts: list[str] = []
        start = 0
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            stripped = raw.strip()
            if stripped.startswith("#"):  # comment lines are dropped, even inside a continuation
                comments.append(stripped[1:].strip())
                continue
            if not stripped:  # blank lines, even inside a continuation, are ignored
                continue
            if not parts:
                start = number
            continued = stripped.endswith("\\")
            parts.append(stripped[:-1].strip() if continued else stripped)
            if not continued:
                keyword, _, value = " ".join(p for p in parts if p).partition(" ")
                instructions.append(Instruction(keyword.upper(), value.strip(), start))
                parts = []
        assert not parts, f"{path}: unterminated line continuation"
        return cls(path, instructions, "\n".join(comments))

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"{self.path}: no {keyword} instruction"
        return found[-1]

    def global_args(self) -> dict[str, str]:
        """ARG defaults declared before the first FROM (the ones FROM can use)."""
        args: dict[str, str] = {}
        for instruction in self.instructions:
            if instruction.keyword == "FROM":
                break
            if instruction.keyword == "ARG":
                name, _, default = instruction.value.partition("=")
                args[name.strip()] = default.strip().strip('"')
        return args

    def base_images(self) -> list[str]:
        """Each FROM's image with global ARG defaults substituted (stage names dropped)."""
        args = self.global_args()

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            assert name in args, f"{self.path}: FROM uses ${name}, which has no ARG default"
            return args[name]

        images = []
        for instruction in self.all("FROM"):
            words = [w for w in instruction.value.split() if not w.startswith("--platform")]
            images.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, words[0]))
        return images

    def user(self) -> str:
        """The user the image runs as: the last USER (without a group)."""
        return self.last("USER").value.split(":")[0]

    def run_commands(self) -> list[str]:
        return [i.value for i in self.all("RUN")]

    def copied_sources(self) -> set[str]:
        """Source paths of every COPY (flags such as --chown dropped), normalised: `operator/` -> `operator`."""
        sources: set[str] = set()
        for instruction in self.all("COPY"):
            words = instruction.exec_form or shlex.split(instruction.value)
            words = [w for w in words if not w.startswith("--")]
            sources.update(w.rstrip("/") for w in words[:-1])
        return sources


# --- what the code and build files say -----------------------------------------------------------


def python_minor() -> str:
    """`3.11` from requires-python `>=3.11,<3.12`."""
    match = re.search(r">=\s*(\d+\.\d+)", PYPROJECT["project"]["requires-python"])
    assert match, PYPROJECT["project"]["requires-python"]
    return match.group(1)


def console_script(target: str) -> str:
    names = [name for name, entry in PYPROJECT["project"]["scripts"].items() if entry == target]
    assert len(names) == 1, PYPROJECT["project"]["scripts"]
    return names[0]


def pyproject_pins() -> dict[str, str]:
    """Package name -> pinned version for every `name[extras]==version` in pyproject.toml."""
    project = PYPROJECT["project"]
    requirements = [*project["dependencies"], *PYPROJECT["build-system"]["requires"]]
    for extra in project["optional-dependencies"].values():
        requirements.extend(extra)
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", requirement)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(.+?)\s*$", MAKEFILE, flags=re.MULTILINE)
    assert match, f"Makefile: no {name} := ..."
    return match.group(1)


def makefile_deepspeed_env() -> set[str]:
    """The DS_BUILD_*=... settings `make setup` installs DeepSpeed with."""
    settings = set(re.findall(r"\bDS_BUILD_\w+=\S+", MAKEFILE))
    assert settings, "Makefile: DeepSpeed is installed without DS_BUILD_* settings"
    return settings


def cli_liveness_default() -> str:
    return cli.build_parser().parse_args(["operator"]).liveness


def workload_modules() -> list[str]:
    """The modules the rendered objects run: the RayJob entrypoint and the Serve import path."""
    return [trainingjob.JOB_MODULE, modelservice.IMPORT_PATH.partition(":")[0]]


def liveness_url(df: Dockerfile) -> str:
    args = operator_argv(df)
    assert "--liveness" in args, f"{df.path}: the operator runs without --liveness: {args}"
    return args[args.index("--liveness") + 1]


def operator_argv(df: Dockerfile) -> list[str]:
    entrypoint = df.last("ENTRYPOINT").exec_form
    cmd = df.last("CMD").exec_form
    assert entrypoint is not None and cmd is not None, f"{df.path}: ENTRYPOINT and CMD must be JSON arrays"
    return entrypoint + cmd


def exposed_ports(df: Dockerfile) -> set[int]:
    return {int(p.split("/")[0]) for i in df.all("EXPOSE") for p in i.value.split()}


def deepspeed_run(df: Dockerfile) -> tuple[int, str]:
    runs = [(n, r) for n, r in enumerate(df.run_commands()) if re.search(r"\bdeepspeed==", r)]
    assert len(runs) == 1, f"{df.path}: expected one RUN installing deepspeed==..., found {len(runs)}"
    return runs[0]


# --- operator image ------------------------------------------------------------------------------


def check_operator_entrypoint(df: Dockerfile) -> None:
    """ENTRYPOINT + CMD is `<console script of rayship.cli:command> operator ...`, valid for the CLI."""
    argv = operator_argv(df)
    assert argv[0] == console_script("rayship.cli:command"), argv
    try:
        args = cli.build_parser().parse_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"{df.path}: the CLI rejects {argv}") from None
    assert args.func is cli.cmd_operator, argv


def check_operator_liveness_port(df: Dockerfile) -> None:
    port = urlsplit(liveness_url(df)).port
    assert port == urlsplit(cli_liveness_default()).port, (port, cli_liveness_default())
    assert port in exposed_ports(df), f"{df.path}: liveness port {port} not in EXPOSE {exposed_ports(df)}"


def check_operator_user(df: Dockerfile) -> None:
    """Numeric and non-zero (the kubelet can only verify runAsNonRoot for a numeric USER), and the
    user created in the image has that UID."""
    user = df.user()
    assert user.isdigit() and int(user) != 0, f"{df.path}: USER {user!r} must be a non-zero number"
    created = {m for r in df.run_commands() for m in re.findall(r"useradd\b.*?--uid[= ](\d+)", r)}
    assert created == {user}, f"{df.path}: useradd creates UID {created}, USER is {user}"


def check_operator_base(df: Dockerfile) -> None:
    """A slim Python image of the version pyproject.toml requires, pinned to a patch release."""
    (image,) = df.base_images()
    repository, _, tag = image.partition(":")
    assert repository == "python", image
    assert re.fullmatch(rf"{re.escape(python_minor())}\.\d+-slim(-\w+)?", tag), image


def check_operator_installs_only_the_operator(df: Dockerfile) -> None:
    """The project without extras: no Ray, torch, DeepSpeed or workload sources in the controller."""
    text = "\n".join(df.run_commands())
    assert re.search(r"pip install\b[^\n]*/tmp/rayship-src\b", text), (
        f"{df.path}: the project is not installed"
    )
    assert "[" not in re.sub(r"\['\w+'\]", "", text), f"{df.path}: installs an extra"  # `['project']` is fine
    for heavy in ("ray", "torch", "deepspeed", "optional-dependencies"):
        assert not re.search(rf"(?<![\w-]){heavy}(?![\w-])", text), f"{df.path}: RUN mentions {heavy}"
    assert "workloads" not in df.copied_sources(), f"{df.path}: copies the workload sources"


def check_build_inputs_copied(df: Dockerfile, package_dirs: list[str]) -> None:
    """`pip install` of the project needs pyproject.toml, the readme it names and the package dirs."""
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], *package_dirs}
    missing = needed - df.copied_sources()
    assert not missing, f"{df.path}: not copied into the image: {sorted(missing)}"


def check_operator_build_inputs(df: Dockerfile) -> None:
    check_build_inputs_copied(df, ["operator"])


def check_version_label(df: Dockerfile) -> None:
    versions = [
        i.value for i in df.all("ARG") if i.value.startswith("VERSION=")
    ]  # LABEL ...version="${VERSION}"
    labels = " ".join(i.value for i in df.all("LABEL"))
    assert 'org.opencontainers.image.version="${VERSION}"' in labels, f"{df.path}: no OCI version label"
    assert versions == [f"VERSION={__version__}"], f"{df.path}: {versions} != rayship {__version__}"


OPERATOR_CHECKS: list[Callable[[Dockerfile], None]] = [
    check_operator_entrypoint,
    check_operator_liveness_port,
    check_operator_user,
    check_operator_base,
    check_operator_installs_only_the_operator,
    check_operator_build_inputs,
    check_version_label,
]


@pytest.mark.parametrize("check", OPERATOR_CHECKS, ids=lambda c: c.__name__)
def test_operator_image(check: Callable[[Dockerfile], None]) -> None:
    check(Dockerfile.load(OPERATOR_DOCKERFILE))


# --- workload image ------------------------------------------------------------------------------


def expected_ray_image(variant: str) -> str:
    """The Ray image for the operator's default rayVersion and the project's Python."""
    python_tag = "py" + python_minor().replace(".", "")
    return f"{RAY_REPOSITORY}:{OperatorConfig().default_ray_version}-{python_tag}{variant}"


def check_workload_base(df: Dockerfile) -> None:
    """The image's Ray is the renderer's default rayVersion (KubeRay starts that Ray version)."""
    assert df.base_images() == [expected_ray_image("-gpu")], df.base_images()
    assert df.global_args().get("RAY_IMAGE") == expected_ray_image("-gpu"), df.global_args()


def check_workload_cpu_variant_documented(df: Dockerfile) -> None:
    cpu = re.escape(f"--build-arg RAY_IMAGE={expected_ray_image('')}")
    assert re.search(rf"{cpu}(?![\w.-])", df.comments), f"{df.path}: CPU build ({cpu}) not documented"


def check_workload_tag_documented(df: Dockerfile) -> None:
    """The documented build tags the image the operator uses by default."""
    assert f"-t {OperatorConfig().default_image} " in df.comments, OperatorConfig().default_image


def check_workload_user(df: Dockerfile) -> None:
    assert df.user() == str(OperatorConfig().run_as_user), f"{df.path}: USER {df.user()}"


def check_workload_deepspeed(df: Dockerfile) -> None:
    """Same DeepSpeed pin and build settings as `make setup`, without build isolation, after torch."""
    index, run = deepspeed_run(df)
    pins = re.findall(r"\bdeepspeed==\S+", run)
    assert pins == [makefile_variable("DEEPSPEED")], f"{df.path}: {pins} != Makefile"
    assert set(re.findall(r"\bDS_BUILD_\w+=\S+", run)) == makefile_deepspeed_env(), run
    assert "--no-build-isolation" in run.split(), run
    torch_runs = [n for n, r in enumerate(df.run_commands()) if re.search(r"\btorch\b", r)]
    assert torch_runs and torch_runs[0] < index, f"{df.path}: DeepSpeed is installed before torch"


def check_workload_extra(df: Dockerfile) -> None:
    """The project is pip-installed with its `workloads` extra."""
    assert "workloads" in PYPROJECT["project"]["optional-dependencies"]
    installs = [r for r in df.run_commands() if re.search(r"pip install\b[^\n]*\[workloads\]", r)]
    assert installs, f"{df.path}: the project is not installed with [workloads]"


def check_workload_build_inputs(df: Dockerfile) -> None:
    check_build_inputs_copied(df, PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"])


def check_workload_pins_match_pyproject(df: Dockerfile) -> None:
    """A version written in the Dockerfile for a package pyproject.toml pins must be the same."""
    pins = pyproject_pins()
    for run in df.run_commands():
        for name, version in re.findall(r"(?<![\w-])([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([\w.+]+)", run):
            if name.lower() in pins:
                assert version == pins[name.lower()], (
                    f"{df.path}: {name}=={version}, pyproject: {pins[name.lower()]}"
                )


def check_workload_self_check(df: Dockerfile) -> None:
    """No ENTRYPOINT (KubeRay sets the command); the default CMD imports the modules the operator runs."""
    assert not df.all("ENTRYPOINT"), f"{df.path}: KubeRay sets its own command; drop ENTRYPOINT"
    cmd = df.last("CMD").exec_form
    assert cmd is not None and cmd[:2] == ["python", "-c"], cmd
    imported = {
        alias.name
        for node in ast.walk(ast.parse(cmd[2]))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert set(workload_modules()) <= imported, f"{df.path}: CMD imports {imported}"


WORKLOAD_CHECKS: list[Callable[[Dockerfile], None]] = [
    check_workload_base,
    check_workload_cpu_variant_documented,
    check_workload_tag_documented,
    check_workload_user,
    check_workload_deepspeed,
    check_workload_extra,
    check_workload_build_inputs,
    check_workload_pins_match_pyproject,
    check_workload_self_check,
    check_version_label,
]


@pytest.mark.parametrize("check", WORKLOAD_CHECKS, ids=lambda c: c.__name__)
def test_workload_image(check: Callable[[Dockerfile], None]) -> None:
    check(Dockerfile.load(WORKLOADS_DOCKERFILE))


def test_the_haproxy_launcher_the_rayservice_names_is_the_one_the_image_build_checks() -> None:
    """Serve starts the binary the RayService names; the workload image's build runs that path (and it
    finds HAProxy), so an image without the launcher there never passes its own checks."""
    from rayship.api import names

    assert image_build.SERVE_HAPROXY_LAUNCHER == names.SERVE_HAPROXY_LAUNCHER
    checks = [args for image in image_build.images() for _, _, args, _ in image.checks]
    assert [names.SERVE_HAPROXY_LAUNCHER, "-v"] in checks
    assert "rayship-haproxy" in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_ray_pin_is_the_default_ray_version() -> None:
    """pyproject.toml pins the Ray of the base image (so pip keeps it) and the default rayVersion."""
    assert pyproject_pins()["ray"] == OperatorConfig().default_ray_version, pyproject_pins()["ray"]


@pytest.mark.parametrize("module", workload_modules())
def test_workload_modules_are_part_of_the_package(module: str) -> None:
    """What the RayJob entrypoint and serveConfigV2 import is installed, from this project."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{module} is not importable: is the project installed?"
    top_level = module.partition(".")[0]
    distributions = importlib.metadata.packages_distributions().get(top_level, [])
    assert PYPROJECT["project"]["name"] in distributions, (module, distributions)


# --- both images ---------------------------------------------------------------------------------


def check_no_floating_or_remote_inputs(df: Dockerfile) -> None:
    """Pinned base images (explicit tag, not `latest`), no `ADD <url>`, no `curl | sh`."""
    for image in df.base_images():
        name = image.split("@")[0]
        tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
        assert "@sha256:" in image or (tag and tag != "latest"), f"{df.path}: unpinned base image {image}"
    for instruction in df.instructions:
        assert not re.search(r"(?<![\w-])latest\b", instruction.value), (
            f"{df.path}:{instruction.line}: latest"
        )
        if instruction.keyword == "ADD":
            assert not re.search(r"\b(https?|git)://|git@", instruction.value), f"{df.path}: ADD of a URL"
        if instruction.keyword == "RUN":
            assert not re.search(r"\|\s*(sudo\s+)?(ba|z)?sh\b", instruction.value), (
                f"{df.path}: pipes to a shell"
            )


@pytest.mark.parametrize("path", [OPERATOR_DOCKERFILE, WORKLOADS_DOCKERFILE], ids=lambda p: p.parent.name)
def test_no_latest_tags_or_remote_add(path: Path) -> None:
    check_no_floating_or_remote_inputs(Dockerfile.load(path))


# --- the checks can fail -------------------------------------------------------------------------

# (Dockerfile, check, text in the real file, replacement that breaks exactly that contract)
MUTATIONS = [
    (OPERATOR_DOCKERFILE, check_operator_entrypoint, '["rayship", "operator"]', '["rayship", "render"]'),
    (OPERATOR_DOCKERFILE, check_operator_entrypoint, '["rayship", "operator"]', '["kopf", "run"]'),
    (OPERATOR_DOCKERFILE, check_operator_liveness_port, "EXPOSE 8080", "EXPOSE 9090"),
    (OPERATOR_DOCKERFILE, check_operator_liveness_port, "0.0.0.0:8080/", "0.0.0.0:9090/"),
    (OPERATOR_DOCKERFILE, check_operator_user, "USER 10001", "USER rayship"),
    (OPERATOR_DOCKERFILE, check_operator_user, "USER 10001", "USER 0"),
    (OPERATOR_DOCKERFILE, check_operator_user, "--uid 10001", "--uid 10002"),
    (OPERATOR_DOCKERFILE, check_operator_base, "python:3.11.13-slim", "python:3.12.11-slim"),
    (OPERATOR_DOCKERFILE, check_operator_base, "python:3.11.13-slim", "python:3.11-slim"),
    (
        OPERATOR_DOCKERFILE,
        check_operator_installs_only_the_operator,
        "/tmp/rayship-src \\",
        '"/tmp/rayship-src[workloads]" \\',
    ),
    (
        OPERATOR_DOCKERFILE,
        check_operator_installs_only_the_operator,
        "['dependencies']",
        "['optional-dependencies']['workloads']",
    ),
    (OPERATOR_DOCKERFILE, check_operator_build_inputs, "COPY README.md /tmp/rayship-src/\n", ""),
    (OPERATOR_DOCKERFILE, check_version_label, f"VERSION={__version__}", "VERSION=0.0.0"),
    (
        OPERATOR_DOCKERFILE,
        check_no_floating_or_remote_inputs,
        "python:3.11.13-slim-bookworm",
        "python:latest",
    ),
    (OPERATOR_DOCKERFILE, check_no_floating_or_remote_inputs, "python:3.11.13-slim-bookworm", "python"),
    (
        OPERATOR_DOCKERFILE,
        check_no_floating_or_remote_inputs,
        "COPY pyproject.toml",
        "ADD https://example.com/x.toml",
    ),
    (WORKLOADS_DOCKERFILE, check_workload_base, "ray:2.60.0-py311-gpu\n", "ray:2.59.0-py311-gpu\n"),
    (WORKLOADS_DOCKERFILE, check_workload_base, "ray:2.60.0-py311-gpu\n", "ray:2.60.0-py310-gpu\n"),
    (WORKLOADS_DOCKERFILE, check_workload_base, "FROM ${RAY_IMAGE}", "FROM rayproject/ray:2.60.0-py311"),
    (
        WORKLOADS_DOCKERFILE,
        check_workload_cpu_variant_documented,
        "ray:2.60.0-py311 \\",
        "ray:2.60.0-py311-gpu \\",
    ),
    (
        WORKLOADS_DOCKERFILE,
        check_workload_tag_documented,
        "rayship-workloads:0.1.0-gpu",
        "rayship-workloads:gpu",
    ),
    (WORKLOADS_DOCKERFILE, check_workload_user, "\nUSER 1000\n", "\nUSER 1000\nUSER ray\n"),
    (WORKLOADS_DOCKERFILE, check_workload_user, "\nUSER 1000\n", "\nUSER 1000\nUSER 0\n"),
    (WORKLOADS_DOCKERFILE, check_workload_deepspeed, "deepspeed==0.19.8", "deepspeed==0.19.7"),
    (WORKLOADS_DOCKERFILE, check_workload_deepspeed, "DS_BUILD_SHM_COMM=1 pip", "pip"),
    (
        WORKLOADS_DOCKERFILE,
        check_workload_deepspeed,
        "--no-build-isolation --no-cache-dir deepspeed",
        "--no-cache-dir deepspeed",
    ),
    (WORKLOADS_DOCKERFILE, check_workload_extra, '"/tmp/rayship-src[workloads]"', "/tmp/rayship-src"),
    (
        WORKLOADS_DOCKERFILE,
        check_workload_build_inputs,
        "COPY --chown=1000:100 workloads/",
        "COPY --chown=1000:100 bench/",
    ),
    (WORKLOADS_DOCKERFILE, check_workload_pins_match_pyproject, "-r /tmp/torch.txt", "torch==2.12.0"),
    (WORKLOADS_DOCKERFILE, check_workload_self_check, '"import rayship_workloads.job, ', '"import '),
    (
        WORKLOADS_DOCKERFILE,
        check_workload_self_check,
        "USER 1000\nWORKDIR",
        'ENTRYPOINT ["bash"]\nUSER 1000\nWORKDIR',
    ),
    (WORKLOADS_DOCKERFILE, check_version_label, 'version="${VERSION}"', 'version="0.1.0"'),
    (WORKLOADS_DOCKERFILE, check_no_floating_or_remote_inputs, "ray:2.60.0-py311-gpu\n", "ray:latest\n"),
    (
        WORKLOADS_DOCKERFILE,
        check_no_floating_or_remote_inputs,
        "then \\",
        "then curl -sSf https://x | bash; \\",
    ),
]


@pytest.mark.parametrize(
    ("path", "check", "old", "new"),
    MUTATIONS,
    ids=[f"{p.parent.name}-{c.__name__}-{i}" for i, (p, c, _, _) in enumerate(MUTATIONS)],
)
def test_check_catches_a_broken_dockerfile(
    tmp_path: Path, path: Path, check: Callable[[Dockerfile], None], old: str, new: str
) -> None:
    text = path.read_text()
    assert old in text, f"mutation target {old!r} is no longer in {path}: update MUTATIONS"
    mutated = tmp_path / "Dockerfile"
    head, _, tail = text.rpartition(old)  # the last occurrence: e.g. the final USER
    mutated.write_text(head + new + tail)
    with pytest.raises(AssertionError):
        check(Dockerfile.load(mutated))


def test_make_test_runs_every_tier_once() -> None:
    """`make test` names its tiers (some run beside the others): every tests/ folder of tests, once;
    a file a tier leaves out (--ignore) is a tier of its own (the kind tier), run once too."""
    words = [
        word
        for var in ("TIERS_WITHOUT_RAY", "TIERS_WITH_RAY", "TIERS_AFTER", "TIER_KIND")
        for word in makefile_variable(var).split()
    ]
    named = [w for w in words if not w.startswith("-")]
    ignored = [w.removeprefix("--ignore=") for w in words if w.startswith("--ignore=")]
    folders = [
        f"tests/{d.name}" for d in (REPO / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py"))
    ]
    assert sorted(n for n in named if n not in ignored) == sorted(folders)
    assert ignored == ["tests/e2e/test_kind.py"] and named.count("tests/e2e/test_kind.py") == 1


# --- the registry-free build (images/build.py, `make images`) ------------------------------------


@pytest.mark.parametrize("image", image_build.images(), ids=lambda i: i.name)
def test_build_args_are_declared(image: image_build.Image) -> None:
    """Every build arg images/build.py passes is an ARG of the Dockerfile, and the base one is what
    FROM reads: Docker ignores an undeclared arg with a warning, so a renamed PYTHON_IMAGE would build
    on the real base image (a registry pull) instead of the stand-in."""
    df = Dockerfile.load(image.dockerfile)
    declared = {i.value.partition("=")[0].strip() for i in df.all("ARG")}
    passed = set(image.build_args("http://127.0.0.1:1/"))
    assert passed <= declared, f"{df.path}: no ARG for {sorted(passed - declared)}"
    assert [i.value for i in df.all("FROM")] == [f"${{{image.base_arg}}}"], df.all("FROM")


@pytest.mark.parametrize("path", [OPERATOR_DOCKERFILE, WORKLOADS_DOCKERFILE], ids=lambda p: p.parent.name)
def test_wheelhouse_args_have_no_default(path: Path) -> None:
    """A user's build installs from the package index: the wheelhouse args are unset unless given."""
    args = {i.value for i in Dockerfile.load(path).all("ARG") if i.value.startswith("PIP_")}
    assert args == {"PIP_FIND_LINKS", "PIP_NO_INDEX"}, f"{path}: {args}"


def test_built_refs_are_the_operator_version() -> None:
    """The builds are the images the chart and the CPU samples name, as containerd names them."""
    assert sorted(image.ref for image in image_build.images()) == [
        f"docker.io/rayship/rayship-operator:{__version__}",
        f"docker.io/rayship/rayship-workloads:{__version__}-cpu",
    ]


def test_standin_and_wheelhouse_pins() -> None:
    """The Ray stand-in carries the pinned Ray (as the upstream base image does, so pip keeps it);
    the wheelhouse holds the DeepSpeed that `make setup` and the Dockerfile install."""
    assert image_build.ray_standin().args["RAY_PIN"] == f"ray[default]=={pyproject_pins()['ray']}"
    steps = [requirement for step in image_build.wheelhouse_steps() for requirement in step]
    assert makefile_variable("DEEPSPEED") in steps
    assert f"torch=={pyproject_pins()['torch']}" in steps


def test_record_name_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit to a file the Dockerfile copies renames the build's record (a rebuild); what
    .dockerignore leaves out (a __pycache__) does not."""
    for name in ("pyproject.toml", "README.md", ".dockerignore"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "operator", tmp_path / "operator", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(image_build, "REPO", tmp_path)
    monkeypatch.setenv("RAYSHIP_CACHE", str(tmp_path / "cache"))

    def operator_record() -> Path:
        (image,) = [i for i in image_build.images() if i.name == "rayship-operator"]
        return image.record_file()

    before = operator_record()
    assert before.parent == tmp_path / "cache" / "images"
    (tmp_path / "operator" / "rayship" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "operator" / "rayship" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert operator_record() == before
    source = tmp_path / "operator" / "rayship" / "cli" / "__init__.py"
    source.write_text(source.read_text() + "# edited\n")
    assert operator_record() != before


def test_print_lists_missing_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`images/build.py --print` names each ref with its build's digest or `missing`, and builds
    nothing."""
    monkeypatch.setenv("RAYSHIP_CACHE", str(tmp_path))
    assert image_build.main(["--print"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows == [[image.ref, "missing"] for image in image_build.images()]
    assert not (tmp_path / "images").exists()
    (image, *_) = image_build.images()
    image.record_file().parent.mkdir(parents=True)
    image.record_file().write_text(json.dumps({"digest": "sha256:" + "a" * 64}))
    assert image_build.main(["--print"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{image.ref}\tsha256:{'a' * 64}"


def test_a_build_is_pulled_by_its_digest_from_the_registry() -> None:
    """The node pulls the exact build recorded, by digest, under the registry's host."""
    digest = "sha256:" + "b" * 64
    found = image_build.registry_ref(
        "127.0.0.1:29182", "docker.io/rayship/rayship-workloads:0.1.0-cpu", digest
    )
    assert found == f"127.0.0.1:29182/rayship/rayship-workloads@{digest}"


def test_save_into_a_file_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--save` to a path that is a file says so in one line (exit 1), before building anything."""
    monkeypatch.setenv("RAYSHIP_CACHE", str(tmp_path / "cache"))
    (tmp_path / "afile").write_text("")
    assert image_build.main(["--save", str(tmp_path / "afile")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"images: --save {tmp_path / 'afile'}: File exists: name a folder to write the archives in"
    assert not (tmp_path / "cache").exists()


def test_the_builds_cgroups_are_found_nested_too(tmp_path: Path) -> None:
    """dockerd's --cgroup-parent lands at the top of some hierarchies and below the build's own cgroup
    in others (here: memory/process_api/<id>/rayship-images, left behind while only the top was
    looked at); a hierarchy linked under a second name (cpu -> cpu,cpuacct) counts once."""
    from images.processes import cgroup_folders

    (tmp_path / "cpu,cpuacct" / "rayship-images" / "abc").mkdir(parents=True)
    (tmp_path / "cpu").symlink_to(tmp_path / "cpu,cpuacct")
    (tmp_path / "memory" / "process_api" / "6c4a" / "rayship-images").mkdir(parents=True)
    (tmp_path / "pids" / "other").mkdir(parents=True)
    assert cgroup_folders("rayship-images", tmp_path) == [
        tmp_path / "cpu,cpuacct" / "rayship-images",
        tmp_path / "memory" / "process_api" / "6c4a" / "rayship-images",
    ]
