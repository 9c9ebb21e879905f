"""Running the image build's commands and daemons: logged commands whose failure is one line, and
process groups stopped whole (never a kill by name)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

LOG = Callable[[str], None]


class Daemon(Protocol):
    def start(self, log: LOG) -> None: ...

    def stop(self, log: LOG) -> None: ...


D = TypeVar("D", bound=Daemon)


class BuildError(Exception):
    """A step failed; the message is one line saying which and why."""


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def start_logged(
    cmd: list[str], log_file: Path, env: dict[str, str] | None = None, *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start cmd with its output appended to log_file (in a process group of its own if new_session)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=new_session
        )


def wait_logged(process: subprocess.Popen[bytes], log_file: Path, what: str) -> None:
    """Wait for a command `start_logged` started; a failure names the step and its last line."""
    code = process.wait()
    if code != 0:
        raise BuildError(f"{what} failed (exit {code}): {last_line(log_file)} [log: {log_file}]")


def run_logged(cmd: list[str], log_file: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run cmd with its output appended to log_file; a failure names the step and its last line."""
    wait_logged(start_logged(cmd, log_file, env), log_file, what)


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended while the list was read
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def stop_group(pgid: int, what: str, log: LOG) -> None:
    """SIGTERM to the process group (30 s), then SIGKILL; raises if any of it survives."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if not group_members(pgid):
            break
        os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if group_members(pgid):
        raise BuildError(f"processes of {what}'s group {pgid} survived SIGKILL: {group_members(pgid)}")
    log(f"images: {what} stopped (process group {pgid})")


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # the process ended while the list was read
            continue
    return [pid for pid in found if pid != os.getpid()]


def cgroup_folders(name: str, root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """Every cgroup folder called `name`, at any depth of each hierarchy: dockerd's --cgroup-parent is
    made at the top of some controllers and, where the build itself runs in a nested cgroup (a memory
    hierarchy's /process_api/<id> here), below that one."""
    found: dict[Path, Path] = {}
    for hierarchy in root.iterdir():
        if hierarchy.is_symlink() or not hierarchy.is_dir():
            continue  # cpu -> cpu,cpuacct: the same hierarchy under another name
        for folder in hierarchy.rglob(name):
            if folder.is_dir():
                found.setdefault(folder.resolve(), folder)
    return sorted(found.values())


def remove_cgroups(name: str, log: LOG) -> None:
    """The cgroup folders dockerd and runc created under each controller (empty once they stop)."""
    for top in cgroup_folders(name):
        folders = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for folder in [*folders, top]:
            try:
                folder.rmdir()
            except OSError as error:  # still has a process: said, and left for the next run
                log(f"images: cgroup {folder} left behind: {error.strerror}")


@contextmanager
def running(daemon: D, log: LOG) -> Iterator[D]:
    """`daemon` started for the block and stopped after it, also when its start or the block fails."""
    try:
        daemon.start(log)
        yield daemon
    finally:
        daemon.stop(log)
