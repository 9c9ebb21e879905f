"""`rayship completion bash|zsh|fish`: the bash script is valid bash, and sourced in a real bash its
completion function completes the commands, their flags, the output formats and the kind names (the
shell's COMP_WORDS/COMP_CWORD, as bash sets them on Tab); zsh's and fish's name every command."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from rayship import api, cli
from rayship.cli import completion


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    return out


def command_names() -> list[str]:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


@pytest.fixture
def bash_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "rayship.bash"
    path.write_text(script("bash", capsys))
    return path


def complete(bash_script: Path, *words: str) -> list[str]:
    """What bash's Tab offers after `words` (the last one is the word being completed)."""
    program = "\n".join(
        [
            f"source {shlex.quote(str(bash_script))}",
            "spec=$(complete -p rayship) || exit 7",
            'function=$(sed -n "s/.*-F \\([^ ]*\\) rayship$/\\1/p" <<< "$spec")',
            f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})",
            "COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))",
            'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}',
            '"$function" rayship "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"',
            'printf "%s\\n" "${COMPREPLY[@]}"',
        ]
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_bash_script_is_valid_bash(bash_script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_bash_completes_the_commands(bash_script: Path) -> None:
    assert "get" in complete(bash_script, "rayship", "g")
    assert set(complete(bash_script, "rayship", "")) == set(command_names())
    assert {"status", "describe", "completion", "logs"} <= set(command_names())
    assert complete(bash_script, "rayship", "desc") == ["describe"]


def test_bash_completes_kind_names_flags_and_output_formats(bash_script: Path) -> None:
    every_kind = [w for k in api.KINDS for w in (k.plural, k.singular, *k.short_names)]
    assert sorted(complete(bash_script, "rayship", "get", "")) == sorted(every_kind)
    assert "tj" in complete(bash_script, "rayship", "get", "t")
    assert "ms" in complete(bash_script, "rayship", "get", "m")
    assert sorted(complete(bash_script, "rayship", "get", "tj", "-o", "")) == ["json", "name", "wide", "yaml"]
    for command in ("get", "status", "describe", "logs"):
        offered = complete(bash_script, "rayship", command, "--")
        assert {"--namespace", "--context", "--kubeconfig"} <= set(offered), command
    assert "--all-namespaces" in complete(bash_script, "rayship", "get", "tj", "--a")
    assert sorted(complete(bash_script, "rayship", "completion", "")) == ["bash", "fish", "zsh"]


def test_bash_completes_paths_for_files(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("")
    assert complete(bash_script, "rayship", "render", "-f", f"{tmp_path}/jo") == [f"{tmp_path}/job.yaml"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_every_command_and_kind(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = script(shell, capsys)
    for name in command_names():
        assert name in out, name
    for kind in api.KINDS:
        assert kind.plural in out and kind.short_names[0] in out
    checker = shutil.which(shell)
    if checker:  # where the shell is installed: its own syntax check
        done = subprocess.run([checker, "-n"], input=out, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


def test_every_shell_has_its_install_line() -> None:
    assert set(completion.INSTALL) == set(completion.SHELLS) == {"bash", "zsh", "fish"}
