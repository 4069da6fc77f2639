"""/v2/{project_id}/training-jobs: create, list, inspect, act on, delete, read output. Thin: who may see the job is
decided here, everything else by the use cases (`usecases.Submitter`)."""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from shared.clock import utcnow
from shared.jobs import JobCreate, Phase
from shared.rpc import MetricsReport
from services.submitter import audit
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import JobId, ProjectId, use_cases
from services.submitter.logs import MAX_PAGE_LINES, PAGE_LINES, follow, read_page
from services.submitter.refusals import NotFound, WrongPhase
from services.submitter.usecases import SubmitJob
from services.submitter.views import Job, JobList, render

router = APIRouter(prefix="/v2/{project_id}/training-jobs", tags=["training jobs"])


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_type: Literal["terminate", "migrate"]


def visible(principal: Principal, project_id: str, job_id: str) -> None:
    """Another project's job does not exist for the caller."""
    if not (principal.is_admin or project_id in principal.projects):
        raise NotFound(job_id)


async def load(request: Request, principal: Principal, project_id: ProjectId, job_id: str) -> dict:
    """The job, if the caller may see it."""
    visible(principal, project_id, job_id)
    return await use_cases(request).stored(project_id, job_id)


@router.post(
    "",
    status_code=201,
    response_model=Job,
    summary="Create a training job (or, with dry_run=true, estimate where it would run and its cost)",
)
async def create_job(
    project_id: ProjectId,
    body: JobCreate,
    request: Request,
    principal: Principal = Depends(authenticate),
    dry_run: Annotated[bool, Query(description="Validate and estimate; create nothing.")] = False,
):
    principal.require_project(project_id)
    if dry_run:
        return JSONResponse(
            await use_cases(request).dry_run(project_id=project_id, user_name=principal.user_name, body=body)
        )
    return await use_cases(request).submit(
        SubmitJob(project_id=project_id, user_name=principal.user_name, body=body),
        before_store=lambda: audit.recorded(request),  # its audit record, begun before the route, stored by then
    )


@router.get("", response_model=JobList, summary="List training jobs")
async def list_jobs(
    project_id: ProjectId,
    request: Request,
    principal: Principal = Depends(authenticate),
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    phase: Annotated[list[Phase] | None, Query(description="Only jobs in these phases.")] = None,
) -> JobList:
    principal.require_project(project_id)
    total, docs = await use_cases(request).repo.page(
        project_id, phases=[p.value for p in phase or []], offset=offset, limit=limit
    )
    now = utcnow()
    return JobList(total=total, count=len(docs), offset=offset, limit=limit, items=[render(d, now=now) for d in docs])


@router.get("/{job_id}", response_model=Job, summary="Show a training job")
async def get_job(
    project_id: ProjectId, job_id: JobId, request: Request, principal: Principal = Depends(authenticate)
) -> Job:
    return render(await load(request, principal, project_id, job_id))


@router.post(
    "/{job_id}/actions",
    status_code=202,
    response_model=Job,
    summary="Terminate a training job, or migrate it (snapshot now, continue on another node)",
)
async def act(
    project_id: ProjectId, job_id: JobId, action: Action, request: Request, principal: Principal = Depends(authenticate)
) -> Job:
    visible(principal, project_id, job_id)
    return await use_cases(request).act(
        project_id=project_id, job_id=job_id, action=action.action_type, requested_by=principal.user_name
    )


@router.delete("/{job_id}", status_code=204, summary="Delete a finished training job")
async def delete_job(
    project_id: ProjectId, job_id: JobId, request: Request, principal: Principal = Depends(authenticate)
) -> Response:
    visible(principal, project_id, job_id)

    async def not_a_running_search_trial(doc: dict) -> None:  # its hours count against the search's budget
        search_id = doc.get("search_id")
        search = await request.app.state.searches.get(project_id, search_id) if search_id else None
        if search is not None and search["phase"] == "Running":
            running = f"a trial of search {search_id}, which runs"
            raise WrongPhase(job_id, phase=running, done="deleted", hint="; stop the search first")

    await use_cases(request).delete(project_id=project_id, job_id=job_id, check=not_a_running_search_trial)
    return Response(status_code=204)


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsReport,
    summary="A training job's metric curves",
    description="Every metric's whole curve; a longer one is thinned to `max_points` (first and last kept, "
    "each slice between by its lowest and highest value).",
)
async def metrics(
    project_id: ProjectId,
    job_id: JobId,
    request: Request,
    principal: Principal = Depends(authenticate),
    max_points: Annotated[int, Query(ge=1, le=100_000)] = 2000,
) -> MetricsReport:
    await load(request, principal, project_id, job_id)
    return await use_cases(request).metrics(job_id, max_points=max_points, whole=True)


class Placement(BaseModel):
    attempt: int
    nodes: dict[str, str] = Field(description="Each rank's node, as placement decided it.")
    why: str = Field("", description="The options placement weighed and the rule that chose (empty: not said).")


@router.get("/{job_id}/placements", response_model=list[Placement], summary="Where each attempt was placed, and why")
async def placements(
    project_id: ProjectId, job_id: JobId, request: Request, principal: Principal = Depends(authenticate)
) -> list[Placement]:
    await load(request, principal, project_id, job_id)
    docs = await use_cases(request).repo.placements(job_id)
    return [Placement(attempt=d["attempt"], nodes=d["nodes"], why=d.get("why", "")) for d in docs]


LOG_HEADERS = {
    "X-Log-Offset": "the first line of this page",
    "X-Log-Next-Offset": "where the next page starts",
    "X-Log-More": "`true` when lines exist past this page",
    "X-Log-Dropped": "earliest lines dropped to keep the job under its stored output cap",
}


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    summary="Read a training job's output",
    description="A page of output lines, numbered from 0 (the first line the task printed). Headers "
    "X-Log-Offset, X-Log-Next-Offset, X-Log-More and X-Log-Dropped say where the page is; a page "
    "ends at `limit` lines or about 1 MB. `follow=true` streams everything until the job ends.",
    responses={200: {"headers": {k: {"description": v, "schema": {"type": "string"}} for k, v in LOG_HEADERS.items()}}},
)
async def logs(
    project_id: ProjectId,
    job_id: JobId,
    request: Request,
    principal: Principal = Depends(authenticate),
    follow_: Annotated[bool, Query(alias="follow")] = False,
    task: Annotated[str, Query(pattern=r"^worker-\d{1,3}$")] = "worker-0",
    offset: Annotated[int, Query(ge=0, le=10**12, description="First line (from 0).")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LINES, description="Lines in the page.")] = PAGE_LINES,
):
    await load(request, principal, project_id, job_id)
    repository = use_cases(request).repo
    rank = int(task.removeprefix("worker-"))
    if not follow_:
        page = await read_page(repository.output, job_id, rank=rank, offset=offset, limit=limit)
        return PlainTextResponse(
            page.text,
            headers={
                "X-Log-Offset": str(page.offset),
                "X-Log-Next-Offset": str(page.next_offset),
                "X-Log-More": "true" if page.more else "false",
                "X-Log-Dropped": str(page.dropped),
            },
        )
    return StreamingResponse(
        follow(repository, job_id, rank=rank, disconnected=request.is_disconnected),
        media_type="text/plain; charset=utf-8",
    )
