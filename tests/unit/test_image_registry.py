"""The registry the images are kept in (images/registry.py), run for real on a folder of the test's:
it answers on loopback only, names a tag's digest, keeps the newest manifest of a tag through its
garbage collection and removes the rest, and leaves no process behind.

Blobs and manifests are put in over the registry's HTTP API, as docker push does, so no dockerd is
needed; the registry binary comes with `make image-deps` (Debian's docker-registry)."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from images import registry
from images.processes import BuildError, group_members

MANIFEST_TYPE = registry.MANIFEST_TYPES[0]
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(autouse=True)
def _needs_the_binary() -> None:
    if shutil.which(registry.BINARY) is None:
        pytest.skip(f"{registry.BINARY} is not installed (`make image-deps` installs it)")


def _request(url: str, method: str, body: bytes = b"", headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=body or None, method=method, headers=headers or {})
    try:
        with DIRECT.open(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _put_blob(host: str, repository: str, data: bytes) -> dict[str, object]:
    """A monolithic upload: POST for an upload URL, then PUT the bytes with their digest."""
    request = urllib.request.Request(f"http://{host}/v2/{repository}/blobs/uploads/", method="POST")
    with DIRECT.open(request, timeout=10) as answer:
        location = urllib.parse.urljoin(f"http://{host}/", answer.headers["Location"])
    separator = "&" if "?" in location else "?"
    url = f"{location}{separator}digest={urllib.parse.quote(_digest(data))}"
    assert _request(url, "PUT", data, {"Content-Type": "application/octet-stream"}) == 201
    return {"mediaType": "application/octet-stream", "size": len(data), "digest": _digest(data)}


def _push(host: str, repository: str, tag: str, layer: bytes) -> tuple[str, str]:
    """An image of one layer under repository:tag; returns the manifest's digest and the layer's."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode()
    config_descriptor = _put_blob(host, repository, config)
    config_descriptor["mediaType"] = "application/vnd.docker.container.image.v1+json"
    layer_descriptor = _put_blob(host, repository, layer)
    layer_descriptor["mediaType"] = "application/vnd.docker.image.rootfs.diff.tar.gzip"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": config_descriptor,
            "layers": [layer_descriptor],
        }
    ).encode()
    url = f"http://{host}/v2/{repository}/manifests/{tag}"
    assert _request(url, "PUT", manifest, {"Content-Type": MANIFEST_TYPE}) == 201
    return _digest(manifest), _digest(layer)


def _has(host: str, repository: str, kind: str, digest: str) -> bool:
    url = f"http://{host}/v2/{repository}/{kind}/{digest}"
    return _request(url, "HEAD", headers={"Accept": MANIFEST_TYPE}) == 200


def test_config_listens_on_loopback_only_and_lets_the_collector_delete(tmp_path: Path) -> None:
    found = registry.config(tmp_path / "data", 1234)
    assert found["http"] == {"addr": "127.0.0.1:1234"}
    assert found["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "data")}
    assert found["storage"]["delete"] == {"enabled": True}
    assert "auth" not in found


def test_the_newest_build_of_a_tag_is_kept_and_the_one_before_collected(tmp_path: Path) -> None:
    said: list[str] = []
    with registry.serving(tmp_path, said.append) as served:
        host, pgid = served.host, served.pgid
        first, first_layer = _push(host, "rayship/x", "1.0", b"the first build's layer")
        assert served.manifest_digest("rayship/x", "1.0") == first
        second, second_layer = _push(host, "rayship/x", "1.0", b"the second build's layer")
        assert served.manifest_digest("rayship/x", "1.0") == second
        assert _has(host, "rayship/x", "manifests", first)  # untagged, still there until collected
    assert pgid is not None and not group_members(pgid), "the registry's process group outlived it"
    assert said == [f"images: the registry stopped (process group {pgid})"]

    served.collect_garbage()

    with registry.serving(tmp_path, said.append) as served:
        host = served.host
        assert served.manifest_digest("rayship/x", "1.0") == second
        assert _has(host, "rayship/x", "manifests", second)
        assert _has(host, "rayship/x", "blobs", second_layer)
        assert not _has(host, "rayship/x", "manifests", first)
        assert not _has(host, "rayship/x", "blobs", first_layer)


def test_a_missing_tag_is_one_line_naming_it(tmp_path: Path) -> None:
    with registry.serving(tmp_path, lambda _: None) as served:
        with pytest.raises(BuildError, match=r"^the registry has no rayship/none:0.1 \(HTTP 404\)$"):
            served.manifest_digest("rayship/none", "0.1")
        with pytest.raises(BuildError, match="needs the registry stopped"):
            served.collect_garbage()


def test_a_taken_port_moves_the_registry_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", registry.PORT))
            taken.listen()
        except OSError:
            pass  # another process listens there: the same case
        with registry.serving(tmp_path, said.append) as served:
            assert served.port != registry.PORT
            assert _request(f"http://{served.host}/v2/", "GET") == 200
    assert said[0].startswith(f"images: port {registry.PORT} is taken: the registry serves on {served.port}")


def test_a_registry_that_exits_at_start_is_one_line_naming_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "BINARY", "false")  # exits 1 at once, as a registry that cannot start
    with pytest.raises(
        BuildError, match=rf"^the registry exited \(1\): .* \[log: {tmp_path}/logs/registry.log\]$"
    ):
        registry.Registry(tmp_path).start(lambda _: None)


def test_a_registry_a_killed_run_left_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    """A run killed outright leaves its registry serving (and holding the port): the next start stops
    that process group, as recorded, and serves on the port again."""
    said: list[str] = []
    left = registry.Registry(tmp_path)
    left.start(said.append)  # and never stopped: its run was killed
    assert left.port == registry.PORT and left.pgid is not None
    with registry.serving(tmp_path, said.append) as served:
        assert served.port == registry.PORT
        assert not group_members(left.pgid)
        assert _request(f"http://{served.host}/v2/", "GET") == 200
    assert said[0] == f"images: stopping the registry a killed run left (process group {left.pgid})"
    assert not (tmp_path / "registry.pgid").exists()
