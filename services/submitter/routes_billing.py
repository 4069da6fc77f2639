"""Usage and spend reports, quotas and budgets, and the admission check of a new job."""
import csv
import io
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from shared.bus import RPC_ADMIT, RPC_NODES, RPC_QUOTAS, RPC_USAGE
from shared.jobs import JobCreate
from shared.nodes import NodeInfo
from shared.rpc import (AdmitQuery, AdmitReply, GroupBy, ProjectQuotas, Quota, QuotasReply,
                        QuotasRequest, UsageQuery, UsageReport, UsageTotals)
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError

router = APIRouter()
log = logging.getLogger(__name__)
ProjectId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The project.")]
UserName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
RPC_TIMEOUT_S = 5
DEFAULT_DURATION_S = 3600  # a job without expected_duration_s (or max_duration_s) is priced as one hour
DEFAULT_PRICE_PER_HOUR = 4.0  # when no registered node fits the job, or the monitor does not answer
CSV_COLUMNS = [name for name in UsageTotals.model_fields]


async def ask(request: Request, subject: str, payload: Any, *, timeout: float = RPC_TIMEOUT_S) -> Any:
    try:
        reply = await request.app.state.broker.request(payload, subject, timeout=timeout)
        return await reply.decode()
    except Exception as exc:
        raise ApiError(503, errors.SERVICE_UNAVAILABLE, f"{subject.split('.')[2]} service did not answer: {exc!r}")


# Usage -----------------------------------------------------------------------------------------------------------


def to_csv(report: UsageReport) -> str:
    """One line per group, then the total (key `(total)`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[report.group_by, *CSV_COLUMNS[1:]], lineterminator="\n")
    writer.writeheader()
    for row in [*report.groups, report.total.model_copy(update={"key": "(total)"})]:
        data = row.model_dump()
        writer.writerow({report.group_by: data.pop("key"), **{k: round(v, 6) if isinstance(v, float) else v
                                                              for k, v in data.items()}})
    return out.getvalue()


@router.get("/v2/{project_id}/usage", response_model=UsageReport, tags=["usage"], summary="Usage and spend",
            description="Attempts, owned utilisation and on-demand spend in [from, to). group_by=project is for the "
                        "admin and covers every project. format=csv: one line per group, then the total.")
async def usage(project_id: ProjectId, request: Request, principal: Principal = Depends(authenticate),
                start: Annotated[str | None, Query(alias="from", description="ISO-8601 start")] = None,
                end: Annotated[str | None, Query(alias="to", description="ISO-8601 end")] = None,
                group_by: GroupBy = "user", format: Literal["json", "csv"] = "json"):
    if group_by == "project":
        principal.require_admin()
    else:
        principal.require_project(project_id)
    try:
        query = UsageQuery(project_id=None if group_by == "project" else project_id, start=start, end=end,
                           group_by=group_by)
    except ValueError as exc:
        raise ApiError(400, errors.PARAM_INVALID, f"param[from/to] invalid: {exc.errors()[0]['msg']}") from None
    report = UsageReport.model_validate(await ask(request, RPC_USAGE, query, timeout=15))
    if format == "csv":
        return Response(to_csv(report), media_type="text/csv; charset=utf-8",
                        headers={"content-disposition": f'attachment; filename="usage-{project_id}.csv"'})
    return report


# Quotas ----------------------------------------------------------------------------------------------------------


@router.get("/v2/{project_id}/quotas", response_model=QuotasReply, tags=["quotas"],
            summary="The project's quotas and budgets, and its month so far")
async def get_quotas(project_id: ProjectId, request: Request, principal: Principal = Depends(authenticate)):
    principal.require_project(project_id)
    return QuotasReply.model_validate(await ask(request, RPC_QUOTAS, QuotasRequest(project_id=project_id)))


@router.put("/v2/{project_id}/quotas", response_model=QuotasReply, tags=["quotas"],
            summary="Replace the project's quotas and budgets (admin)")
async def put_quotas(project_id: ProjectId, body: ProjectQuotas, request: Request,
                     principal: Principal = Depends(authenticate)):
    principal.require_admin()
    return QuotasReply.model_validate(await ask(request, RPC_QUOTAS, QuotasRequest(project_id=project_id,
                                                                                    project=body)))


@router.put("/v2/{project_id}/quotas/users/{user_name}", response_model=QuotasReply, tags=["quotas"],
            summary="Set one user's quotas and budget in the project (admin)")
async def put_user_quota(project_id: ProjectId, user_name: UserName, body: Quota, request: Request,
                         principal: Principal = Depends(authenticate)):
    principal.require_admin()
    return QuotasReply.model_validate(await ask(request, RPC_QUOTAS, QuotasRequest(
        project_id=project_id, user_name=user_name, user=body)))


# Admission -------------------------------------------------------------------------------------------------------


def fits(info: NodeInfo, body: JobCreate) -> bool:
    """Whether a job could run on this node (the cheapest such node prices it)."""
    resource, placement = body.spec.resource, body.spec.placement
    gpus = [g for g in info.gpus if g.memory_gb >= resource.min_gpu_memory_gb
            and (not placement.gpu_models or g.model in placement.gpu_models)]
    return (info.allows(placement.allowed) and len(gpus) >= resource.gpu_count
            and (placement.max_price_per_hour is None or info.price_per_hour <= placement.max_price_per_hour))


def predict(body: JobCreate, nodes: list[NodeInfo]) -> tuple[float, float]:
    """(dollars, GPU-hours): the cheapest fitting node's price x nodes x expected hours."""
    spec = body.spec
    seconds = spec.placement.expected_duration_s or spec.max_duration_s or DEFAULT_DURATION_S
    prices = [n.price_per_hour for n in nodes if fits(n, body)]
    price = min(prices) if prices else DEFAULT_PRICE_PER_HOUR
    hours = seconds / 3600
    return price * spec.resource.node_count * hours, spec.resource.gpu_count * spec.resource.node_count * hours


async def fleet(request: Request) -> list[NodeInfo]:
    try:
        reply = await request.app.state.broker.request({}, RPC_NODES, timeout=2)
        records = await reply.decode()
        return [NodeInfo.model_validate(r["info"]) for r in records if r.get("info")]
    except Exception as exc:  # priced at the default: a silent monitor must not stop submissions
        log.warning("pricing a job without the fleet (monitor did not answer: %r)", exc)
        return []


async def admit_job(request: Request, *, project_id: str, user_name: str, body: JobCreate) -> None:
    """Refuse (403, 406008 quota / 406029 budget) a job the project's or user's quota or budget cannot take."""
    gpus = body.spec.resource.gpu_count * body.spec.resource.node_count
    first = AdmitReply.model_validate(await ask(request, RPC_ADMIT, AdmitQuery(
        project_id=project_id, user_name=user_name, purpose="submit", gpus=gpus)))
    reply = first
    if first.allowed and first.limited:
        cost, gpu_hours = predict(body, await fleet(request))
        reply = AdmitReply.model_validate(await ask(request, RPC_ADMIT, AdmitQuery(
            project_id=project_id, user_name=user_name, purpose="submit", gpus=gpus, estimated_cost=cost,
            estimated_gpu_hours=gpu_hours)))
    if not reply.allowed:
        raise ApiError(reply.http_status, reply.error_code or errors.QUOTA_EXCEEDED, reply.reason)
