"""Usage reports: attempts summed by the database ($group), lifetimes of nodes, owned utilisation, idle spend.

Attempts that lie wholly inside the window are summed on the server, one `$group` per node kind (nx-27017 groups
by one field only); the few that straddle an edge of the window, and those still running, are clipped here.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.rpc import GroupBy, OnDemandUsage, OwnedUsage, UsageTotals
from services.billing.ledger import OWNED_KINDS

KINDS = ("local", "reserved", "on_demand")
FIELD: dict[str, str] = {"user": "user_name", "node_kind": "node_kind", "node": "node_id", "project": "project_id"}


@dataclass
class Sums:
    attempts: int = 0
    seconds: float = 0.0
    gpu_hours: float = 0.0
    cost: float = 0.0
    nodes: set[str] = field(default_factory=set)

    def add(self, *, attempts: int, seconds: float, gpu_hours: float, cost: float, nodes: Iterable[str]) -> None:
        self.attempts += attempts
        self.seconds += seconds
        self.gpu_hours += gpu_hours
        self.cost += cost
        self.nodes.update(nodes)


Table = dict[tuple[str, str], Sums]  # (group key, node kind) -> sums


def add_entry(table: Table, entry: dict[str, Any], *, by: str) -> None:
    """Count one (clipped) attempt entry into the table."""
    kind = entry.get("node_kind", "")
    table.setdefault((str(entry.get(by) or ""), kind), Sums()).add(
        attempts=1,
        seconds=entry["seconds"],
        gpu_hours=entry["gpu_hours"],
        cost=entry["cost"],
        nodes=[entry["node_id"]] if kind == "on_demand" else [],
    )


def add_group(table: Table, doc: dict[str, Any], *, kind: str) -> None:
    """Count one `$group` result row (for one node kind) into the table."""
    table.setdefault((str(doc["_id"] or ""), kind), Sums()).add(
        attempts=doc["attempts"],
        seconds=doc["seconds"],
        gpu_hours=doc["gpu_hours"],
        cost=doc["cost"],
        nodes=doc.get("nodes") or [],
    )


@dataclass(frozen=True)
class Idle:
    """The part of an on-demand node's lifetime (in the window) that no attempt used."""

    node_id: str
    project_id: str
    user_name: str
    seconds: float
    cost: float

    def key(self, group_by: GroupBy) -> str:
        return {"user": self.user_name, "project": self.project_id, "node": self.node_id, "node_kind": "on_demand"}[
            group_by
        ]


def idle_parts(lifetimes: Iterable[dict[str, Any]], used: dict[str, Sums]) -> list[Idle]:
    """Per on-demand node: its lifetime minus what attempts on it (every project's) were charged. Attempts side by
    side each pay their GPUs' share, so the idle part is counted in GPU-hours: a 2-GPU node running one 1-GPU job
    throughout is half idle."""
    per_node: dict[str, list[Any]] = {}
    for line in lifetimes:
        if line["node_kind"] != "on_demand":
            continue
        row = per_node.setdefault(line["node_id"], [line, 0.0, 0.0, 0.0])
        row[1] += line["seconds"]
        row[2] += line["cost"]
        row[3] += line["gpu_hours"]
    parts = []
    for node_id, (line, seconds, cost, gpu_hours) in per_node.items():
        taken = used.get(node_id, Sums())
        free = (
            max(0.0, 1 - taken.gpu_hours / gpu_hours) * seconds if gpu_hours > 0 else max(0.0, seconds - taken.seconds)
        )
        parts.append(
            Idle(
                node_id=node_id,
                project_id=line.get("project_id") or "",
                user_name=line.get("user_name") or "",
                seconds=free,
                cost=max(0.0, cost - taken.cost),
            )
        )
    return parts


def rows(table: Table, idle: Iterable[Idle], *, group_by: GroupBy | None) -> list[UsageTotals]:
    """One row per group key (all in one row when group_by is None), owned and rented spend apart."""
    out: dict[str, UsageTotals] = {}
    nodes: dict[str, set[str]] = {}

    def row(key: str) -> UsageTotals:
        nodes.setdefault(key, set())
        return out.setdefault(key, UsageTotals(key=key))

    for (key, kind), s in table.items():
        r = row(key if group_by else "")
        r.attempts += s.attempts
        r.seconds += s.seconds
        r.gpu_hours += s.gpu_hours
        r.cost += s.cost
        if kind == "on_demand":
            r.on_demand_seconds += s.seconds
            r.on_demand_cost += s.cost
            nodes[r.key].update(s.nodes)
        elif kind in OWNED_KINDS:
            r.owned_cost += s.cost
            setattr(r, f"{kind}_gpu_hours", getattr(r, f"{kind}_gpu_hours") + s.gpu_hours)
    for part in idle:
        r = row(part.key(group_by) if group_by else "")
        r.on_demand_seconds += part.seconds
        r.on_demand_cost += part.cost
        nodes[r.key].add(part.node_id)
    for r in out.values():
        r.on_demand_nodes = len(nodes[r.key])
        r.spend = r.owned_cost + r.on_demand_cost
    return sorted(out.values(), key=lambda r: r.key)


def owned(capacity: Iterable[dict[str, Any]], busy: dict[str, float]) -> dict[str, OwnedUsage]:
    """Utilisation of local and reserved nodes: busy GPU-hours over the GPU-hours they were available."""
    out = {kind: OwnedUsage() for kind in OWNED_KINDS}
    for line in capacity:
        if line["node_kind"] in out:
            usage = out[line["node_kind"]]
            usage.available_gpu_hours += line["gpu_hours"]
            usage.amortised_cost += line["cost"]
    for kind, usage in out.items():
        usage.busy_gpu_hours = busy.get(kind, 0.0)
        usage.idle_gpu_hours = max(0.0, usage.available_gpu_hours - usage.busy_gpu_hours)
        if usage.available_gpu_hours > 0:
            usage.utilisation = min(1.0, usage.busy_gpu_hours / usage.available_gpu_hours)
    return out


def on_demand(lifetimes: Iterable[dict[str, Any]], idle: Iterable[Idle]) -> OnDemandUsage:
    """Fleet-wide on-demand nodes: how many, how long, how much, how much of it idle."""
    lines = [line for line in lifetimes if line["node_kind"] == "on_demand"]
    return OnDemandUsage(
        nodes=len({line["node_id"] for line in lines}),
        seconds=sum(line["seconds"] for line in lines),
        cost=sum(line["cost"] for line in lines),
        idle_cost=sum(p.cost for p in idle),
    )


def window_filters(start: datetime | None, end: datetime | None) -> tuple[dict, list[dict]]:
    """The filter of entries wholly inside [start, end) and the (disjoint) filters of those across an edge, all on
    Unix seconds (`ledger.epoch_bounds`): nx-27017 compares numbers, not datetimes, inside an aggregation's $match,
    and a `find` joining a datetime range with `$ne` (the closed lines') matched nothing there, so every line across
    a window's edge was left out of the reports (before 2026-11-28: a month's spend missed the attempts that began
    in the month before)."""
    inside: dict[str, Any] = {}
    s, e = (start.timestamp() if start else None), (end.timestamp() if end else None)
    if s is not None:
        inside["t0"] = {"$gte": s}
    if e is not None:
        inside["t1"] = {"$lte": e}
    edges = []
    if s is not None:
        edges.append({"t0": {"$lt": s}, "t1": {"$gt": s}})
    if e is not None:
        began = {"$gte": s, "$lt": e} if s is not None else {"$lt": e}
        edges.append({"t0": began, "t1": {"$gt": e}})
    return inside, edges
