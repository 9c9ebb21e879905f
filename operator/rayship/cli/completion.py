"""`rayship completion bash|zsh|fish`: a completion script for the shell, generated from the argparse
parser itself by shtab (every command, its flags, the choices of each: output formats, kind names), so
it never lags behind the CLI. Static: pressing Tab runs no Python."""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHELLS = ("bash", "zsh", "fish")
INSTALL = {
    "bash": "source <(rayship completion bash)   # in ~/.bashrc; or: rayship completion bash > "
    "~/.local/share/bash-completion/completions/rayship",
    "zsh": 'rayship completion zsh > "${fpath[1]}/_rayship"   # then: autoload -U compinit && compinit',
    "fish": "rayship completion fish > ~/.config/fish/completions/rayship.fish",
}


# Flags (by dest) that name a file or a folder: completed with the shell's own path completion.
FILES = frozenset({"file", "kubeconfig"})
FOLDERS = frozenset({"runs_dir", "root"})


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab

    for action in actions(parser):
        if action.dest in FILES:
            action.complete = shtab.FILE  # type: ignore[attr-defined]
        elif action.dest in FOLDERS:
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return str(shtab.complete(parser, shell=shell))


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument of the parser and of its commands."""
    found = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias is the same parser
                found += actions(sub)
    return found


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for the shell. Install it with:\n"
        + "\n".join(f"  {shell}: {line}" for shell, line in INSTALL.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=lambda args: _print(root, args.shell))


def _print(root: argparse.ArgumentParser, shell: str) -> int:
    sys.stdout.write(script(root, shell))
    return 0
