"""/v2/{project_id}/training-jobs: create, list, inspect, act on, delete, read output."""
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from shared.bus import RPC_METRICS, RPC_MIGRATE, RPC_TERMINATE, publish
from shared.clock import utcnow
from shared.events import JobDeleted, JobMigrateRequested, JobTerminateRequested
from shared.jobs import FINISHED, JobCreate, Phase
from shared.rpc import MetricsQuery, MetricsReport
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.commands import send_command
from services.submitter.errors import ApiError
from services.submitter.logs import MAX_PAGE_LINES, PAGE_LINES, follow, read_page
from services.submitter.repository import Repository
from services.submitter.rpc import ask
from services.submitter.submission import estimate, repo, submit_job
from services.submitter.views import Job, JobId, JobList, ProjectId, render

router = APIRouter(prefix="/v2/{project_id}/training-jobs", tags=["training jobs"])
FINISHED_NAMES = [p.value for p in FINISHED]


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_type: Literal["terminate", "migrate"]


async def load(repo: Repository, principal: Principal, project_id: ProjectId, job_id: str) -> dict:
    """The job, if the caller may see it; another project's job does not exist for them."""
    doc = await repo.get(project_id, job_id)
    if doc is None or not (principal.is_admin or project_id in principal.projects):
        raise ApiError(404, errors.JOB_NOT_FOUND, f"job {job_id} does not exist")
    return doc


@router.post("", status_code=201, response_model=Job,
             summary="Create a training job (or, with dry_run=true, estimate where it would run and its cost)")
async def create_job(project_id: ProjectId, body: JobCreate, request: Request,
                     principal: Principal = Depends(authenticate),
                     dry_run: Annotated[bool, Query(description="Validate and estimate; create nothing.")] = False):
    principal.require_project(project_id)
    if dry_run:
        return JSONResponse(await estimate(request, project_id=project_id, user_name=principal.user_name, body=body))
    return await submit_job(request, project_id=project_id, user_name=principal.user_name, body=body)


@router.get("", response_model=JobList, summary="List training jobs")
async def list_jobs(
    project_id: ProjectId, request: Request, principal: Principal = Depends(authenticate),
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    phase: Annotated[list[Phase] | None, Query(description="Only jobs in these phases.")] = None,
) -> JobList:
    principal.require_project(project_id)
    total, docs = await repo(request).page(project_id, phases=[p.value for p in phase or []], offset=offset,
                                           limit=limit)
    now = utcnow()
    return JobList(total=total, count=len(docs), offset=offset, limit=limit, items=[render(d, now=now) for d in docs])


@router.get("/{job_id}", response_model=Job, summary="Show a training job")
async def get_job(project_id: ProjectId, job_id: JobId, request: Request,
                  principal: Principal = Depends(authenticate)) -> Job:
    return render(await load(repo(request), principal, project_id, job_id))


@router.post("/{job_id}/actions", status_code=202, response_model=Job,
             summary="Terminate a training job, or migrate it (snapshot now, continue on another node)")
async def act(project_id: ProjectId, job_id: JobId, action: Action, request: Request,
              principal: Principal = Depends(authenticate)) -> Job:
    repository = repo(request)
    doc = await load(repository, principal, project_id, job_id)
    phase = doc["status"]["phase"]
    if phase in FINISHED_NAMES or (action.action_type == "migrate" and phase != "Running"):
        raise ApiError(409, errors.JOB_STATUS, f"job {job_id} is {phase} and cannot be {action.action_type}d"
                                               + (" (only Running jobs move)" if action.action_type == "migrate" else ""))
    if action.action_type == "terminate":
        command, subject = JobTerminateRequested(event_id=f"{job_id}:terminate:{uuid.uuid4().hex}", job_id=job_id,
                                                 requested_by=principal.user_name), RPC_TERMINATE
    else:
        command, subject = JobMigrateRequested(event_id=f"{job_id}:migrate:{uuid.uuid4().hex}", job_id=job_id,
                                               requested_by=principal.user_name,
                                               attempt=doc["status"].get("attempt")), RPC_MIGRATE
    await send_command(request.app.state.broker, repository, command, subject)
    return render(await load(repository, principal, project_id, job_id))


@router.delete("/{job_id}", status_code=204, summary="Delete a finished training job")
async def delete_job(project_id: ProjectId, job_id: JobId, request: Request,
                     principal: Principal = Depends(authenticate)) -> Response:
    repository = repo(request)
    doc = await load(repository, principal, project_id, job_id)
    if doc["status"]["phase"] not in FINISHED_NAMES:
        raise ApiError(409, errors.JOB_CANNOT_DELETE, f"job {job_id} is {doc['status']['phase']}: only Completed, "
                                                      "Failed or Terminated jobs can be deleted; terminate it first")
    # Announced first (a finished job stays finished): a failed publish deletes nothing and the call can be
    # repeated, where a delete first would lose the announcement with the record that could carry it.
    await publish(request.app.state.broker, JobDeleted(event_id=f"{job_id}:deleted", job_id=job_id))
    await repository.delete(job_id, finished=FINISHED_NAMES)
    return Response(status_code=204)


@router.get("/{job_id}/metrics", response_model=MetricsReport, summary="A training job's metric curves",
            description="Every metric's whole curve; a longer one is thinned to `max_points` (first and last kept, "
                        "each slice between by its lowest and highest value).")
async def metrics(project_id: ProjectId, job_id: JobId, request: Request, principal: Principal = Depends(authenticate),
                  max_points: Annotated[int, Query(ge=1, le=100_000)] = 2000) -> MetricsReport:
    await load(repo(request), principal, project_id, job_id)
    return MetricsReport.model_validate(await ask(request, RPC_METRICS, MetricsQuery(job_id=job_id,
                                                                                     max_points=max_points,
                                                                                     whole=True)))


class Placement(BaseModel):
    attempt: int
    nodes: dict[str, str] = Field(description="Each rank's node, as placement decided it.")
    why: str = Field("", description="The options placement weighed and the rule that chose (empty: not said).")


@router.get("/{job_id}/placements", response_model=list[Placement], summary="Where each attempt was placed, and why")
async def placements(project_id: ProjectId, job_id: JobId, request: Request,
                     principal: Principal = Depends(authenticate)) -> list[Placement]:
    repository = repo(request)
    await load(repository, principal, project_id, job_id)
    if repository.origins is None:
        return []
    docs = [d async for d in repository.origins.placements.find({"job_id": job_id})]
    return [Placement(attempt=d["attempt"], nodes=d["nodes"], why=d.get("why", "")) for d in
            sorted(docs, key=lambda d: d["attempt"])]


LOG_HEADERS = {"X-Log-Offset": "the first line of this page", "X-Log-Next-Offset": "where the next page starts",
               "X-Log-More": "`true` when lines exist past this page", "X-Log-Dropped": "earliest lines dropped to "
               "keep the job under its stored output cap"}


@router.get("/{job_id}/logs", response_class=PlainTextResponse, summary="Read a training job's output",
            description="A page of output lines, numbered from 0 (the first line the task printed). Headers "
                        "X-Log-Offset, X-Log-Next-Offset, X-Log-More and X-Log-Dropped say where the page is; a page "
                        "ends at `limit` lines or about 1 MB. `follow=true` streams everything until the job ends.",
            responses={200: {"headers": {k: {"description": v, "schema": {"type": "string"}}
                                         for k, v in LOG_HEADERS.items()}}})
async def logs(project_id: ProjectId, job_id: JobId, request: Request, principal: Principal = Depends(authenticate),
               follow_: Annotated[bool, Query(alias="follow")] = False,
               task: Annotated[str, Query(pattern=r"^worker-\d{1,3}$")] = "worker-0",
               offset: Annotated[int, Query(ge=0, le=10**12, description="First line (from 0).")] = 0,
               limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LINES, description="Lines in the page.")] = PAGE_LINES):
    repository = repo(request)
    await load(repository, principal, project_id, job_id)
    rank = int(task.removeprefix("worker-"))
    if not follow_:
        page = await read_page(repository, job_id, rank=rank, offset=offset, limit=limit)
        return PlainTextResponse(page.text, headers={
            "X-Log-Offset": str(page.offset), "X-Log-Next-Offset": str(page.next_offset),
            "X-Log-More": "true" if page.more else "false", "X-Log-Dropped": str(page.dropped)})
    return StreamingResponse(follow(repository, job_id, rank=rank, disconnected=request.is_disconnected),
                             media_type="text/plain; charset=utf-8")
