"""Usage reports: attempts and node lifetimes inside a window, running ones charged up to now (the sums in
services/billing/usage.py)."""

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from pymongo.asynchronous.collection import AsyncCollection

from shared.clock import utcnow
from shared.rpc import UsageQuery, UsageReport, UsageTotals
from services.billing.ledger import CLOSED_ONLY, OWNED_KINDS, STAMP, clip, close_entry, close_lifetime, lifetime_id
from services.billing.lifetimes import Writes
from services.billing.live import LiveLines
from services.billing.usage import (
    FIELD,
    KINDS,
    Sums,
    Table,
    add_entry,
    add_group,
    idle_parts,
    on_demand,
    owned,
    rows,
    window_filters,
)

# How long a read is reused while nothing it read was written here since: bounds what a line written by another
# process (a leader that lost its lease, its last writes in flight) can stay unseen.
T = TypeVar("T")
LEDGER_READ_TTL_S = 5.0
MAX_KEPT_READS = 256  # distinct questions kept (a report asks up to nine); past it all are forgotten


@dataclass
class KeptReads(Generic[T]):
    """Reads of collections only this process writes, kept while what they read is as it was: `current()` counts
    the writes begun, and a read is kept only where none began while it was made, and reused while none has begun
    since (or LEDGER_READ_TTL_S passes)."""

    current: Callable[[], int]
    kept: dict[str, tuple[int, float, T]] = field(default_factory=dict, repr=False)
    reused: int = 0  # reads answered from `kept` (for tests and benchmarks)

    async def read(self, question: Any, read: Callable[[], Awaitable[T]], *, generation: int | None) -> T:
        """`read()`'s answer, or the one kept for `question` at `generation` (None: writes under way when the
        caller looked: neither reused nor kept)."""
        key = json.dumps(question, sort_keys=True, default=str)
        kept, now = self.kept.get(key), time.monotonic()
        if generation is not None and kept and kept[0] == generation and now - kept[1] < LEDGER_READ_TTL_S:
            self.reused += 1
            return kept[2]
        answer = await read()
        if generation is not None and self.current() == generation:
            if len(self.kept) >= MAX_KEPT_READS:
                self.kept.clear()
            self.kept[key] = (generation, now, answer)
        return answer


@dataclass
class Reports:
    """The read side of the ledgers: reads the attempts' and the nodes' collections, writes nothing.

    The ledger's closed lines change only by billing's own writes (`live.generation` counts them), so a ledger
    read (a `$group`, an edge's lines) made while nothing was being written is reused by the next reports of the
    same question until a write begins (or LEDGER_READ_TTL_S passes): admission asks the month's spend on every
    submission to a project with quotas, each a read of the whole ledger on the embedded database."""

    ledger: AsyncCollection  # attempts' lines: the closed ones are read here (the open ones are in `live`)
    live: LiveLines  # running attempts' lines, all, and those closing (`Attempts.live`)
    nodes: AsyncCollection  # closed node lifetimes
    nodes_open: AsyncCollection  # node lifetimes still running
    clock: Callable[[], datetime] = utcnow  # running attempts and lifetimes are charged up to this now
    writes: Writes = field(default_factory=Writes)  # the lifetimes' writes (`Lifetimes.writes`)
    ledger_reads: KeptReads[list[dict[str, Any]]] = field(init=False, repr=False)
    lifetime_reads: KeptReads[tuple[list[dict], list[dict]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.ledger_reads = KeptReads(lambda: self.live.generation)
        self.lifetime_reads = KeptReads(lambda: self.writes.generation)

    async def running(self, scope: dict[str, Any]) -> list[dict[str, Any]]:
        """The running attempts' lines of a scope (project, user)."""
        return [d for d in list(self.live.running.values()) if all(d.get(k) == v for k, v in scope.items())]

    async def usage(self, query: UsageQuery, *, spend_only: bool = False) -> UsageReport:
        """Attempts and node lifetimes inside [start, end), running ones charged up to now: as they stood at one
        instant (`live.snapshot`), whatever closes while the ledger is read. `spend_only` (admission's question):
        the totals, the rows of `query.group_by` and the GPUs in use, the same as in the whole report; no rows by
        node kind and no owned utilisation (empty), which took four of the report's ledger reads (each a read of
        the whole ledger on the embedded database)."""
        now = self.clock()
        snap = self.live.snapshot()
        generation = self.live.generation if not snap.closed else None  # nothing being written: reads reusable
        stamped = {STAMP: {"$lt": snap.cutoff}}  # the closed lines the ledger sums; the later ones are in `snap`
        scope: dict[str, Any] = {"project_id": query.project_id} if query.project_id else {}
        if query.user_name:
            scope["user_name"] = query.user_name
        if query.job_id:
            scope["job_id"] = query.job_id
        inside, edges = window_filters(query.start, query.end)
        field = FIELD[query.group_by]
        tables: dict[str, Table] = {f: {} for f in ({field} if spend_only else {field, "user_name", "node_kind"})}
        for by, table in tables.items():
            for kind in KINDS:
                match = {**scope, **inside, "node_kind": kind}
                for doc in await self._group(match, stamped, by=by, nodes=kind == "on_demand", generation=generation):
                    add_group(table, doc, kind=kind)
        fleet = scope == {}
        busy: dict[str, float] = {}
        per_node: dict[str, Sums] = {}
        if fleet and not spend_only:
            for (kind, _), s in tables["node_kind"].items():
                busy[kind] = busy.get(kind, 0.0) + s.gpu_hours
        elif not spend_only:  # (owned utilisation is not asked for a spend)
            for doc in await self._group(inside, stamped, by="node_kind", generation=generation):
                busy[doc["_id"]] = doc["gpu_hours"]
        on_demand_lines = {**inside, "node_kind": "on_demand"}
        for doc in await self._group(on_demand_lines, stamped, by="node_id", generation=generation):
            per_node[doc["_id"]] = Sums(
                attempts=doc["attempts"], seconds=doc["seconds"], cost=doc["cost"], gpu_hours=doc["gpu_hours"]
            )
        extra = []
        for edge in edges:
            extra += await self.ledger_reads.read(
                {"edge": edge}, self._finder({**edge, **stamped}), generation=generation
            )
        extra += snap.closed  # clipped below, as the lines across an edge are
        running = [close_entry(d, ended_at=max(now, d["started_at"]), reason="running") for d in snap.running]
        in_scope_running = [r for r in running if all(r.get(k) == v for k, v in scope.items())]
        for entry in extra + running:
            part = clip(entry, start=query.start, end=query.end)
            if part is None:
                continue
            if all(part.get(k) == v for k, v in scope.items()):
                for by, table in tables.items():
                    add_entry(table, part, by=by)
            if part["node_kind"] in OWNED_KINDS:
                busy[part["node_kind"]] = busy.get(part["node_kind"], 0.0) + part["gpu_hours"]
            elif part["node_kind"] == "on_demand":
                per_node.setdefault(part["node_id"], Sums()).add(
                    attempts=1, seconds=part["seconds"], gpu_hours=part["gpu_hours"], cost=part["cost"], nodes=()
                )
        lifetimes = await self._lifetimes(query.start, query.end, now=now)
        idle = [
            p
            for p in idle_parts(lifetimes, per_node)
            if (not query.project_id or p.project_id == query.project_id)
            and (not query.user_name or p.user_name == query.user_name)
            and not query.job_id
        ]
        total = (rows(tables[field], idle, group_by=None) or [UsageTotals()])[0]
        summary = on_demand(lifetimes, idle)
        if not fleet:
            summary = summary.model_copy(
                update={
                    "nodes": total.on_demand_nodes,
                    "seconds": total.on_demand_seconds,
                    "cost": total.on_demand_cost,
                    "idle_cost": sum(p.cost for p in idle),
                }
            )
        return UsageReport(
            project_id=query.project_id,
            start=query.start,
            end=query.end,
            total=total,
            by_user=rows(tables["user_name"], idle, group_by="user") if "user_name" in tables else [],
            by_node_kind=rows(tables["node_kind"], idle, group_by="node_kind") if "node_kind" in tables else [],
            open_attempts=len(in_scope_running),
            group_by=query.group_by,
            groups=rows(tables[field], idle, group_by=query.group_by),
            owned={} if spend_only else owned([line for line in lifetimes if line["node_kind"] in OWNED_KINDS], busy),
            on_demand=summary,
            gpus_in_use=sum(r["gpu_count"] for r in in_scope_running),
        )

    async def _group(
        self, match: dict[str, Any], stamped: dict[str, Any], *, by: str, nodes: bool = False, generation: int | None
    ) -> list[dict[str, Any]]:
        """Sums of the closed attempts `match` and `stamped` (the report's cutoff) find per value of one field,
        computed by the database (or reused: `KeptReads`)."""
        return await self.ledger_reads.read(
            {"group": match, "by": by, "nodes": nodes},
            lambda: self._grouped({**match, **stamped}, by=by, nodes=nodes),
            generation=generation,
        )

    def _finder(self, query: dict[str, Any]) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
        """A read of the closed lines `query` finds."""

        async def find() -> list[dict[str, Any]]:
            return [d async for d in self.ledger.find({**query, **CLOSED_ONLY})]

        return find

    async def _grouped(self, match: dict[str, Any], *, by: str, nodes: bool = False) -> list[dict[str, Any]]:
        match = {**match, **CLOSED_ONLY}
        group: dict[str, Any] = {
            "_id": f"${by}",
            "attempts": {"$sum": 1},
            "seconds": {"$sum": "$seconds"},
            "gpu_hours": {"$sum": "$gpu_hours"},
            "cost": {"$sum": "$cost"},
        }
        if nodes:
            group["nodes"] = {"$addToSet": "$node_id"}
        aggregate = getattr(self.ledger, "aggregate", None)
        if aggregate is not None:
            return [d async for d in await aggregate([{"$match": match}, {"$group": group}])]
        table: Table = {}  # in-memory twin (service tests): the same sums, here
        async for entry in self.ledger.find(match):
            add_entry(table, entry, by=by)
        return [
            {
                "_id": key,
                "attempts": s.attempts,
                "seconds": s.seconds,
                "gpu_hours": s.gpu_hours,
                "cost": s.cost,
                "nodes": sorted(s.nodes),
            }
            for (key, _), s in table.items()
        ]

    async def _lifetime_lines(self, start: datetime | None) -> tuple[list[dict], list[dict]]:
        """The open lifetimes, then the closed ones from `start` on (and those of the open ones read, closed
        meanwhile), as one read: reused while no lifetime was written since (none under way)."""

        async def read() -> tuple[list[dict], list[dict]]:
            opened = [d async for d in self.nodes_open.find({})]
            query: dict[str, Any] = {}
            if start:  # those that overlap the window, and those just closed (read open), wherever they end
                query = {"$or": [{"ended_at": {"$gt": start}}, {"_id": {"$in": [lifetime_id(d) for d in opened]}}]}
            return opened, [d async for d in self.nodes.find(query)]

        generation = self.writes.generation if not self.writes.under_way else None
        return await self.lifetime_reads.read({"start": start}, read, generation=generation)

    async def _lifetimes(self, start: datetime | None, end: datetime | None, *, now: datetime) -> list[dict]:
        """Node lifetimes clipped to the window, running ones up to now. The running ones are read first: a node
        whose lifetime closes meanwhile (its closed line written, then its open one deleted) is read open, closed,
        or both (then once, closed), never neither."""
        opened, closed = await self._lifetime_lines(start)
        ids = {d["_id"] for d in closed}
        running = [
            close_lifetime(d, ended_at=max(now, d["started_at"]), reason="running")
            for d in opened
            if lifetime_id(d) not in ids
        ]
        return [part for line in closed + running if (part := clip(line, start=start, end=end))]
