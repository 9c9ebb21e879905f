"""An S3 server on loopback for the tests of object storage: moto's (`make setup` puts it in
.venv/s3), in a process group of its own, stopped by its group id at the end of the session. `s3`
gives a test a fresh bucket and the environment pyarrow reads (the endpoint, test credentials, the
region; no instance metadata service), set for that test only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
S3_SERVER = ROOT / ".venv" / "s3" / "bin" / "moto_server"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not S3_SERVER.exists():
        pytest.skip(f"no S3 server for the tests ({S3_SERVER}): run `make setup`")
    port = _free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(S3_SERVER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the S3 server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path}".rstrip("/")


S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    bucket = f"t-{uuid.uuid4().hex[:10]}"
    urllib.request.urlopen(
        urllib.request.Request(f"{s3_endpoint}/{bucket}", method="PUT"), timeout=10
    ).close()
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    return S3(s3_endpoint, bucket)
