"""Quotas and budgets as pure functions: admit or refuse a job or a node, and which budget alerts are due."""

from datetime import UTC, datetime

from shared.rpc import AdmitQuery, AdmitReply, Quota, UsageTotals

QUOTA_EXCEEDED = "406008"  # max_gpus or gpu_hours_per_month would be exceeded
BUDGET_EXCEEDED = "406029"  # no budget left this month for the predicted cost
REFUSED_HTTP_STATUS = 403  # the caller is authenticated and allowed in the project, but may not spend more
ALERT_THRESHOLDS = (80, 100)  # percent of a monthly budget at which the project is notified, once each


def month_start(now: datetime) -> datetime:
    """The first instant of `now`'s calendar month (UTC): budgets and GPU-hour quotas reset then."""
    now = now.astimezone(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def month_key(now: datetime) -> str:
    return month_start(now).strftime("%Y-%m")


def _refuse(code: str, scope: str, limit: str, message: str) -> AdmitReply:
    return AdmitReply(
        allowed=False,
        error_code=code,
        http_status=REFUSED_HTTP_STATUS,
        reason=f"[{scope}.{limit}] quota exceeded: {message}",
    )


def check(
    quota: Quota, *, scope: str, used: UsageTotals, gpus_in_use: int, query: AdmitQuery, gpus_queued: int = 0
) -> AdmitReply | None:
    """The refusal when the query would take `scope` (a project or `project/user`) past a limit, else None.

    `max_gpus` counts the GPUs running attempts hold and those the scope's queued jobs ask for (`gpus_queued`): a
    project cannot queue past its limit and have every job start the moment capacity frees."""
    if quota.max_gpus is not None and query.gpus and gpus_in_use + gpus_queued + query.gpus > quota.max_gpus:
        return _refuse(
            QUOTA_EXCEEDED,
            scope,
            "max_gpus",
            f"{gpus_in_use} GPUs in use + {gpus_queued} queued + {query.gpus} asked > {quota.max_gpus}",
        )
    hours = quota.gpu_hours_per_month
    if hours is not None and used.gpu_hours + query.estimated_gpu_hours > hours:
        return _refuse(
            QUOTA_EXCEEDED,
            scope,
            "gpu_hours_per_month",
            f"{used.gpu_hours:.3f} GPU-hours used this month + {query.estimated_gpu_hours:.3f} expected > {hours}",
        )
    budget = quota.budget_per_month
    if budget is not None and used.spend + query.estimated_cost > budget:
        left = max(0.0, budget - used.spend)
        return _refuse(
            BUDGET_EXCEEDED,
            scope,
            "budget_per_month",
            f"no remaining budget: ${used.spend:.4f} spent this month, ${left:.4f} left, "
            f"${query.estimated_cost:.4f} expected (budget ${budget})",
        )
    return None


def due_alerts(quota: Quota, *, spent: float) -> list[int]:
    """The alert thresholds (percent of the monthly budget) that `spent` has reached."""
    budget = quota.budget_per_month
    if budget is None:
        return []
    if budget == 0:
        return list(ALERT_THRESHOLDS) if spent > 0 else []
    return [pct for pct in ALERT_THRESHOLDS if spent >= budget * pct / 100]
