"""OCI image archives written without a container engine: an image layout as a tar that
`ctr images import` reads. The real node's pause image and the kind node's control-plane images
(static binaries on an empty base, kube-proxy's on a Debian root filesystem) are made so."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile


def file_layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    """An uncompressed layer tar of `files` (path -> (content, mode)), deterministic (mtime 0).
    Parent folders are written too (0755): a layer of `usr/local/bin/etcd` alone unpacks, but its
    folders would then have no mode of their own."""
    entries: dict[str, tuple[bytes | None, int]] = {}
    for name in files:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            entries.setdefault("/".join(parts[:i]), (None, 0o755))
    entries.update(files)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, (data, mode) in sorted(entries.items()):
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                out.addfile(info)
            else:
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _desc(media: str, data: bytes, **extra: object) -> dict:
    return {
        "mediaType": media,
        "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
        "size": len(data),
        **extra,
    }


def oci_archive(ref: str, layers: list[bytes], config: dict, *, compress: bool = True) -> bytes:
    """An OCI image layout tar of one image `ref` whose layers are the uncompressed tars `layers`
    (bottom first) and whose runtime config is `config` (Entrypoint, Env, User, ...)."""
    blobs = [gzip.compress(layer, mtime=0) if compress else layer for layer in layers]
    layer_media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in layers]},
    }, sort_keys=True).encode()  # fmt: skip
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _desc("application/vnd.oci.image.config.v1+json", image_config),
        "layers": [_desc(layer_media, blob) for blob in blobs],
    }, sort_keys=True).encode()  # fmt: skip
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [_desc("application/vnd.oci.image.manifest.v1+json", manifest,
                            annotations={"io.containerd.image.name": ref,
                                         "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]})],
    }, sort_keys=True).encode()  # fmt: skip
    out = {
        f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": (b, 0o644) for b in (*blobs, image_config, manifest)
    }
    out["index.json"] = (index, 0o644)
    out["oci-layout"] = (b'{"imageLayoutVersion":"1.0.0"}', 0o644)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(out.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
