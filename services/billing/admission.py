"""Quotas and admission: each project's quotas and budgets (read and written here alone), and whether a project
and user may take on a job or a paid node (the rules in services/billing/quota.py)."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared.clock import utcnow
from shared.lru import Lru
from shared.rpc import AdmitQuery, AdmitReply, ProjectQuotas, QuotasReply, QuotasRequest, UsageQuery, UsageTotals
from services.billing import quota as policy
from services.billing.placements import Placements
from services.billing.reports import Reports

REMEMBERED_PROJECTS = 10_000  # projects whose quotas are kept in memory


@dataclass
class QuotaBook:
    quotas: AsyncCollection  # project id -> its quotas and budgets, its users'
    # Projects' quotas as last read or written (billing alone writes them): read at each admission and budget check.
    known: Lru[str, ProjectQuotas] = field(default_factory=lambda: Lru(REMEMBERED_PROJECTS), repr=False)

    async def load(self, project_id: str) -> ProjectQuotas:
        if (known := self.known.get(project_id)) is not None:
            return known
        doc = await self.quotas.find_one({"_id": project_id})
        quotas = ProjectQuotas.model_validate(doc["quotas"]) if doc else ProjectQuotas()
        return self.known.put(project_id, quotas)

    async def save(self, project_id: str, quotas: ProjectQuotas) -> None:
        self.known.pop(project_id)  # a failed write leaves the next read to the database
        await self.quotas.replace_one(
            {"_id": project_id},  # nx-27017 wants the _id in an upsert's doc
            {"_id": project_id, "quotas": quotas.model_dump()},
            upsert=True,
        )
        self.known.put(project_id, quotas)

    async def projects(self) -> list[str]:
        """Every project that has quotas stored."""
        return [doc["_id"] async for doc in self.quotas.find({})]


@dataclass
class Admission:
    book: QuotaBook
    reports: Reports  # the month's use so far, the GPUs running attempts hold
    placements: Placements  # the GPUs queued jobs ask for
    changed: Callable[[str], Awaitable[None]]  # a project's quotas changed: its budgets are looked at

    async def set_quotas(self, request: QuotasRequest) -> QuotasReply:
        """Read, replace, or change one user's quotas of a project; answer with them and the month so far."""
        current = await self.book.load(request.project_id)
        if request.project is not None:
            current = request.project
        if request.user_name and request.user is not None:
            current = current.model_copy(update={"users": {**current.users, request.user_name: request.user}})
        if request.project is not None or request.user is not None:
            await self.book.save(request.project_id, current)
            await self.changed(request.project_id)
        month = policy.month_start(utcnow())
        report = await self.reports.usage(UsageQuery(project_id=request.project_id, start=month), spend_only=True)
        return QuotasReply(
            project_id=request.project_id,
            quotas=current,
            month_start=month,
            used=report.total,
            used_by_user=report.by_user,
            gpus_in_use=report.gpus_in_use,
        )

    async def admit(self, query: AdmitQuery) -> AdmitReply:
        """Allowed unless the project's or the user's quota or budget would be exceeded."""
        limits = await self.book.load(query.project_id)
        user_limits = limits.users.get(query.user_name)
        if not _limited(limits) and not (user_limits and _limited(user_limits)):
            return AdmitReply(allowed=True)
        if (
            query.purpose == "submit"
            and query.estimated_cost == 0
            and query.estimated_gpu_hours == 0
            and query.gpus == 0
        ):
            return AdmitReply(allowed=True, limited=True)  # a first look: the caller prices the job next
        month = policy.month_start(utcnow())
        report = await self.reports.usage(UsageQuery(project_id=query.project_id, start=month), spend_only=True)
        refusal = policy.check(
            limits,
            scope=query.project_id,
            used=report.total,
            gpus_in_use=report.gpus_in_use,
            gpus_queued=await self._queued_gpus(query),
            query=query,
        )
        if refusal is None and user_limits is not None:
            used = next((r for r in report.by_user if r.key == query.user_name), UsageTotals(key=query.user_name))
            mine = await self.reports.running({"project_id": query.project_id, "user_name": query.user_name})
            refusal = policy.check(
                user_limits,
                scope=f"{query.project_id}/{query.user_name}",
                used=used,
                gpus_in_use=sum(d["gpu_count"] for d in mine),
                gpus_queued=await self._queued_gpus(query, user=True),
                query=query,
            )
        return (refusal or AdmitReply(allowed=True)).model_copy(update={"limited": True})

    async def _queued_gpus(self, query: AdmitQuery, *, user: bool = False) -> int:
        """GPUs the scope's jobs not finished and not running ask for; none for a node rented for a queued job (that
        job is the node's reason, counted by the node's GPUs)."""
        if query.purpose != "submit":
            return 0
        scope = {"project_id": query.project_id} | ({"user_name": query.user_name} if user else {})
        running = {d["job_id"] for d in await self.reports.running(scope)}
        return await self.placements.unfinished_gpus(
            project_id=query.project_id, user_name=query.user_name if user else None, running=running
        )


def _limited(q: Any) -> bool:
    return any(v is not None for v in (q.max_gpus, q.gpu_hours_per_month, q.budget_per_month))
