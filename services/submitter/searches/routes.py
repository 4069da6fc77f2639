"""/v2/{project_id}/searches: create, list, inspect and stop hyperparameter searches."""

import logging
import secrets
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from shared.clock import utcnow
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import JobId, ProjectId, use_cases
from services.submitter.refusals import Invalid, NameTaken, NotFound, SearchesFull, WrongPhase
from services.submitter.searches.models import (
    Best,
    SearchAction,
    SearchCreate,
    SearchList,
    SearchMetadata,
    SearchStatus,
    SearchView,
    TrialView,
    unfit,
)
from services.submitter.searches.store import SearchNameTaken, SearchStore
from services.submitter.views import SECRET_VALUES, _ms, carried

router = APIRouter(prefix="/v2/{project_id}/searches", tags=["searches"])
log = logging.getLogger(__name__)


def store(request: Request) -> SearchStore:
    return request.app.state.searches


def render(doc: dict[str, Any]) -> SearchView:
    best = doc.get("best")
    return SearchView(
        metadata=SearchMetadata(
            id=doc["_id"],
            name=doc["name"],
            project_id=doc["project_id"],
            user_name=doc["user_name"],
            create_time=_ms(doc["create_time"]),
        ),
        spec={**doc["spec"], "seed": doc["seed"]},
        status=SearchStatus(
            phase=doc["phase"],
            best=Best(**best) if best else None,
            reason=doc.get("reason", ""),
            gpu_hours=doc.get("gpu_hours", 0.0),
            dollars=doc.get("dollars", 0.0),
            message=doc.get("message", ""),
        ),
        trials=[TrialView(**{k: t.get(k) for k in TrialView.model_fields if k in t}) for t in doc["trials"]],
    )


async def load(request: Request, principal: Principal, project_id: str, search_id: str) -> dict[str, Any]:
    doc = await store(request).get(project_id, search_id)
    if doc is None or not (principal.is_admin or project_id in principal.projects):
        raise NotFound(search_id, what="search")
    return doc


@router.post("", status_code=201, response_model=SearchView, summary="Start a hyperparameter search")
async def create_search(
    project_id: ProjectId, body: SearchCreate, request: Request, principal: Principal = Depends(authenticate)
) -> SearchView:
    principal.require_project(project_id)
    if (refused := unfit(body)) is not None:
        raise Invalid(*refused)
    searches = store(request)
    # checked before the insert, not with it: concurrent creations may overshoot the cap by their number
    if (running := await searches.running_in(project_id)) >= searches.max_running_per_project:
        raise SearchesFull(project_id=project_id, running=running, cap=searches.max_running_per_project)
    submitter = use_cases(request)
    template = await submitter.prepare(project_id=project_id, body=body.template)  # refused storage, flavors
    search_id = "s-" + uuid.uuid4().hex[:12]
    # its secrets sealed for it beside its record (never rendered), its template holding their names
    values = template.algorithm.secrets
    sealed = submitter.sealer.seal(search_id, values) if values else None
    template = template.model_copy(update={"algorithm": carried(template.algorithm)})
    body = body.model_copy(update={"template": template})
    dollars = 0.0
    if body.max_dollars is not None:  # the job's price as admission computes it, per hour of a trial
        dollars = await submitter.price_per_hour(template, project_id=project_id, user_name=principal.user_name)
    doc: dict[str, Any] = {
        "_id": search_id,
        "project_id": project_id,
        "name": body.name,
        "user_name": principal.user_name,
        "create_time": utcnow(),
        "spec": body.model_dump(mode="json"),
        "seed": body.seed if body.seed is not None else secrets.randbelow(2**31),
        "phase": "Running",
        "trials": [],
        "best": None,
        "reason": "",
        "message": "",
        "gpu_hours": 0.0,
        "dollars": 0.0,
        "dollars_per_hour": dollars,
        **({SECRET_VALUES: sealed} if sealed else {}),  # opened for each trial's job (`trials`), removed at its end
    }
    doc["spec"].pop("seed", None)
    try:
        await searches.insert(doc)
    except SearchNameTaken:
        raise NameTaken(body.name, project_id=project_id, what="search") from None
    return render({**doc, "version": 0})


@router.get("", response_model=SearchList, summary="List searches")
async def list_searches(
    project_id: ProjectId,
    request: Request,
    principal: Principal = Depends(authenticate),
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SearchList:
    principal.require_project(project_id)
    total, docs = await store(request).page(project_id, offset=offset, limit=limit)
    return SearchList(total=total, items=[render(d) for d in docs])


@router.get("/{search_id}", response_model=SearchView, summary="Show a search: its trials and the best so far")
async def get_search(
    project_id: ProjectId, search_id: JobId, request: Request, principal: Principal = Depends(authenticate)
) -> SearchView:
    return render(await load(request, principal, project_id, search_id))


@router.post(
    "/{search_id}/actions",
    status_code=202,
    response_model=SearchView,
    summary="Stop a search: no new trial starts, running trials are terminated",
)
async def act(
    project_id: ProjectId,
    search_id: JobId,
    action: SearchAction,
    request: Request,
    principal: Principal = Depends(authenticate),
) -> SearchView:
    doc = await load(request, principal, project_id, search_id)
    if not await store(request).request_stop(project_id, search_id, by=principal.user_name):
        raise WrongPhase(search_id, phase=doc["phase"], done="stopped", what="search")
    return render(await load(request, principal, project_id, search_id))
