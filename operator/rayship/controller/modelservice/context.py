"""What a ModelService plan carries to its status: the plan's context, and Serve's own view of the
application when the plan asked for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from rayship.controller.modelservice.source import ONE, Resolved


@dataclass(frozen=True)
class ServeState:
    """Serve's own view of the application (from the dashboard's /api/serve/applications/)."""

    status: str = ""  # RUNNING, DEPLOYING, DEPLOY_FAILED, ...
    model_uri: str | None = None  # the model in the args Serve deploys (`deployed_model_uri`)
    problem: str | None = None  # why it could not be read
    models: dict[str, str] | None = None  # `args.models` (name -> URI) of the config Serve deploys

    @property
    def deployed(self) -> dict[str, str] | None:
        """What the config Serve deploys serves, as a service's models (`ONE` for modelUri)."""
        if self.models is not None:
            return self.models
        return {ONE: self.model_uri} if self.model_uri else None


@dataclass(frozen=True)
class ServiceContext:
    """What `status()` needs from the plan (the `context` of a ModelService `Plan`)."""

    resolution: Resolved | None
    invalid: str | None
    url: str | None
    desired: dict[str, str] | None  # the models to serve (ONE: spec.model), None while any is unresolved
    blocked: str | None = None  # a RayService of that name exists and is not ours
    rayservice: str = ""
    incremental: bool = False  # NewClusterWithIncrementalUpgrade: no `<rayservice>-serve-svc`
    application: str = ""  # the Serve application's name
    # status.modelURI (as {ONE: uri}) or status.models[].uri as read: what Serve was last confirmed to serve
    served: dict[str, str] = field(default_factory=dict)
    serve: ServeState | None = None  # Serve's own answer, when it was asked (`serve_probe`)
    multi: bool = False  # spec.models (status.models) rather than spec.model (status.modelURI)
    namespace: str = ""  # the service's (a TrainingJob it names is looked for there)

    @property
    def desired_uri(self) -> str | None:
        """spec.model's resolved URI."""
        return (self.desired or {}).get(ONE)
