"""The usage ledger as pure functions: one entry per task attempt, priced by the node it ran on."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from shared.pricing import rank_price_per_hour
from shared.rpc import UsageTotals

OPEN = "open"  # marks an attempt's line while the attempt runs
CLOSED_ONLY = {OPEN: {"$ne": True}}  # the filter of closed lines (sums and windows read only those)
STAMP = "tc"  # a closed line's stamp: when billing began writing it (`live.LiveLines`); 0 where none was drawn


def open_entry(
    *, key: dict[str, Any], terms: dict[str, Any], project_id: str | None, user_name: str | None, started_at: datetime
) -> dict[str, Any]:
    """An attempt that started and has not ended yet (`open`: its line in the ledger until `close_entry` replaces
    it), priced at its share of its node on the `terms` placement recorded (the rank's node, its kind, GPUs and
    price: `placements.rank_terms`): attempts side by side on one node together pay the node's price, not each all
    of it."""
    price, gpus, node_gpus = terms["price_per_hour"], terms["gpu_count"], terms["node_gpu_count"]
    return {
        "_id": f"{key['job_id']}:{key['attempt']}:{key['rank']}",
        OPEN: True,
        **key,
        "project_id": project_id,
        "user_name": user_name,
        "node_id": terms["node_id"],
        "node_kind": terms["node_kind"],
        "gpu_count": gpus,
        "node_gpu_count": node_gpus,
        "node_price_per_hour": price,
        "price_per_hour": rank_price_per_hour(price, gpus=gpus, node_gpus=node_gpus),
        "started_at": started_at,
    }


def close_entry(opened: dict[str, Any], *, ended_at: datetime, reason: str) -> dict[str, Any]:
    """The ledger entry of a finished attempt: its seconds on the node times the node's price."""
    seconds = max(0.0, (ended_at - opened["started_at"]).total_seconds())
    return {
        **{k: v for k, v in opened.items() if k != OPEN},
        "ended_at": ended_at,
        **epoch_bounds(opened["started_at"], ended_at),
        "reason": reason,
        STAMP: 0.0,
        "seconds": seconds,
        "gpu_hours": seconds * opened["gpu_count"] / 3600,
        "cost": seconds * opened["price_per_hour"] / 3600,
    }


def epoch_bounds(started_at: datetime, ended_at: datetime) -> dict[str, float]:
    """Start and end as Unix seconds: nx-27017 compares numbers, not datetimes, inside an aggregation's $match."""
    return {"t0": started_at.timestamp(), "t1": ended_at.timestamp()}


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


# Node lifetimes: on-demand nodes are charged from provisioning to release; owned nodes are available capacity
# from registration to loss. One open record per node (its _id is the node id) and, once closed, one ledger line
# whose _id names the node and the moment it began, so the same event seen again never charges twice.

OWNED_KINDS = ("local", "reserved")


def lifetime_id(opened: dict[str, Any]) -> str:
    """The closed line's id: a node and the moment its lifetime began."""
    return f"{opened['node_id']}@{opened['started_at'].isoformat()}"


def open_lifetime(
    *,
    node_id: str,
    kind: str,
    price_per_hour: float,
    gpu_count: int,
    started_at: datetime,
    project_id: str | None = None,
    user_name: str | None = None,
    source: str,
    for_job_id: str | None = None,
) -> dict[str, Any]:
    """A node that is being charged (on-demand) or offers capacity (owned) from `started_at`."""
    return {
        "_id": node_id,
        "node_id": node_id,
        "node_kind": kind,
        "price_per_hour": price_per_hour,
        "gpu_count": gpu_count,
        "started_at": started_at,
        "project_id": project_id,
        "user_name": user_name,
        "for_job_id": for_job_id,
        "source": source,
    }


def close_lifetime(opened: dict[str, Any], *, ended_at: datetime, reason: str) -> dict[str, Any]:
    """The ledger line of a node's lifetime: its seconds times its price per hour."""
    line = close_entry(opened, ended_at=max(ended_at, opened["started_at"]), reason=reason)
    return {**{k: v for k, v in line.items() if k != STAMP}, "_id": lifetime_id(opened)}  # stamps: attempts' lines


def reconcile(lifetimes: Iterable[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per node: (sum of its charges, seconds alive x price); equal when the ledger is sound."""
    sums: dict[str, list[float]] = {}
    for line in lifetimes:
        row = sums.setdefault(line["node_id"], [0.0, 0.0])
        row[0] += line["cost"]
        row[1] += (line["ended_at"] - line["started_at"]).total_seconds() * line["price_per_hour"] / 3600
    return {node: (charged, expected) for node, (charged, expected) in sums.items()}
