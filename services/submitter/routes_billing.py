"""Usage and spend reports, quotas and budgets (a new job's admission: `admission`)."""

import csv
import io
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from shared.bus import RPC_QUOTAS, RPC_USAGE
from shared.rpc import GroupBy, ProjectQuotas, Quota, QuotasReply, QuotasRequest, UsageQuery, UsageReport, UsageTotals
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import ProjectId, use_cases
from services.submitter.errors import ApiError

router = APIRouter()
UserName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
CSV_COLUMNS = [name for name in UsageTotals.model_fields]


# Usage -----------------------------------------------------------------------------------------------------------


def to_csv(report: UsageReport) -> str:
    """One line per group, then the total (key `(total)`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[report.group_by, *CSV_COLUMNS[1:]], lineterminator="\n")
    writer.writeheader()
    for row in [*report.groups, report.total.model_copy(update={"key": "(total)"})]:
        data = row.model_dump()
        writer.writerow(
            {
                report.group_by: data.pop("key"),
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in data.items()},
            }
        )
    return out.getvalue()


@router.get(
    "/v2/{project_id}/usage",
    response_model=UsageReport,
    tags=["usage"],
    summary="Usage and spend",
    description="Attempts, owned utilisation and on-demand spend in [from, to). group_by=project is for the "
    "admin and covers every project. format=csv: one line per group, then the total.",
)
async def usage(
    project_id: ProjectId,
    request: Request,
    principal: Principal = Depends(authenticate),
    start: Annotated[str | None, Query(alias="from", description="ISO-8601 start")] = None,
    end: Annotated[str | None, Query(alias="to", description="ISO-8601 end")] = None,
    group_by: GroupBy = "user",
    format: Literal["json", "csv"] = "json",
    job_id: Annotated[str | None, Query(max_length=64, description="Only this job: its cost so far")] = None,
):
    if group_by == "project":
        principal.require_admin()
    else:
        principal.require_project(project_id)
    try:
        query = UsageQuery(
            project_id=None if group_by == "project" else project_id,
            start=start,
            end=end,
            group_by=group_by,
            job_id=job_id,
        )
    except ValidationError as exc:
        raise ApiError(400, errors.PARAM_INVALID, f"param[from/to] invalid: {exc.errors()[0]['msg']}") from None
    report = UsageReport.model_validate(await use_cases(request).requester.ask(RPC_USAGE, query, timeout=15))
    if format == "csv":
        return Response(
            to_csv(report),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="usage-{project_id}.csv"'},
        )
    return report


# Quotas ----------------------------------------------------------------------------------------------------------


async def quotas(request: Request, question: QuotasRequest) -> dict:
    """Billing's answer about a project's quotas and budgets (read or replaced)."""
    return await use_cases(request).requester.ask(RPC_QUOTAS, question)


@router.get(
    "/v2/{project_id}/quotas",
    response_model=QuotasReply,
    tags=["quotas"],
    summary="The project's quotas and budgets, and its month so far",
)
async def get_quotas(project_id: ProjectId, request: Request, principal: Principal = Depends(authenticate)):
    principal.require_project(project_id)
    return QuotasReply.model_validate(await quotas(request, QuotasRequest(project_id=project_id)))


@router.put(
    "/v2/{project_id}/quotas",
    response_model=QuotasReply,
    tags=["quotas"],
    summary="Replace the project's quotas and budgets (admin)",
)
async def put_quotas(
    project_id: ProjectId, body: ProjectQuotas, request: Request, principal: Principal = Depends(authenticate)
):
    principal.require_admin()
    return QuotasReply.model_validate(await quotas(request, QuotasRequest(project_id=project_id, project=body)))


@router.put(
    "/v2/{project_id}/quotas/users/{user_name}",
    response_model=QuotasReply,
    tags=["quotas"],
    summary="Set one user's quotas and budget in the project (admin)",
)
async def put_user_quota(
    project_id: ProjectId,
    user_name: UserName,
    body: Quota,
    request: Request,
    principal: Principal = Depends(authenticate),
):
    principal.require_admin()
    return QuotasReply.model_validate(
        await quotas(request, QuotasRequest(project_id=project_id, user_name=user_name, user=body))
    )
