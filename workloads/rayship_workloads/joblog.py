"""A TrainingJob's output, written as it comes next to its checkpoints (issue 34: logs that outlive
the Ray cluster). `<storage>/<run>/logs/attempt-<N>/driver.log` holds the driver's output, which
includes every worker's (Ray forwards it, prefixed with the worker); `rank-<R>.log` holds one
training worker's own. Each file is rotated by size (the standard library's RotatingFileHandler).

Object storage has no append: there each process's output is a folder of parts,
`attempt-<N>/<process>/<seq>.log`, each an object written once with what came since the part before,
at most every PART_SECONDS (or as soon as PART_BYTES came) and at exit; the oldest parts are deleted
past the same total a PVC keeps. A process killed outright loses its last PART_SECONDS. `read` prints
either kind, in order.

The attempt is numbered by the driver as it starts (one more than the folders already there); the
workers write into the newest folder.
"""

from __future__ import annotations

import atexit
import io
import logging
import logging.handlers
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import pyarrow.fs as pafs

from rayship.api import names
from rayship_workloads import storage

_ATTEMPT = re.compile(r"^attempt-(\d+)$")
_PART = re.compile(r"^(\d+)\.log$")
PART_SECONDS = 5.0  # on object storage, a process's output is written at most this often...
PART_BYTES = 1024 * 1024  # ...or as soon as this much has come
POLL_SECONDS = 2.0  # `read` that follows: how often it looks for new parts


class LogsMissing(Exception):
    """What `read` was asked for is not there (yet): one line naming what is."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code  # as `rayship logs`' reader script exits: 3 nothing yet, 4 not this process


def logs_dir(storage_root: str, run_name: str) -> Path | None:
    """Where a run's logs go on a PVC or a local path; None for object storage (`logs_uri`)."""
    if storage.is_remote(storage_root):
        return None
    return Path(storage_root.removeprefix("file://"), run_name, names.LOGS_DIR)


def logs_uri(storage_root: str, run_name: str) -> str:
    """Where a run's logs go, as a path or an object-store URI."""
    return storage.join(storage_root, run_name, names.LOGS_DIR)


def attempts(folder: Path) -> list[int]:
    found = [
        int(m.group(1)) for p in folder.glob("attempt-*") if (m := _ATTEMPT.match(p.name)) and p.is_dir()
    ]
    return sorted(found)


def _listed(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def _numbered(fs: pafs.FileSystem, path: str, pattern: re.Pattern[str], kind: pafs.FileType) -> list[int]:
    return sorted(
        int(m.group(1)) for i in _listed(fs, path) if i.type == kind and (m := pattern.match(i.base_name))
    )


class Tee(io.TextIOBase):
    """A text stream that writes to `stream` and to a size-rotated file; anything else (fileno,
    isatty, encoding) is the stream's."""

    def __init__(self, stream: TextIO, handler: logging.Handler):
        super().__init__()
        self.stream = stream
        self.handler = handler
        self._writing = False

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        if text and not self._writing:
            # A file that cannot be written is reported by logging on stderr, which is this stream
            # again: that report goes to the stream only.
            self._writing = True
            try:
                self.handler.handle(logging.makeLogRecord({"msg": text, "args": None}))
            finally:
                self._writing = False
        return written

    def flush(self) -> None:
        self.stream.flush()
        self.handler.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _handler(path: Path) -> logging.handlers.RotatingFileHandler:
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=names.LOG_ROTATE_BYTES, backupCount=names.LOG_BACKUPS, encoding="utf-8"
    )
    handler.terminator = ""  # the text keeps its own newlines
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


class Parts(logging.Handler):
    """A process's output on object storage: a folder of parts, each an object written once (see the
    module's docstring). Written by a thread of its own, so a print never waits for the storage; a
    part that cannot be written is kept and tried again, and said once on `warn`."""

    def __init__(self, fs: pafs.FileSystem, folder: str, warn: Callable[[str], Any]):
        super().__init__()
        self.fs, self.folder, self.warn = fs, folder, warn
        self.pending: list[str] = []
        self.pending_bytes = 0
        self.written: list[tuple[str, int]] = []  # (path, bytes) of the parts kept, oldest first
        found = _numbered(fs, folder, _PART, pafs.FileType.File)  # a worker restarted in the attempt
        self.seq = found[-1] if found else 0
        self.failing = False
        self.uploading = threading.Lock()
        self.due = threading.Event()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._every, name="rayship-joblog", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def emit(self, record: logging.LogRecord) -> None:
        self.pending.append(str(record.msg))  # under the handler's lock (logging.Handler.handle)
        self.pending_bytes += len(str(record.msg))
        if self.pending_bytes >= PART_BYTES:
            self.due.set()

    def flush(self) -> None:
        """Nothing at once (every print flushes; a part each would be an object per line)."""

    def _every(self) -> None:
        while not self.closed.is_set():
            self.due.wait(PART_SECONDS)
            self.due.clear()
            self.push()

    def push(self) -> None:
        """Write what came since the last part as the next part; drop the oldest past the total kept."""
        with self.uploading:
            with self.lock:  # type: ignore[union-attr]  # logging.Handler's own, made in __init__
                text, self.pending, self.pending_bytes = "".join(self.pending), [], 0
            if not text:
                return
            path = f"{self.folder}/{self.seq + 1:08d}.log"
            data = text.encode("utf-8", "replace")
            try:
                with self.fs.open_output_stream(path) as out:
                    out.write(data)
            except OSError as err:
                with self.lock:  # type: ignore[union-attr]
                    self.pending.insert(0, text[-names.LOG_ROTATE_BYTES :])  # kept for the next try
                    self.pending_bytes += min(len(text), names.LOG_ROTATE_BYTES)
                if not self.failing:
                    self.warn(f"rayship: logs: cannot write {path}: {err} (trying again)\n")
                self.failing = True
                return
            self.failing = False
            self.seq += 1
            self.written.append((path, len(data)))
            while sum(n for _, n in self.written) > names.LOG_ROTATE_BYTES * (1 + names.LOG_BACKUPS):
                oldest, _ = self.written.pop(0)
                self.fs.delete_file(oldest)

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.due.set()
            self.thread.join(timeout=PART_SECONDS + 5)
            self.push()
        super().close()


def capture(storage_root: str, run_name: str, process: str, *, new_attempt: bool) -> Path | str | None:
    """From now on, this process's stdout and stderr are also written to `<attempt>/<process>.log`
    (on object storage, `<attempt>/<process>/`); `new_attempt` (the driver) starts the next attempt's
    folder. Where it is written; None where nothing is (object storage out of reach: said once)."""
    folder = logs_dir(storage_root, run_name)
    handler: logging.Handler
    where: Path | str
    if folder is None:
        found = _parts(storage_root, run_name, process, new_attempt)
        if found is None:
            return None
        handler, where = found
    else:
        folder.mkdir(parents=True, exist_ok=True)
        seen = attempts(folder)
        attempt = (seen[-1] + 1 if seen else 1) if new_attempt else (seen[-1] if seen else 1)
        where = folder / names.attempt_dir(attempt) / f"{process}.log"
        where.parent.mkdir(exist_ok=True)
        handler = _handler(where)
    for attr in ("stdout", "stderr"):
        current = getattr(sys, attr)
        if isinstance(current, Tee):  # captured before in this process (a second trial): the new file
            current.handler.close()
            current = current.stream
        setattr(sys, attr, Tee(current, handler))
    return where


def _parts(storage_root: str, run_name: str, process: str, new_attempt: bool) -> tuple[Parts, str] | None:
    """The object-storage writer of this process's output, and its folder's URI (None: the storage
    cannot be reached or listed: said once, and the job goes on with its pod logs)."""
    uri = logs_uri(storage_root, run_name)
    try:
        fs, base = storage.filesystem(uri)
        seen = _numbered(fs, base, _ATTEMPT, pafs.FileType.Directory)
        attempt = (seen[-1] + 1 if seen else 1) if new_attempt else (seen[-1] if seen else 1)
        inside = f"{names.attempt_dir(attempt)}/{process}"
        fs.create_dir(f"{base}/{inside}", recursive=True)  # the attempt's folder, seen by the workers
        parts = Parts(fs, f"{base}/{inside}", sys.__stderr__.write if sys.__stderr__ else print)
    except OSError as err:
        print(f"rayship: logs: {uri}: {err}: output is not kept there (pod logs only)", file=sys.stderr)
        return None
    return parts, f"{uri}/{inside}"


def read(
    logs: str,
    attempt: int | None,
    process: str,
    write: Callable[[str], Any],
    follow_while: Callable[[], bool] | None = None,
) -> None:
    """Print (`write`) one process's output of one attempt (the latest by default) as kept on object
    storage under `logs` (`logs_uri`), part by part; with `follow_while`, then the parts that come while
    it says so, and those written before it stopped saying so. OSError: the storage's own."""
    fs, base = storage.filesystem(logs)
    seen = _numbered(fs, base, _ATTEMPT, pafs.FileType.Directory)
    if not seen:
        raise LogsMissing(f"rayship: no attempt has started yet in {logs}", 3)
    attempt = seen[-1] if attempt is None else attempt
    inside = f"{base}/{names.attempt_dir(attempt)}"
    kept = [i.base_name for i in _listed(fs, inside) if i.type == pafs.FileType.Directory]
    if process not in kept:
        raise LogsMissing(
            f"rayship: no {names.attempt_dir(attempt)}/{process}; attempt {attempt} has: {' '.join(sorted(kept))} "
            f"(and attempts: {' '.join(names.attempt_dir(n) for n in seen)})",
            4,
        )
    folder, done = f"{inside}/{process}", 0
    while True:
        going = follow_while is not None and follow_while()
        for n in _numbered(fs, folder, _PART, pafs.FileType.File):
            if n > done:
                with fs.open_input_stream(f"{folder}/{n:08d}.log") as part:
                    write(part.read().decode("utf-8", "replace"))
                done = n
        if not going:
            return
        time.sleep(POLL_SECONDS)
