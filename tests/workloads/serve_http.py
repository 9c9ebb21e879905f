"""HTTP helpers for the Serve tests: a free port, a JSON call, HTTP chunks of a streamed response."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def call(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one HTTP request; `raw` sends bytes as they are."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def http_chunks(url: str, body: dict[str, Any]) -> tuple[dict[str, str], list[bytes]]:
    """POST `body` over a raw socket: (response headers, the body's HTTP/1.1 chunks as the server sent
    them). A server that streams sends each event in its own chunk; a buffered body comes as one."""
    parts = urllib.parse.urlsplit(url)
    payload = json.dumps(body).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        stream = sock.makefile("rb")
        status = stream.readline().decode()
        assert status.split()[1] == "200", status
        headers: dict[str, str] = {}
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        assert headers.get("transfer-encoding") == "chunked", headers
        chunks: list[bytes] = []
        while size := int(stream.readline().split(b";")[0], 16):
            chunks.append(stream.read(size))
            assert stream.readline() == b"\r\n"
        return headers, chunks


def sse_events(chunks: list[bytes]) -> list[bytes]:
    """The server-sent events in `chunks`, each checked to be whole within its chunk."""
    out: list[bytes] = []
    for chunk in chunks:
        assert chunk.endswith(b"\n\n"), f"a chunk ends inside an event: {chunk!r}"
        out.extend(event + b"\n\n" for event in chunk[:-2].split(b"\n\n"))
    return out


def declared_but_not_sent(url: str, length: int) -> tuple[int, dict[str, Any]]:
    """POST that declares a `length`-byte body and sends only its first KiB: the answer must come from
    the Content-Length alone (a server that read the body would wait, and time out)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.putrequest("POST", parts.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        conn.send(b'{"instances": [' + b" " * 1024)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()
