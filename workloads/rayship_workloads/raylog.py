"""Ray's own output during a local run (`rayship run`, `rayship demo`): into a file, not the terminal.

Ray prints what every Ray process writes on the driver's terminal, each line behind its process
(`(RayTrainWorker pid=…)`, `(SplitCoordinator pid=…)`, `(ServeController pid=…)`), and Ray's libraries
log to it from the driver (Serve's banner, "Started Serve"). In a local run that is Ray's bookkeeping,
not the user's: the terminal shows rayship's own lines (the plan, an epoch a line, the model, the
endpoint) and `RayOutput` writes everything of Ray's, prefix and all, to one file whose path is said
once. What a program prints in a Ray process (an own train loop's `print()`, a tuning trial's
progress line) still reaches the terminal, without Ray's prefix; the per-rank lines rayship writes for
a pod's log (`rayship: ...`, `podlog.say`) do not: the driver prints each epoch once. A warning or an
error that Ray logs reaches the terminal in one line each (once per message), but for the few listed
in `KNOWN_BENIGN`. `--verbose` leaves Ray's output on the terminal, as Ray prints it.

Ray hands each batch of a process's lines to the handlers of its driver-side dispatcher
(`ray._private.ray_logging.global_worker_stdstream_dispatcher`); its own handler, `ray_print_logs`,
prints them. `RayOutput` takes that handler's place, and the stream handlers of the `ray.*` loggers.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

RAY_PRINT_HANDLER = "ray_print_logs"  # the name Ray's driver gives its printing handler
SURFACED_CHARS = 200
RAY_DAEMONS = ("autoscaler", "raylet")  # the `pid` Ray gives the lines of its own daemons
POD_LOG_PREFIX = "rayship: "  # podlog.say's lines: for a pod's log, the driver says the same once
# Messages Ray logs as warnings or errors on every local run that say nothing about the user's job:
# into the file only. Each with why.
KNOWN_BENIGN = (
    # Ray Train's own PreemptionWatcher actor, logged by Ray's core at level E on every run (Ray 2.60):
    # a note to Ray's developers about the actor's restart, not a failure of the run
    re.compile(
        r"Actor with class name: 'PreemptionWatcher' .* has constructor arguments in the object store"
    ),
    # a deprecation inside Ray's own libraries is for Ray's developers (Python itself shows a
    # DeprecationWarning only to the code that triggers it)
    re.compile(r"^\w*DeprecationWarning: "),
)

# The forms Ray's processes write a warning or an error in: glog (its C++ core), Python logging (Ray's
# format "... WARNING file.py:12 -- msg" and Serve's "WARNING 2026-... serve 123 -- msg"), Python's
# warnings module ("file.py:12: FooWarning: msg") and an exception's last line ("FooError: msg").
_GLOG = re.compile(r"^\[[^\]]* (?P<level>[WEF]) \d+ \d+\] (?:\S+:\d+: )?(?P<message>.*)")
_LOGGING = re.compile(r"\b(?P<level>WARNING|ERROR|CRITICAL)\b.*? -- (?P<message>.*)")
_PY_WARNING = re.compile(r"(?:^|: )(?P<message>(?P<kind>\w*Warning): .*)")
_PY_ERROR = re.compile(r"^(?P<message>(?:\w+\.)*\w*(?:Error|Exception): .*)")


def severity(line: str) -> tuple[str, str] | None:
    """("warning" | "error", the message) when `line` is one of Ray's warnings or errors, else None."""
    if found := _GLOG.match(line):
        return ("warning" if found["level"] == "W" else "error"), found["message"]
    if found := _LOGGING.search(line):
        return ("warning" if found["level"] == "WARNING" else "error"), found["message"]
    if found := _PY_WARNING.search(line):
        return "warning", found["message"]
    if found := _PY_ERROR.match(line):
        return "error", found["message"]
    return None


def source_of(data: dict[str, Any]) -> str:
    """The process a batch came from, as Ray names it in its prefix (without the prefix's form)."""
    name = data.get("actor_name") or data.get("task_name")
    pid = data.get("pid")
    return f"{name} pid={pid}" if name else f"pid={pid}"


class RayOutput:
    """Ray's output of one local run, kept in `path`; `terminal` gets the one-line warnings/errors."""

    def __init__(self, path: Path, *, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.path = path
        self._stdout = out  # None: sys.stdout / sys.stderr as they are when a line comes
        self._stderr = err
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._said: set[str] = set()
        self._loggers: list[tuple[logging.Logger, logging.Handler, logging.Handler]] = []
        self.warnings = 0
        self.errors = 0

    def _out(self) -> TextIO:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", buffering=1)
        return self._file

    def handle(self, data: dict[str, Any]) -> None:
        """One batch of a Ray process's lines (Ray's dispatcher calls this, from its log thread)."""
        source = source_of(data)
        # Ray's monitor and raylet: their status reports (the autoscaler's, every 5 s) are Ray's own
        ray_own = data.get("pid") in RAY_DAEMONS
        with self._lock:
            out = self._out()
            for line in data.get("lines", []):
                out.write(f"({source}) {line}\n")
                if not data.get("is_err"):
                    if not ray_own and not line.startswith(POD_LOG_PREFIX):
                        print(line, file=self._stdout or sys.stdout, flush=True)
                elif (found := severity(line)) is not None:
                    self._surface(*found, source.split(" pid=")[0])

    def _surface(self, level: str, message: str, source: str) -> None:
        """One line on the terminal for a warning or an error, the first time its message is seen."""
        if level == "warning":
            self.warnings += 1
        else:
            self.errors += 1
        message = " ".join(message.split())
        if message in self._said or any(benign.search(message) for benign in KNOWN_BENIGN):
            return
        self._said.add(message)
        if len(message) > SURFACED_CHARS:
            message = message[: SURFACED_CHARS - 3] + "..."
        print(
            f"ray {level} from {source}: {message}  (all of Ray's output: {self.path})",
            file=self._stderr or sys.stderr,
            flush=True,
        )

    def attach(self) -> None:
        """Take over Ray's printing on this driver: its dispatcher's handler and the stream handlers of
        the `ray` loggers there are now. Call once Ray runs (its dispatcher handler exists), and again
        after importing a Ray library that sets up a logger of its own (Serve does); idempotent."""
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        dispatcher.remove_handler(RAY_PRINT_HANDLER)
        dispatcher.remove_handler(_HANDLER_NAME)
        dispatcher.add_handler(_HANDLER_NAME, self.handle)
        names = [n for n in logging.root.manager.loggerDict if n == "ray" or n.startswith("ray.")]
        for name in names:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if isinstance(handler, _ToFile) or not _is_terminal_stream(handler):
                    continue
                replacement = _ToFile(self, handler.formatter)
                logger.removeHandler(handler)
                logger.addHandler(replacement)
                self._loggers.append((logger, handler, replacement))

    def detach(self) -> None:
        """Give the loggers their handlers back (Ray's dispatcher goes with Ray's shutdown)."""
        for logger, original, replacement in reversed(self._loggers):
            logger.removeHandler(replacement)
            logger.addHandler(original)
        self._loggers.clear()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_HANDLER_NAME = "rayship_ray_output"


def _is_terminal_stream(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return not isinstance(handler, logging.FileHandler) and stream in (
        sys.stderr,
        sys.stdout,
        sys.__stderr__,
        sys.__stdout__,
    )


class _ToFile(logging.Handler):
    """A `ray.*` logger's records on this driver: into the run's file, warnings and errors surfaced."""

    def __init__(self, output: RayOutput, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.output = output
        self.setFormatter(formatter or logging.Formatter("%(levelname)s %(name)s -- %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 (logging's own contract: a record that cannot format is reported)
            self.handleError(record)
            return
        with self.output._lock:
            self.output._out().write(text + "\n")
            if record.levelno >= logging.WARNING:
                level = "warning" if record.levelno == logging.WARNING else "error"
                self.output._surface(level, record.getMessage().split("\n", 1)[0], record.name)
