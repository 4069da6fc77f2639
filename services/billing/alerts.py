"""Budget alerts: the 80% and 100% marks of each project's and user's monthly budget, each raised once, its
notification written with it (the outbox relay publishes what a crash left unpublished)."""

from dataclasses import dataclass

from shared.clock import utcnow
from shared.events import Notification
from shared.rpc import Quota, UsageQuery
from shared.store import DocumentStore
from services.billing import quota as policy
from services.billing.admission import QuotaBook
from services.billing.reports import Reports


@dataclass
class BudgetAlerts:
    store: DocumentStore  # the alerts raised, each with its notification until published
    book: QuotaBook  # the budgets
    reports: Reports  # what was spent this month

    async def check(self, project_id: str) -> None:
        """Raise the 80% and 100% alerts of the project's and its users' budgets, each once."""
        limits = await self.book.load(project_id)
        every: list[tuple[str | None, Quota]] = [(None, limits), *limits.users.items()]
        scopes = [(u, q) for u, q in every if q.budget_per_month is not None]
        if not scopes:
            return
        now = utcnow()
        report = await self.reports.usage(
            UsageQuery(project_id=project_id, start=policy.month_start(now)), spend_only=True
        )
        spent = {r.key: r.spend for r in report.by_user}
        for user, q in scopes:
            total = report.total.spend if user is None else spent.get(user, 0.0)
            for pct in policy.due_alerts(q, spent=total):
                await self._alert(
                    project_id, user, pct=pct, budget=q.budget_per_month, spent=total, month=policy.month_key(now)
                )

    async def check_all(self) -> None:
        """Every project with a budget (running attempts spend without any event)."""
        for project_id in await self.book.projects():
            await self.check(project_id)

    async def _alert(
        self, project_id: str, user: str | None, *, pct: int, budget: float | None, spent: float, month: str
    ) -> None:
        """Raise one alert once: the record and its notification in one write; an alert already raised is not
        raised again."""
        event_id = f"budget:{project_id}:{user or '*'}:{month}:{budget:g}:{pct}"
        who = f"user {user} in project {project_id}" if user else f"project {project_id}"
        notification = Notification(
            event_id=event_id,
            project_id=project_id,
            job_id="",
            user_name=user or "",
            kind="budget",
            message=f"{who} has used {pct}% of its {month} budget: ${spent:.4f} of ${budget:g}",
        )
        raised = {"project_id": project_id, "user_name": user, "month": month, "budget": budget, "pct": pct}
        await self.store.save(event_id, raised, None, [notification])
