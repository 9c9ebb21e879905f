"""
Fixtures for running kopf for real against the Kubernetes API emulator (``tests/emulator.py``).

* ``emulator``: a fresh emulator per test, serving :data:`RESOURCES` (plus the built-ins).
* ``kube_api``: an official ``kubernetes`` client configured from the emulator's kubeconfig.
* ``run_kopf``: ``with run_kopf("module", *extra_args) as runner:`` runs ``kopf run`` in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

import kopf
import kubernetes
import pytest
from kopf.testing import KopfRunner

from tests.emulator import EmulatorHandle, Resource, running_emulator

#: The custom resources served by the ``emulator`` fixture, by plural name (importable by tests).
RESOURCES: dict[str, Resource] = {
    "trainingjobs": Resource("rayship.dev", "v1alpha1", "trainingjobs", "TrainingJob"),
    "modelservices": Resource("rayship.dev", "v1alpha1", "modelservices", "ModelService"),
    "rayjobs": Resource("ray.io", "v1", "rayjobs", "RayJob"),
    "rayservices": Resource("ray.io", "v1", "rayservices", "RayService"),
    "serviceaccounts": Resource("", "v1", "serviceaccounts", "ServiceAccount", status_subresource=False),
    "roles": Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", status_subresource=False),
    "rolebindings": Resource(
        "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", status_subresource=False
    ),
}

_NAMESPACE_OPTIONS = ("-n", "--namespace", "-A", "--all-namespaces")


@pytest.fixture
def emulator() -> Iterator[EmulatorHandle]:
    """A running Kubernetes API emulator with the rayship and KubeRay resources, and the "default" namespace."""
    with running_emulator(list(RESOURCES.values())) as handle:
        yield handle


@pytest.fixture
def kube_api(emulator: EmulatorHandle) -> Iterator[kubernetes.client.ApiClient]:
    """An official client for the emulator, configured from its kubeconfig (not from the global defaults)."""
    with kubernetes.config.new_client_from_config(config_file=str(emulator.kubeconfig_path)) as api_client:
        yield api_client


@contextlib.contextmanager
def _own_import_of(module: str) -> Iterator[None]:
    """
    Let kopf import ``module`` (its whole top-level package) afresh, then restore the test's modules.

    Kopf's decorators register handlers at import time; importing afresh puts them into the runner's
    own registry, so handlers of modules run by earlier tests never leak into this run.
    """
    package = module.split(".")[0]

    def ours() -> list[str]:
        return [name for name in sys.modules if name == package or name.startswith(f"{package}.")]

    saved = {name: sys.modules.pop(name) for name in ours()}
    try:
        yield
    finally:
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)


@contextlib.contextmanager
def _restored_logging() -> Iterator[None]:
    """Undo kopf's logging setup (a root handler writing to the runner's stream, the levels) after a run."""
    root, asyncio_logger = logging.getLogger(), logging.getLogger("asyncio")
    level, handlers = root.level, root.handlers[:]
    asyncio_propagate, asyncio_handlers = asyncio_logger.propagate, asyncio_logger.handlers[:]
    try:
        yield
    finally:
        root.handlers[:], asyncio_logger.handlers[:] = handlers, asyncio_handlers
        asyncio_logger.propagate = asyncio_propagate
        root.setLevel(level)


@pytest.fixture
def run_kopf(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., contextlib.AbstractContextManager[KopfRunner]]:
    """
    ``with run_kopf("module", *extra_args) as runner:`` runs ``kopf run --standalone -m module`` against
    the emulator in a thread (``--all-namespaces`` unless the extra args choose namespaces).

    On exit, it stops kopf and fails unless kopf exited cleanly, showing kopf's output.
    The runner's ``.output`` is available after the block.
    """

    @contextlib.contextmanager
    def run(module: str, *extra_args: str) -> Iterator[KopfRunner]:
        scope = (
            [] if any(arg.split("=")[0] in _NAMESPACE_OPTIONS for arg in extra_args) else ["--all-namespaces"]
        )
        args = ["run", "--standalone", "--verbose", *scope, "-m", module, *extra_args]
        registry = kopf.OperatorRegistry()  # kopf's default one would keep handlers from earlier runs
        kopf.on.login(registry=registry)(kopf.login_via_client)  # as kopf's default registry does
        default_registry = kopf.get_default_registry()  # `kopf run` replaces it with ours
        default_config = kubernetes.client.Configuration.get_default_copy()  # kopf's login replaces it
        with monkeypatch.context() as patches, _own_import_of(module), _restored_logging():
            # kopf logs in via the client's kubeconfig loading, which read $KUBECONFIG at import time.
            patches.setenv("KUBECONFIG", str(emulator.kubeconfig_path))
            patches.setattr(
                kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(emulator.kubeconfig_path)
            )
            runner = KopfRunner(args, registry=registry, reraise=False, timeout=30)
            first_request = len(emulator.requests)
            try:
                with runner:
                    yield runner
            except BaseException as e:
                if runner.future.done() and runner.future.exception() is None:
                    e.add_note(f"kopf's output:\n{runner.output}")
                raise
            finally:
                kopf.set_default_registry(default_registry)
                kubernetes.client.Configuration.set_default(default_config)
        if runner.exception is not None:
            raise AssertionError(f"kopf failed; its output:\n{runner.output}") from runner.exception
        assert runner.exit_code == 0, f"kopf exited with {runner.exit_code}; its output:\n{runner.output}"
        # Every request made while the operator ran must be granted by the chart's RBAC rules.
        from rayship.rbac import OPERATOR_RULES, allows

        made = emulator.requests[first_request:] if module == "rayship.handlers" else []
        denied = {r for r in made if not allows(OPERATOR_RULES, r.verb, r.group, r.resource, r.subresource)}
        assert not denied, f"requests not granted by rayship.rbac.OPERATOR_RULES: {sorted(denied)}"

    return run
