"""`rayship serve`: a ModelService on local Ray, deployed from the very serveConfigV2 a cluster gets.

`modelservice.serve_config` renders the application (the built-in model server, or the ModelService's
own `application` with `args.modelUri`, per-deployment settings, runtime_env); here it gets the model
as resolved on this machine, replicas' resources scaled to this machine (no GPU: `num_gpus` 0; at most
one CPU a replica, said in one line), and a local `runtimeEnv.workingDir` folder (relative to the YAML)
packed as a `file://` zip, which Ray accepts where a cluster takes s3:// or https://. The config is
checked with Ray's `ServeDeploySchema` and deployed the way `serve run config.yaml` deploys one.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rayship import api
from rayship.controller import modelservice
from rayship_workloads import local, models, recipes, storage
from rayship_workloads.serve import MULTIPLEXED_MODEL_HEADER, routes
from rayship_workloads.serve_ingress import serve_ingress_note, shutdown_serve

DEPLOY_TIMEOUT_S = 300.0
LOCAL_MAX_CPUS_PER_REPLICA = 1.0


class DeployFailed(Exception):
    """Serve could not deploy the application (its deployment's own error)."""


def _local_working_dir(folder: str, base_dir: Path, scratch: Path) -> str:
    """A local folder (relative to `base_dir`) packed as a zip Ray takes by `file://` URI."""
    path = (base_dir / folder).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"spec.application.runtimeEnv.workingDir: {path} is not a folder")
    archive = shutil.make_archive(str(scratch / path.name), "zip", root_dir=path.parent, base_dir=path.name)
    return Path(archive).as_uri()


def localize(config: dict[str, Any], *, has_gpu: bool) -> list[str]:
    """Scale the deployments' reserved resources to this machine, in place; what changed, in words."""
    changes: set[str] = set()
    for app in config["applications"]:
        for deployment in app.get("deployments", []):
            options = deployment.get("ray_actor_options") or {}
            if options.get("num_gpus") and not has_gpu:
                options["num_gpus"] = 0
                changes.add("no GPU here: replicas on CPU")
            if options.get("num_cpus", 0) > LOCAL_MAX_CPUS_PER_REPLICA:
                options["num_cpus"] = LOCAL_MAX_CPUS_PER_REPLICA
                changes.add(f"at most {LOCAL_MAX_CPUS_PER_REPLICA:g} CPU a replica")
    return sorted(changes)


def _kinds(model: modelservice.Model) -> set[str]:
    """The data kinds of the models (reading each manifest: a wrong URI fails here, not in a replica)."""
    uris = [model] if isinstance(model, str) else list(model.values())
    return {recipes.get(models.read_manifest(storage.fetch_dir(uri))["recipe"]).data_kind for uri in uris}


def hint(ms: api.ModelService, url: str, model: modelservice.Model) -> str:
    """The startup line: where it serves, and the routes these kinds of model really have (with
    spec.models: the models, picked by the serve_multiplexed_model_id header)."""
    own = ms.spec.application
    if own is not None:
        return f"serving {own.import_path} (model {modelservice.describe(model)}) at {url}"
    listed = ", ".join(
        f"{method} {url.rstrip('/')}{path}" for method, path in (r.split() for r in routes(_kinds(model)))
    )
    if isinstance(model, str):
        return f"serving {model} at {url}  ({listed})"
    return (
        f"serving models {modelservice.describe(model)} at {url}  ({listed}; the {MULTIPLEXED_MODEL_HEADER} "
        "header names the model)"
    )


def _wait_running(name: str, timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        if app is not None and app.status == "RUNNING":
            return
        if app is not None and app.status == "DEPLOY_FAILED":
            failing = [d.message for d in app.deployments.values() if d.message] or [app.message]
            last = next((line for line in reversed(failing[0].strip().splitlines()) if line.strip()), "")
            raise DeployFailed(f"Serve could not deploy {name}: {last or app.status}")
        time.sleep(0.5)
    raise DeployFailed(f"Serve did not run {name} within {timeout_s:.0f} s")


def serve(
    ms: api.ModelService,
    model: modelservice.Model,
    *,
    base_dir: Path,
    port: int,
    block: bool = True,
    timeout_s: float = DEPLOY_TIMEOUT_S,
) -> str:
    """Deploy `ms` serving `model` (its URI, or with spec.models name -> URI) on local Ray at
    127.0.0.1:`port`; with `block`, until Ctrl-C. Returns the base URL."""
    import torch
    from ray.serve._private.api import serve_start  # what `serve run config.yaml` deploys with
    from ray.serve.schema import ServeDeploySchema

    if ms.spec.application is None:
        _kinds(model)  # a wrong URI fails here, not inside a replica
    config = modelservice.serve_config(ms, model)
    changes = localize(config, has_gpu=torch.cuda.is_available())
    scratch = Path(tempfile.mkdtemp(prefix="rayship-serve-"))
    try:
        (app,) = config["applications"]
        folder = (app.get("runtime_env") or {}).get("working_dir")
        if folder and "://" not in folder:
            app["runtime_env"]["working_dir"] = _local_working_dir(folder, base_dir, scratch)
        schema = ServeDeploySchema.model_validate(config)
        if changes:
            print(f"local serve: {'; '.join(changes)}", flush=True)
        local.init_ray(1)
        if note := serve_ingress_note():
            print(f"local serve: {note}", flush=True)
        client = serve_start(http_options={"host": "127.0.0.1", "port": port})
        client.deploy_apps(schema)
        _wait_running(app["name"], timeout_s)
        url = f"http://127.0.0.1:{port}{'' if app['route_prefix'] == '/' else app['route_prefix']}"
        print(hint(ms, url, model), flush=True)
        if block:
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                print("stopping", flush=True)
            finally:
                shutdown_serve()
        return url
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
