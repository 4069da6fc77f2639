"""The usage ledger as pure functions: one entry per task attempt, priced by the node it ran on."""
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from shared.rpc import UsageTotals


def open_entry(event: Any) -> dict[str, Any]:
    """An attempt that started and has not ended yet (from TaskStarted)."""
    return {
        "_id": f"{event.job_id}:{event.attempt}:{event.rank}",
        "job_id": event.job_id, "attempt": event.attempt, "rank": event.rank,
        "project_id": event.project_id, "user_name": event.user_name,
        "node_id": event.node_id, "node_kind": event.node_kind,
        "gpu_count": event.gpu_count, "price_per_hour": event.price_per_hour,
        "started_at": event.started_at,
    }


def close_entry(opened: dict[str, Any], *, ended_at: datetime, reason: str) -> dict[str, Any]:
    """The ledger entry of a finished attempt: its seconds on the node times the node's price."""
    seconds = max(0.0, (ended_at - opened["started_at"]).total_seconds())
    return {
        **opened,
        "ended_at": ended_at,
        "reason": reason,
        "seconds": seconds,
        "gpu_hours": seconds * opened["gpu_count"] / 3600,
        "cost": seconds * opened["price_per_hour"] / 3600,
    }


def totals(entries: Iterable[dict[str, Any]], *, by: str | None = None) -> list[UsageTotals]:
    """Sum entries, all together (by=None) or per value of a field."""
    rows: dict[str, UsageTotals] = {}
    for entry in entries:
        key = entry[by] if by else ""
        row = rows.setdefault(key, UsageTotals(key=key))
        row.attempts += 1
        row.seconds += entry["seconds"]
        row.gpu_hours += entry["gpu_hours"]
        row.cost += entry["cost"]
    return sorted(rows.values(), key=lambda r: r.key)


def clip(entry: dict[str, Any], *, start: datetime | None, end: datetime | None) -> dict[str, Any] | None:
    """The part of an entry inside [start, end), re-priced; None when it lies outside."""
    begin = max(entry["started_at"], start) if start else entry["started_at"]
    finish = min(entry["ended_at"], end) if end else entry["ended_at"]
    if finish <= begin and not (finish == begin == entry["started_at"] == entry["ended_at"]):
        return None
    return close_entry({**entry, "started_at": begin}, ended_at=finish, reason=entry.get("reason", ""))
