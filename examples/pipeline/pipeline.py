"""A two-stage Ray Serve application for a rayship ModelService: Preprocess -> Model.

`Preprocess` (the ingress, HTTP) standardizes each raw feature row with the `mean` and `scale` from the
application's args, then calls `Model` through a DeploymentHandle; `Model` loads the model rayship
resolved (`args.modelUri`: model.uri, or the TrainingJob's export) with `rayship_workloads.models`.
The two scale separately (spec.deployments.Preprocess / .Model).

    POST /  {"instances": [[raw features], ...]}  ->  {"predictions": [[...], ...]}
"""

import torch
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse

from rayship_workloads import models


class PipelineArgs(BaseModel):
    """The application's args (spec.application.args, plus modelUri from rayship)."""

    model_config = ConfigDict(extra="forbid")
    modelUri: str = Field(min_length=1)  # noqa: N815  (rayship's arg name)
    mean: list[float] = Field(min_length=1)
    scale: list[float] = Field(min_length=1)


@serve.deployment
class Model:
    def __init__(self, model_uri: str) -> None:
        self.model, self.manifest = models.load_model(model_uri)

    async def __call__(self, rows: list[list[float]]) -> list[list[float]]:
        with torch.no_grad():
            return self.model(torch.tensor(rows)).tolist()  # type: ignore[no-any-return]


@serve.deployment
class Preprocess:
    def __init__(self, model: DeploymentHandle, mean: list[float], scale: list[float]) -> None:
        self.model, self.mean, self.scale = model, mean, scale

    async def __call__(self, request: Request) -> JSONResponse:
        body = await request.json()
        rows = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(rows, list) or not all(
            isinstance(row, list) and len(row) == len(self.mean) for row in rows
        ):
            return JSONResponse(
                {"error": f'expected {{"instances": [[{len(self.mean)} numbers], ...]}}'}, status_code=400
            )
        standardized = [[(x - m) / s for x, m, s in zip(row, self.mean, self.scale, strict=True)] for row in rows]
        return JSONResponse({"predictions": await self.model.remote(standardized)})


def app_builder(args: dict) -> Application:
    config = PipelineArgs.model_validate(args)
    return Preprocess.bind(Model.bind(config.modelUri), config.mean, config.scale)
