"""The PV provisioner (runs as its own component): a hostPath PV for every pending claim of the default
class, deleted once released."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from controlplane.config import PROVISIONER, STORAGE_CLASS
from controlplane.objects import api_client


# --- the PV provisioner (runs as its own component) -------------------------------------------------
def provisioner(kubeconfig: Path, volumes: Path, interval: float = 1.0) -> None:
    """Give every pending claim of the default class a hostPath PV under `volumes`/<claim uid>.

    The claim's binding itself is done by the real PV controller (kube-controller-manager): this loop
    only plays the external provisioner of STORAGE_CLASS, and deletes the PVs it made once released.
    """
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    core = kubernetes.client.CoreV1Api(api_client(kubeconfig))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        try:
            for pvc in core.list_persistent_volume_claim_for_all_namespaces().items:
                if (
                    pvc.status.phase != "Pending"
                    or pvc.spec.volume_name
                    or pvc.spec.storage_class_name != STORAGE_CLASS
                ):
                    continue
                path = volumes / pvc.metadata.uid
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # as local-path-provisioner: the pods' users are not root
                pv = _volume_for(pvc, path)
                try:
                    core.create_persistent_volume(pv)
                    print(
                        f"provisioned {pv['metadata']['name']} for {pvc.metadata.namespace}/{pvc.metadata.name}",
                        flush=True,
                    )
                except ApiException as err:
                    if err.status != 409:
                        raise
            for pv in core.list_persistent_volume().items:
                annotations = pv.metadata.annotations or {}
                if (
                    annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
                    and pv.status.phase == "Released"
                ):
                    # its folder first: once the PV is gone its storage is (the folder removed after
                    # the PV left a moment where a reader saw no PV and the folder still there)
                    if pv.spec.host_path and Path(pv.spec.host_path.path).parent == volumes:
                        shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
                    with contextlib.suppress(ApiException):
                        core.delete_persistent_volume(pv.metadata.name)
                    print(f"deleted released {pv.metadata.name}", flush=True)
        except Exception as err:  # noqa: BLE001  (keep running: the apiserver may be restarting)
            print(f"provisioner: {err}", flush=True)
        time.sleep(interval)


def _volume_for(pvc: Any, path: Path) -> dict[str, Any]:
    """The hostPath PV at `path` for a pending claim, bound to it (claimRef), deleted once released."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{pvc.metadata.uid}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": pvc.spec.resources.requests["storage"]},
            "accessModes": pvc.spec.access_modes,
            "volumeMode": pvc.spec.volume_mode or "Filesystem",
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": pvc.metadata.namespace,
                "name": pvc.metadata.name,
                "uid": pvc.metadata.uid,
            },  # fmt: skip
        },
    }
