"""ModelArts v1 dialect: POST /v1/{project_id}/training-jobs (seed 002), translated to the v2 create.

A v1 body becomes a v2 `JobCreate` and goes through the one submission use case (`usecases.Submitter.submit`), so
validation, naming rules and the bus event are the v2 ones. Fields that mean nothing here (OBS datasets, images,
pools, specs) are accepted and reported back: in the response's `ignored_fields` and in the job's `MODELARTS_V1_IGNORED`
environment. A key seed 002 does not define, at any level, is refused (406001 naming it); lists and strings are
bounded.
"""

import json
import posixpath
from shlex import quote
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from starlette.exceptions import HTTPException

from shared.jobs import JobCreate, no_null_bytes
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import ProjectId, use_cases
from services.submitter.errors import ApiError
from services.submitter.refusals import Invalid, Refused
from services.submitter.usecases import SubmitJob

IGNORED_ENV = "MODELARTS_V1_IGNORED"
# ModelArts v1 job statuses ("Job Statuses" table): INIT, WAITING, RUNNING, KILLING, COMPLETED, FAILED, KILLED, LOST.
V1_STATUS = {
    "Creating": 1,
    "Pending": 7,
    "Running": 8,
    "Terminating": 9,
    "Completed": 10,
    "Failed": 11,
    "Terminated": 12,
    "Abnormal": 14,
}
# Where a v2 field came from in the v1 body, so a validation error names the field the caller sent.
V1_FIELD = {
    "metadata.name": "job_name",
    "metadata.description": "job_desc",
    "metadata.workspace_id": "workspace_id",
    "spec.resource.node_count": "config.worker_server_num",
    "algorithm.command": "config.user_command",
    "algorithm.parameters": "config.parameter",
    "algorithm.environments": "config.parameter",
}


class V1Model(BaseModel):
    """Seed 002's fields and nothing else, at every level; no null byte in any string."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _no_null_bytes(cls, value):
        return no_null_bytes(value)


V1Text = Annotated[str, Field(max_length=4096)]
V1Id = Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)]


class V1Parameter(V1Model):
    label: str | None = Field(None, max_length=256, description="Parameter name.")
    value: str | int | float | bool | None = Field(
        None, description="Parameter value (a number or a boolean is taken as its text)."
    )

    @field_validator("value")
    @classmethod
    def _short(cls, value):
        if isinstance(value, str) and len(value) > 4096:
            raise ValueError("is longer than 4096 characters")
        return value


class V1DataSource(V1Model):
    """Table 4 of seed 002."""

    dataset_id: V1Text | None = None
    dataset_version: V1Text | None = None
    type: V1Text | None = None
    data_url: V1Text | None = None


class V1Nfs(V1Model):
    """Table 6 of seed 002."""

    id: V1Text
    src_path: V1Text
    dest_path: V1Text
    read_only: Annotated[bool, Strict()] = False


class V1HostPath(V1Model):
    """Table 7 of seed 002."""

    src_path: V1Text
    dest_path: V1Text
    read_only: Annotated[bool, Strict()] = False


class V1Volume(V1Model):
    """Table 5 of seed 002."""

    nfs: V1Nfs | None = None
    host_path: V1HostPath | None = None


class V1Config(V1Model):
    worker_server_num: Annotated[int, Strict()] = Field(
        description="Number of workers: becomes spec.resource.node_count."
    )
    app_url: V1Text | None = Field(None, description="Code directory; the boot file runs from it.")
    boot_file_url: V1Text | None = Field(None, description="Boot file, run with python3 (relative to app_url).")
    parameter: list[V1Parameter] = Field(
        default_factory=list, max_length=100, description="Becomes --label=value and parameters."
    )
    data_url: V1Text | None = Field(None, description="Passed as --data_url and DATA_URL.")
    train_url: V1Text | None = Field(None, description="Passed as --train_url and TRAIN_URL.")
    user_command: str | None = Field(
        None, max_length=8192, description="Run as the job's command instead of the boot file."
    )
    dataset_id: V1Text | None = None
    dataset_version_id: V1Text | None = None
    data_source: list[V1DataSource] | None = Field(None, max_length=20)
    spec_id: V1Id | None = None
    pool_id: V1Text | None = None
    engine_id: V1Id | None = None
    model_id: V1Id | None = None
    log_url: V1Text | None = None
    user_image_url: V1Text | None = None
    create_version: Annotated[bool, Strict()] | None = None
    volumes: list[V1Volume] | None = Field(None, max_length=20)


class V1JobCreate(V1Model):
    """The body of POST /v1/{project_id}/training-jobs (ModelArts v1, seed 002): unknown fields are refused."""

    job_name: str = Field(max_length=256)
    job_desc: str = Field("", max_length=4096)
    workspace_id: str = Field("0", max_length=256)
    config: V1Config


class V1Created(BaseModel):
    is_success: bool = True
    job_id: str
    job_name: str
    status: int = Field(description="ModelArts v1 status code (1 INIT, 7 WAITING, 8 RUNNING, ...).")
    create_time: int = Field(description="Milliseconds since the epoch.")
    version_id: int = 1
    version_name: str = "V0001"
    ignored_fields: list[str] = Field(description="Fields accepted but without effect here.")


class V1Error(BaseModel):
    is_success: bool = False
    error_code: str
    error_msg: str
    error_message: str = Field(description="The same text, under ModelArts' own field name.")


def v1_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=status, content=V1Error(error_code=code, error_msg=message, error_message=message).model_dump()
    )


class V1Route(APIRoute):
    """Answers every failure in the v1 shape (`is_success: false`) instead of the v2 one."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def v1_handler(request: Request):
            try:
                return await handler(request)
            except ApiError as exc:
                return v1_error(exc.status, exc.code, exc.message)
            except Refused as exc:
                status, code, message, _ = errors.described(exc)
                return v1_error(status, code, message)
            except (RequestValidationError, HTTPException) as exc:
                answer = (
                    errors.validation_error(exc) if isinstance(exc, RequestValidationError) else errors.http_error(exc)
                )
                body = json.loads(bytes(answer.body))
                return v1_error(answer.status_code, body["error_code"], body["error_msg"])

        return v1_handler


router = APIRouter(prefix="/v1/{project_id}/training-jobs", tags=["ModelArts v1 dialect"], route_class=V1Route)


def ignored_fields(body: V1JobCreate) -> dict[str, Any]:
    """Every field present in the body that has no effect here, by its v1 path."""
    used = {"worker_server_num", "app_url", "boot_file_url", "parameter", "data_url", "train_url", "user_command"}
    ignored = {f"config.{k}": v for k, v in body.config.model_dump(exclude_unset=True).items() if k not in used}
    if body.config.user_command and body.config.boot_file_url:
        ignored["config.boot_file_url"] = body.config.boot_file_url  # user_command wins, as in ModelArts
    return dict(sorted(ignored.items()))


def command(config: V1Config, args: list[str]) -> str:
    """The shell command: user_command as given, else python3 on the boot file with ModelArts' --key=value args."""
    if config.user_command:
        return (
            f"{config.user_command}\ncode=$?\n[ $code -eq 127 ] && echo 'trainmaster (v1 dialect): "
            f"config.user_command could not start: it runs on the node itself, without config.user_image_url' >&2"
            "\nexit $code"
        )
    if not config.boot_file_url:
        raise Invalid("config.boot_file_url", "needed unless config.user_command is given")
    app = config.app_url or ""
    boot = posixpath.join(app, config.boot_file_url)
    missing = (
        f"trainmaster (v1 dialect): boot file {boot} (config.boot_file_url) does not exist on this node; "
        "OBS paths are not fetched, give a path on the node"
    )
    enter = f"cd {quote(app)} || exit 2\n" if app else ""
    return (
        f"if [ ! -f {quote(boot)} ]; then echo {quote(missing)} >&2; exit 2; fi\n"
        f"{enter}exec python3 {quote(boot)} {' '.join(quote(a) for a in args)}"
    ).rstrip()


def translate(body: V1JobCreate) -> tuple[dict[str, Any], list[str]]:
    """The v2 create body of a v1 one, and the v1 fields it ignores."""
    config = body.config
    parameters = [(p.label, "" if p.value is None else str(p.value)) for p in config.parameter if p.label]
    urls = [(k, v) for k, v in (("data_url", config.data_url), ("train_url", config.train_url)) if v]
    ignored = ignored_fields(body)
    unlabeled = [p.model_dump() for p in config.parameter if not p.label]
    if unlabeled:
        ignored["config.parameter[no label]"] = unlabeled
    environments = {k.upper(): v for k, v in urls}
    if ignored:
        environments[IGNORED_ENV] = json.dumps(ignored, sort_keys=True, default=str)[:8192]
    description = body.job_desc
    note = f" [v1 ignored: {', '.join(ignored)}]"
    if ignored and len(description) + len(note) <= 256:
        description += note
    v2 = {
        "kind": "job",
        "metadata": {"name": body.job_name, "description": description, "workspace_id": body.workspace_id},
        "algorithm": {
            "command": command(config, [f"--{k}={v}" for k, v in urls + parameters]),
            "parameters": [{"name": k, "value": v} for k, v in parameters],
            "environments": environments,
        },
        "spec": {"resource": {"node_count": config.worker_server_num}},
    }
    return v2, list(ignored)


def v2_body(payload: dict[str, Any]) -> JobCreate:
    """Validate the translated body with the v2 model; errors name the v1 field they came from."""
    try:
        return JobCreate.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            path = errors.field_path(tuple(error.get("loc", ())))
            v1 = next((V1_FIELD[p] for p in V1_FIELD if path.startswith(p)), path)
            problems.append({**error, "loc": ("body", *v1.split("."))})
        raise RequestValidationError(problems) from None


@router.post(
    "",
    response_model=V1Created,
    summary="Create a training job (ModelArts v1 body)",
    responses={400: {"model": V1Error}, 401: {"model": V1Error}, 409: {"model": V1Error}},
)
async def create_v1(
    project_id: ProjectId, body: V1JobCreate, request: Request, principal: Principal = Depends(authenticate)
) -> V1Created:
    payload, ignored = translate(body)
    try:
        v2 = v2_body(payload)
        principal.require_project(project_id)
        job = await use_cases(request).submit(SubmitJob(project_id=project_id, user_name=principal.user_name, body=v2))
    except Invalid as exc:  # name the v1 field the caller sent, as validation errors do
        if exc.field in V1_FIELD:
            raise Invalid(V1_FIELD[exc.field], exc.detail) from None
        raise
    return V1Created(
        job_id=job.metadata.id,
        job_name=job.metadata.name,
        status=V1_STATUS[job.status.phase.value],
        create_time=job.metadata.create_time,
        ignored_fields=ignored,
    )
