"""The kubectl-style CLI without a cluster: the cluster flags on every command that talks to one, the
exit codes in `rayship --help`, and a kubeconfig that is missing or names a server that does not answer
said in one line (no traceback, no urllib3 retries), quickly, with its exit code."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rayship import api, cli
from rayship.cli import get, kube
from tests.conftest import ROOT

CLUSTER_COMMANDS = ("get", "status", "describe", "logs")
CLUSTER_FLAGS = {"-n", "--namespace", "--context", "--kubeconfig"}


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize("command", CLUSTER_COMMANDS)
def test_every_command_that_talks_to_a_cluster_takes_kubectls_flags(command: str) -> None:
    parser = commands(cli.build_parser())[command]
    assert CLUSTER_FLAGS <= flags(parser)
    args = cli.build_parser().parse_args(
        [command, "tj/x", "-n", "team-a", "--context", "c", "--kubeconfig", "/k"]
    )
    assert (args.namespace, args.context, args.kubeconfig) == ("team-a", "c", "/k")


def test_get_lists_across_namespaces_and_prints_each_output_format() -> None:
    parser = commands(cli.build_parser())["get"]
    assert {"-A", "--all-namespaces", "-o", "--output", "-l", "--selector"} <= flags(parser)
    (output,) = [a for a in parser._actions if a.dest == "output"]
    assert list(output.choices or ()) == ["yaml", "json", "wide", "name"]


def test_get_takes_every_name_of_each_kind_from_the_api() -> None:
    """The words come from api.KINDS (plural, singular, short names, the kind, plural.group), in any case."""
    parse = cli.build_parser().parse_args
    for kind in api.KINDS:
        for word in (
            kind.plural,
            kind.singular,
            *kind.short_names,
            kind.kind,
            kind.kind.upper(),
            kind.crd_name,
        ):
            assert get.kind_of(parse(["get", word]).kind) is kind
        assert get.split_ref(f"{kind.short_names[0]}/mlp") == (kind, "mlp")
    assert get.split_ref("mlp") == (None, "mlp")
    assert [get.kind_of(w).kind for w in ("tj", "ms", "ts")] == [
        "TrainingJob",
        "ModelService",
        "TrainingSchedule",
    ]
    with pytest.raises(SystemExit) as usage:
        parse(["get", "rayjobs"])
    assert usage.value.code == kube.EXIT_USAGE


def test_the_exit_codes_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code in (kube.EXIT_OK, kube.EXIT_ERROR, kube.EXIT_USAGE, kube.EXIT_UNREACHABLE):
        assert f"\n  {code}  " in out


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}
                ],
                "current-context": "ctx",
            }
        )
    )
    return path


def rayship(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`rayship ARGV` as a fresh process (its own logging, as a user's shell runs it), and its seconds."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rayship.cli", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    return done, time.monotonic() - start


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


@pytest.mark.parametrize("command", [["get", "tj"], ["describe", "x"], ["logs", "tj/x"]])
def test_no_cluster_is_one_line_with_its_exit_code_quickly(tmp_path: Path, command: list[str]) -> None:
    missing, _ = rayship(*command, "--kubeconfig", str(tmp_path / "none"))
    dead, seconds = rayship(
        *command, "--kubeconfig", str(kubeconfig(tmp_path / "k", f"https://127.0.0.1:{closed_port()}"))
    )
    assert missing.returncode == kube.EXIT_ERROR, missing.stderr
    assert missing.stderr == (
        f"error: no kubeconfig at {tmp_path / 'none'}: name one with --kubeconfig FILE or KUBECONFIG=FILE "
        "(the file kubectl uses for the cluster)\n"
    )
    assert dead.returncode == kube.EXIT_UNREACHABLE, dead.stderr
    assert dead.stderr.startswith("error: cannot reach the API server at https://127.0.0.1:")
    assert "(context ctx): connection refused;" in dead.stderr
    for done in (missing, dead):
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert "Traceback" not in done.stderr and "Retrying" not in done.stderr
    assert seconds < 10


def test_the_kubeconfig_s_own_problems_are_said_in_our_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = kubeconfig(tmp_path / "k", "https://127.0.0.1:1")
    assert cli.main(["get", "tj", "--kubeconfig", str(good), "--context", "other"]) == kube.EXIT_ERROR
    assert capsys.readouterr().err == f"error: --context other: no such context in {good} (it has: ctx)\n"
    broken = tmp_path / "broken"
    broken.write_text("clusters: [\n")
    assert cli.main(["status", "x", "--kubeconfig", str(broken)]) == kube.EXIT_ERROR
    err = capsys.readouterr().err
    assert err == (
        f"error: kubeconfig {broken}: not valid YAML at line 2, column 1: YAML expected a value here: close a '[' "
        "or '{' left open above, or give the value a '-' or ':' announces (expected the node content, but found "
        "'<stream end>')\n"
    )
    assert "Invalid kube-config" not in err


def test_kubeconfig_defaults_as_kubectl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    assert kube.kubeconfig_paths(None) == [f"{tmp_path}/a", f"{tmp_path}/b"]
    assert kube.kubeconfig_paths("/x") == ["/x"]
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kube.kubeconfig_paths(None) == [f"{tmp_path}/.kube/config"]
    conn = kube.connect(str(kubeconfig(tmp_path / "k", "https://127.0.0.1:1")), None)
    assert (conn.namespace, conn.context, conn.host) == ("team-a", "ctx", "https://127.0.0.1:1")
    assert conn.namespace_or_default(None) == "team-a" and conn.namespace_or_default("b") == "b"
    assert conn.client.configuration.retries is False  # a dead server is said at once, not retried


def test_the_docs_page_names_every_command_flag_kind_and_exit_code() -> None:
    """docs/cli.md keeps up with the parser: a command or flag added without a word there fails here."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    for name, parser in commands(cli.build_parser()).items():
        assert f"rayship {name}" in page, name
        for flag in flags(parser) - {"-h", "--help"}:
            if flag.startswith("--"):
                assert f"{flag}" in page, f"rayship {name} {flag}"
    for kind in api.KINDS:
        assert all(f"`{w}`" in page for w in (kind.plural, kind.singular, *kind.short_names)), kind.kind
    codes = page.split("## Exit codes")[1]
    for code in (kube.EXIT_OK, kube.EXIT_ERROR, kube.EXIT_USAGE, kube.EXIT_UNREACHABLE):
        assert f"\n| {code} | " in codes


def test_verbose_reaches_the_local_run_and_the_demo(monkeypatch, tmp_path) -> None:
    """`--verbose` hands Ray's own output back to the terminal (rayship_workloads.raylog); without it
    the local run keeps it in its ray-output.log."""
    from rayship_workloads import local

    calls: list[tuple[str, bool]] = []
    monkeypatch.setattr(local, "run", lambda doc, **kw: calls.append(("run", kw["verbose"])) or {})
    monkeypatch.setattr(local, "demo", lambda doc, **kw: calls.append(("demo", kw["verbose"])) or {})
    sample = str(ROOT / "manifests" / "samples" / "trainingjob-ddp.yaml")
    runs = str(tmp_path / "runs")
    assert cli.main(["run", "-f", sample, "--runs-dir", runs]) == 0
    assert cli.main(["run", "-f", sample, "--runs-dir", runs, "--verbose"]) == 0
    assert cli.main(["demo", "-f", sample, "--runs-dir", runs, "--verbose"]) == 0
    assert cli.main(["demo", "-f", sample, "--runs-dir", runs]) == 0
    assert calls == [("run", False), ("run", True), ("demo", True), ("demo", False)]
