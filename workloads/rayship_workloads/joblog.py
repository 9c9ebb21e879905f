"""A TrainingJob's output, written as it comes next to its checkpoints (issue 34: logs that outlive
the Ray cluster). `<storage>/<run>/logs/attempt-<N>/driver.log` holds the driver's output, which
includes every worker's (Ray forwards it, prefixed with the worker); `rank-<R>.log` holds one
training worker's own. Each file is rotated by size (the standard library's RotatingFileHandler).

The attempt is numbered by the driver as it starts (one more than the folders already there); the
workers write into the newest folder. Only storage with files (a PVC, a local path) keeps them:
object storage has no append, and said so once.
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from rayship.api import names
from rayship_workloads import storage

_ATTEMPT = re.compile(r"^attempt-(\d+)$")


def logs_dir(storage_root: str, run_name: str) -> Path | None:
    """Where a run's logs go; None for object storage."""
    if storage.is_remote(storage_root):
        return None
    return Path(storage_root.removeprefix("file://"), run_name, names.LOGS_DIR)


def attempts(folder: Path) -> list[int]:
    found = [
        int(m.group(1)) for p in folder.glob("attempt-*") if (m := _ATTEMPT.match(p.name)) and p.is_dir()
    ]
    return sorted(found)


class Tee(io.TextIOBase):
    """A text stream that writes to `stream` and to a size-rotated file; anything else (fileno,
    isatty, encoding) is the stream's."""

    def __init__(self, stream: TextIO, handler: logging.handlers.RotatingFileHandler):
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


def capture(storage_root: str, run_name: str, process: str, *, new_attempt: bool) -> Path | None:
    """From now on, this process's stdout and stderr are also written to `<attempt>/<process>.log`;
    `new_attempt` (the driver) starts the next attempt's folder. The file, or None where none is kept."""
    folder = logs_dir(storage_root, run_name)
    if folder is None:
        if new_attempt:
            print(
                f"rayship: logs: {storage_root} is object storage: output is not kept there (pod logs only)"
            )
        return None
    folder.mkdir(parents=True, exist_ok=True)
    seen = attempts(folder)
    attempt = (seen[-1] + 1 if seen else 1) if new_attempt else (seen[-1] if seen else 1)
    where = folder / names.attempt_dir(attempt)
    where.mkdir(exist_ok=True)
    path = where / f"{process}.log"
    handler = _handler(path)
    for attr in ("stdout", "stderr"):
        current = getattr(sys, attr)
        if isinstance(current, Tee):  # captured before in this process (a second trial): the new file
            current.handler.close()
            current = current.stream
        setattr(sys, attr, Tee(current, handler))
    return path
