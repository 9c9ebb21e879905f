"""The cluster's certificates (openssl): the CA, each component's client or serving certificate, and
the kubeconfigs that carry them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from controlplane import node as realnode
from controlplane.config import APISERVER_SANS, log
from controlplane.processes import Paths, run_command


# --- certificates (openssl) -------------------------------------------------------------------------
def _openssl(*args: str) -> None:
    run_command(["openssl", *args])


def ensure_pki(paths: Paths) -> None:
    pki = paths.pki
    if (pki / "complete").exists():
        missing = _apiserver_sans_missing(pki)
        if missing:
            log(f"the API server certificate lacks {', '.join(missing)}: making it again")
            _leaf(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", APISERVER_SANS)
        _node_pki(pki)
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True)
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    _openssl("genpkey", *ec, "-out", str(pki / "ca.key"))
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=rayship-local-ca", "-days", "3650",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", str(pki / "ca.crt"),
    )  # fmt: skip
    leaves = {
        "apiserver": ("/CN=kube-apiserver", "serverAuth", APISERVER_SANS),
        "admin": ("/O=system:masters/CN=rayship-admin", "clientAuth", []),
        "kube-controller-manager": ("/CN=system:kube-controller-manager", "clientAuth", []),
        "kube-scheduler": ("/CN=system:kube-scheduler", "clientAuth", []),
        "kwok": ("/CN=rayship:kwok", "clientAuth", []),
        "provisioner": ("/CN=rayship:provisioner", "clientAuth", []),
    }
    for name, (subject, usage, alt) in leaves.items():
        _leaf(pki, name, subject, usage, alt)
    # Service-account token signing pair.
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(pki / "sa.key"))
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for key in pki.glob("*.key"):
        key.chmod(0o600)
    _node_pki(pki)
    (pki / "complete").write_text("")


def _node_pki(pki: Path) -> None:
    """The real node's certificates (controlplane/node.py), each made if it is missing."""
    for name, (subject, usage, alt) in realnode.CERTIFICATES.items():
        if not (pki / f"{name}.crt").exists():
            _leaf(pki, name, subject, usage, alt)


def _apiserver_sans_missing(pki: Path) -> list[str]:
    """The APISERVER_SANS the serving certificate lacks (e.g. one made before a SAN was added)."""
    out = run_command(
        ["openssl", "x509", "-in", str(pki / "apiserver.crt"), "-noout", "-ext", "subjectAltName"]
    ).stdout
    have = {part.strip().replace("IP Address:", "IP:") for part in out.split("\n", 1)[-1].split(",")}
    return [san for san in APISERVER_SANS if san not in have]


def _leaf(pki: Path, name: str, subject: str, usage: str, alt: list[str]) -> None:
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    key, csr, crt, ext = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genpkey", *ec, "-out", str(key))
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={usage}"]  # fmt: skip
    if alt:
        lines.append("subjectAltName=" + ",".join(alt))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "825", "-extfile", str(ext),
        "-out", str(crt),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)


def write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str], name: str) -> None:
    """A kubeconfig (JSON is valid YAML) for one identity."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rayship-local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": "rayship-local", "context": {"cluster": "rayship-local", "user": name}}],
        "current-context": "rayship-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(cfg, fh, indent=2)


def cert_kubeconfig(paths: Paths, who: str, server: str, path: Path | None = None) -> Path:
    path = path or paths.kubeconfig_for(who)
    user = {"client-certificate": str(paths.pki / f"{who}.crt"), "client-key": str(paths.pki / f"{who}.key")}
    write_kubeconfig(path, server, paths.pki / "ca.crt", user, who)
    return path
