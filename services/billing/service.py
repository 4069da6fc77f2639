"""Billing's service layer: attempts and node lifetimes recorded exactly once, usage reports, quotas, alerts."""
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import bson
from bson.codec_options import CodecOptions
from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.clock import utcnow
from shared.events import (JobPlaced, JobStatusChanged, JobSubmitted, NodeProvisioned, NodeRegistered,
                           NodeReleased, NodeStateChanged, Notification, TaskExited, TaskStarted)
from shared.rpc import (AdmitQuery, AdmitReply, ProjectQuotas, QuotasReply, QuotasRequest, UsageQuery, UsageReport,
                        UsageTotals)
from shared.lru import Lru
from shared.noderecords import NodeLimits, admitted
from shared.store import DocumentStore
from services.billing import quota as policy
from services.billing.ledger import OWNED_KINDS, clip, close_entry, close_lifetime, epoch_bounds, lifetime_id, \
    open_entry, open_lifetime
from services.billing.placements import Placements, charged_from, missed_end, rank_terms
from services.billing.usage import FIELD, KINDS, Sums, Table, add_entry, add_group, idle_parts, on_demand, owned, \
    rows, window_filters

log = logging.getLogger(__name__)

REMEMBERED_PROJECTS = 10_000  # projects whose quotas are kept in memory
REMEMBERED_NODES = 20_000  # nodes whose kind, GPUs and price are kept in memory (a few hundred bytes each)
REMEMBERED_OPEN = 20_000  # running attempts' lines kept in memory, as inserted, until closed


def as_read(collection: AsyncCollection, doc: dict[str, Any]) -> dict[str, Any]:
    """The document as a read of it would return it (datetimes to the millisecond, in UTC)."""
    codec = getattr(collection, "codec_options", None) or CodecOptions(tz_aware=True)
    return bson.decode(bson.encode(doc, codec_options=codec), codec_options=codec)


@dataclass
class Billing:
    ledger: AsyncCollection  # closed attempts
    open: AsyncCollection  # running attempts
    nodes: AsyncCollection | None = None  # closed node lifetimes
    nodes_open: AsyncCollection | None = None  # node lifetimes still running
    node_info: AsyncCollection | None = None  # what billing knows of each node: kind, GPUs, price, for whom
    quotas: AsyncCollection | None = None
    alerts: DocumentStore | None = None  # budget alerts raised, each with its notification until published
    placements: Placements | None = None  # what placement decided: the only attempts that are charged
    reconcile_grace_s: float = 60.0  # how long a job's status may say an attempt ended before billing closes it
    clock: Callable[[], datetime] = utcnow  # billing's own now: no report is charged past it
    # The static nodes' records (cluster file); None: registrations taken as said (in-memory tests only).
    static: dict[str, NodeLimits] | None = None
    # Projects' quotas as last read or written (billing alone writes them, in `set_quotas`): read at each admission
    # and each budget check.
    known_quotas: Lru[str, ProjectQuotas] = field(default_factory=lambda: Lru(REMEMBERED_PROJECTS), repr=False)
    # What billing alone writes, as it wrote it (one leader at a time, which exits when it loses its lease): each
    # node's record (read at every task start) and the lines of the attempts it opened (read at every end).
    known_nodes: Lru[str, dict] = field(default_factory=lambda: Lru(REMEMBERED_NODES), repr=False)
    opened: Lru[str, dict] = field(default_factory=lambda: Lru(REMEMBERED_OPEN), repr=False)

    # Attempts --------------------------------------------------------------------------------------------------

    async def submitted(self, event: JobSubmitted) -> None:
        if self.placements is not None:
            await self.placements.submitted(event)

    async def placed(self, event: JobPlaced) -> None:
        """Learn where each rank of the attempt runs; charge what its nodes reported before this arrived."""
        if self.placements is None:
            return
        for waiting, at in await self.placements.placed(event):
            await (self.started(waiting, seen=at) if isinstance(waiting, TaskStarted) else
                   self.exited(waiting, seen=at))
            await self.placements.unpark(waiting)
        self.placements.settled(event)

    async def started(self, event: TaskStarted, *, seen: datetime | None = None) -> None:
        """Open the attempt's line when its start is seen (`seen`: when the platform recorded the report, else
        now); the times, price, GPU counts and owner the agent reports are not read."""
        seen = self._seen(seen)
        placement = await self._vouched(event, seen=seen)
        if placement is None:
            return
        info = await self._node_record(event.node_id)
        entry = open_entry(key={"job_id": event.job_id, "attempt": event.attempt, "rank": event.rank},
                           terms=rank_terms(placement, event.rank, info), project_id=placement.get("project_id"),
                           user_name=placement.get("user_name"), started_at=charged_from(placement, seen=seen))
        if await self.ledger.find_one({"_id": entry["_id"]}, {"_id": 1}):
            return
        try:
            await self.open.insert_one(entry)
        except DuplicateKeyError:
            return  # opened by an earlier delivery: the stored line stands
        self.opened.put(entry["_id"], as_read(self.open, entry))

    async def _node_record(self, node_id: str) -> dict[str, Any] | None:
        """What billing knows of the node (remembered as last read or written; billing alone writes it)."""
        if self.node_info is None:
            return None
        known = self.known_nodes.get(node_id)
        if known is None:
            known = await self.node_info.find_one({"_id": node_id})
            if known is not None:
                self.known_nodes.put(node_id, known)
        return known

    def _node_written(self, node_id: str, info: dict[str, Any] | None) -> dict[str, Any] | None:
        if info is not None:
            self.known_nodes.put(node_id, as_read(self.node_info, info))
        return info

    async def exited(self, event: TaskExited, *, seen: datetime | None = None) -> None:
        """Close the attempt's line when its end is seen; the end time the agent reports is not read."""
        seen = self._seen(seen)
        if await self._vouched(event, seen=seen) is None:
            return
        await self._close(f"{event.job_id}:{event.attempt}:{event.rank}", ended_at=seen, reason=event.reason)

    def _seen(self, seen: datetime | None) -> datetime:
        """When the platform recorded an event (the bus server's time), never later than billing's own now."""
        now = self.clock()
        return min(seen, now) if seen is not None else now

    async def job_status(self, event: JobStatusChanged) -> None:
        if self.placements is not None:
            await self.placements.status(event, seen=utcnow().timestamp())

    async def reconcile(self, *, now: datetime | None = None) -> int:
        """Close the open attempts whose end report never came, though the job's status says they ended (finished
        job, or attempt moved on) at least `reconcile_grace_s` ago: at the end the status gives. Idempotent: an
        end report that comes later finds nothing open."""
        if self.placements is None:
            return 0
        now = now or self.clock()
        closed = 0
        running = [d async for d in self.open.find({})]
        ids = sorted({d["job_id"] for d in running})
        jobs = {j["_id"]: j async for j in self.placements.jobs.find({"_id": {"$in": ids}})} if ids else {}
        for opened in running:
            end = missed_end(jobs.get(opened["job_id"]), attempt=opened["attempt"], now=now.timestamp(),
                             grace_s=self.reconcile_grace_s)
            if end is not None:
                await self._close(opened["_id"], ended_at=datetime.fromtimestamp(end, UTC), reason="reconciled")
                closed += 1
        if closed:
            log.warning("%d open attempts closed by reconciliation: their end reports were lost", closed)
        return closed

    async def _vouched(self, event: TaskStarted | TaskExited, *, seen: datetime) -> dict[str, Any] | None:
        """The placement behind a task event, or None: then nothing is charged on the event's word."""
        if self.placements is None:
            log.warning("%s of job %s not charged: no placements to check it against", event.type, event.job_id)
            return None
        return await self.placements.check(event, seen=seen)

    async def _close(self, key: str, *, ended_at: datetime, reason: str) -> None:
        opened = self.opened.get(key) or await self.open.find_one({"_id": key})
        if opened is None:
            return
        try:
            await self.ledger.insert_one(close_entry(opened, ended_at=max(ended_at, opened["started_at"]),
                                                     reason=reason))
        except DuplicateKeyError:
            pass
        await self.open.delete_one({"_id": key})
        self.opened.pop(key)
        await self.check_budgets(opened["project_id"])

    # Nodes -----------------------------------------------------------------------------------------------------

    async def node_state(self, event: NodeStateChanged) -> None:
        if event.state == "ready":
            await self._open_node(event.node_id, at=event.last_seen, source="ready")
            return
        async for opened in self.open.find({"node_id": event.node_id}, {"_id": 1}):
            await self._close(opened["_id"], ended_at=event.last_seen, reason="node_lost")
        await self._close_node(event.node_id, ended_at=event.last_seen, reason="node_lost")

    async def registered(self, event: NodeRegistered) -> None:
        """A node's kind, GPUs and price as its record has them: a rented node's are what placement rented it as
        (its provisioning, kept), a static node's its cluster-file entry's (the claims capped to it); a node with
        neither is not charged for or counted."""
        if self.node_info is None:
            return
        node = event.node
        known = await self._node_record(node.node_id)
        if known is not None and known.get("source") == "provisioned":
            await self._open_node(node.node_id, at=event.occurred_at, source="registered", info=known)
            return
        if self.static is not None:
            node, _ = admitted(node, self.static.get(node.node_id))
            if node is None:
                return
        info = {"kind": node.kind, "gpu_count": len(node.gpus), "price_per_hour": node.price_per_hour}
        # One write that keeps what else is known of the node (whose rented node it is); numbers and names only.
        info = self._node_written(node.node_id, await self.node_info.find_one_and_update(
            {"_id": node.node_id}, {"$set": info}, upsert=True, return_document=ReturnDocument.AFTER))
        await self._open_node(node.node_id, at=event.occurred_at, source="registered", info=info)

    async def provisioned(self, event: NodeProvisioned) -> None:
        if self.node_info is None:
            return
        info = {"kind": "on_demand", "gpu_count": event.gpu_count, "price_per_hour": event.price_per_hour,
                "project_id": event.project_id, "user_name": event.user_name, "for_job_id": event.for_job_id,
                "_id": event.node_id, "source": "provisioned"}
        await self.node_info.replace_one({"_id": event.node_id}, info, upsert=True)
        self._node_written(event.node_id, info)
        await self._open_node(event.node_id, at=event.provisioned_at, source="provisioned", info=info)

    async def released(self, event: NodeReleased) -> None:
        await self._close_node(event.node_id, ended_at=event.released_at, reason=f"released: {event.reason}")

    async def _open_node(self, node_id: str, *, at: datetime, source: str, info: dict | None = None) -> None:
        """Open a node's lifetime; `info` is what billing knows of the node (read when the caller has not)."""
        if self.node_info is None:
            return
        if info is None:  # a node turning ready: most often its lifetime is open since it registered
            if await self.nodes_open.find_one({"_id": node_id}, {"_id": 1}):
                return
            info = await self._node_record(node_id)
        if info is None:
            return
        opened = open_lifetime(node_id=node_id, kind=info["kind"], price_per_hour=info["price_per_hour"],
                               gpu_count=info["gpu_count"], started_at=at, project_id=info.get("project_id"),
                               user_name=info.get("user_name"), for_job_id=info.get("for_job_id"), source=source)
        if await self.nodes.find_one({"_id": lifetime_id(opened)}, {"_id": 1}):
            return  # this lifetime was already charged: the same event again
        try:
            await self.nodes_open.insert_one(opened)
        except DuplicateKeyError:
            pass  # already running

    async def _close_node(self, node_id: str, *, ended_at: datetime, reason: str) -> None:
        if self.nodes_open is None:
            return
        opened = await self.nodes_open.find_one({"_id": node_id})
        if opened is None:
            return
        line = close_lifetime(opened, ended_at=ended_at, reason=reason)
        try:
            await self.nodes.insert_one(line)
        except DuplicateKeyError:
            pass
        await self.nodes_open.delete_one({"_id": node_id})
        if opened.get("project_id"):
            await self.check_budgets(opened["project_id"])

    async def backfill_epochs(self) -> int:
        """Give lines written before reports summed on Unix seconds their t0/t1 (numbers: `$set` is safe)."""
        count = 0
        async for line in self.ledger.find({"t0": None}):
            await self.ledger.update_one({"_id": line["_id"]},
                                         {"$set": epoch_bounds(line["started_at"], line["ended_at"])})
            count += 1
        return count

    # Reports ---------------------------------------------------------------------------------------------------

    async def usage(self, query: UsageQuery) -> UsageReport:
        """Attempts and node lifetimes inside [start, end), running ones charged up to now."""
        now = self.clock()
        scope: dict[str, Any] = {"project_id": query.project_id} if query.project_id else {}
        if query.user_name:
            scope["user_name"] = query.user_name
        if query.job_id:
            scope["job_id"] = query.job_id
        inside, edges = window_filters(query.start, query.end)
        field = FIELD[query.group_by]
        tables: dict[str, Table] = {f: {} for f in {field, "user_name", "node_kind"}}
        for by, table in tables.items():
            for kind in KINDS:
                for doc in await self._group({**scope, **inside, "node_kind": kind}, by=by,
                                             nodes=kind == "on_demand"):
                    add_group(table, doc, kind=kind)
        fleet = scope == {}
        busy: dict[str, float] = {}
        per_node: dict[str, Sums] = {}
        if fleet:
            for (kind, _), s in tables["node_kind"].items():
                busy[kind] = busy.get(kind, 0.0) + s.gpu_hours
        else:
            for doc in await self._group(inside, by="node_kind"):
                busy[doc["_id"]] = doc["gpu_hours"]
        for doc in await self._group({**inside, "node_kind": "on_demand"}, by="node_id"):
            per_node[doc["_id"]] = Sums(attempts=doc["attempts"], seconds=doc["seconds"], cost=doc["cost"],
                                        gpu_hours=doc["gpu_hours"])
        extra = [d for e in edges async for d in self.ledger.find(e)]
        running = [close_entry(d, ended_at=max(now, d["started_at"]), reason="running")
                   async for d in self.open.find({})]
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
                per_node.setdefault(part["node_id"], Sums()).add(attempts=1, seconds=part["seconds"],
                                                                 gpu_hours=part["gpu_hours"], cost=part["cost"],
                                                                 nodes=())
        lifetimes = await self._lifetimes(query.start, query.end, now=now)
        idle = [p for p in idle_parts(lifetimes, per_node)
                if (not query.project_id or p.project_id == query.project_id)
                and (not query.user_name or p.user_name == query.user_name) and not query.job_id]
        total = (rows(tables[field], idle, group_by=None) or [UsageTotals()])[0]
        summary = on_demand(lifetimes, idle)
        if not fleet:
            summary = summary.model_copy(update={"nodes": total.on_demand_nodes, "seconds": total.on_demand_seconds,
                                                 "cost": total.on_demand_cost, "idle_cost": sum(p.cost for p in idle)})
        return UsageReport(
            project_id=query.project_id, start=query.start, end=query.end, total=total,
            by_user=rows(tables["user_name"], idle, group_by="user"),
            by_node_kind=rows(tables["node_kind"], idle, group_by="node_kind"),
            open_attempts=len(in_scope_running), group_by=query.group_by,
            groups=rows(tables[field], idle, group_by=query.group_by),
            owned=owned([line for line in lifetimes if line["node_kind"] in OWNED_KINDS], busy), on_demand=summary,
            gpus_in_use=sum(r["gpu_count"] for r in in_scope_running),
        )

    async def _group(self, match: dict[str, Any], *, by: str, nodes: bool = False) -> list[dict[str, Any]]:
        """Sums of closed attempts per value of one field, computed by the database."""
        group: dict[str, Any] = {"_id": f"${by}", "attempts": {"$sum": 1}, "seconds": {"$sum": "$seconds"},
                                 "gpu_hours": {"$sum": "$gpu_hours"}, "cost": {"$sum": "$cost"}}
        if nodes:
            group["nodes"] = {"$addToSet": "$node_id"}
        aggregate = getattr(self.ledger, "aggregate", None)
        if aggregate is not None:
            return [d async for d in await aggregate([{"$match": match}, {"$group": group}])]
        table: Table = {}  # in-memory twin (service tests): the same sums, here
        async for entry in self.ledger.find(match):
            add_entry(table, entry, by=by)
        return [{"_id": key, "attempts": s.attempts, "seconds": s.seconds, "gpu_hours": s.gpu_hours,
                 "cost": s.cost, "nodes": sorted(s.nodes)} for (key, _), s in table.items()]

    async def _lifetimes(self, start: datetime | None, end: datetime | None, *, now: datetime) -> list[dict]:
        """Node lifetimes clipped to the window, running ones up to now."""
        if self.nodes is None:
            return []
        overlap: dict[str, Any] = {}
        if start:
            overlap["ended_at"] = {"$gt": start}
        closed = [d async for d in self.nodes.find(overlap)]
        running = [close_lifetime(d, ended_at=max(now, d["started_at"]), reason="running")
                   async for d in self.nodes_open.find({})]
        return [part for line in closed + running if (part := clip(line, start=start, end=end))]

    # Quotas, admission, alerts ---------------------------------------------------------------------------------

    async def load_quotas(self, project_id: str) -> ProjectQuotas:
        if (known := self.known_quotas.get(project_id)) is not None:
            return known
        doc = await self.quotas.find_one({"_id": project_id}) if self.quotas is not None else None
        quotas = ProjectQuotas.model_validate(doc["quotas"]) if doc else ProjectQuotas()
        return self.known_quotas.put(project_id, quotas)

    async def set_quotas(self, request: QuotasRequest) -> QuotasReply:
        """Read, replace, or change one user's quotas of a project; answer with them and the month so far."""
        current = await self.load_quotas(request.project_id)
        if request.project is not None:
            current = request.project
        if request.user_name and request.user is not None:
            current = current.model_copy(update={"users": {**current.users, request.user_name: request.user}})
        if request.project is not None or request.user is not None:
            self.known_quotas.pop(request.project_id)  # a failed write leaves the next read to the database
            await self.quotas.replace_one({"_id": request.project_id},  # nx-27017 wants the _id in an upsert's doc
                                          {"_id": request.project_id, "quotas": current.model_dump()}, upsert=True)
            self.known_quotas.put(request.project_id, current)
            await self.check_budgets(request.project_id)
        month = policy.month_start(utcnow())
        report = await self.usage(UsageQuery(project_id=request.project_id, start=month))
        return QuotasReply(project_id=request.project_id, quotas=current, month_start=month, used=report.total,
                           used_by_user=report.by_user, gpus_in_use=report.gpus_in_use)

    async def admit(self, query: AdmitQuery) -> AdmitReply:
        """Allowed unless the project's or the user's quota or budget would be exceeded."""
        limits = await self.load_quotas(query.project_id)
        user_limits = limits.users.get(query.user_name)
        if not _limited(limits) and not (user_limits and _limited(user_limits)):
            return AdmitReply(allowed=True)
        if query.purpose == "submit" and query.estimated_cost == 0 and query.estimated_gpu_hours == 0 \
                and query.gpus == 0:
            return AdmitReply(allowed=True, limited=True)  # a first look: the caller prices the job next
        report = await self.usage(UsageQuery(project_id=query.project_id, start=policy.month_start(utcnow())))
        refusal = policy.check(limits, scope=query.project_id, used=report.total, gpus_in_use=report.gpus_in_use,
                               gpus_queued=await self._queued_gpus(query), query=query)
        if refusal is None and user_limits is not None:
            used = next((r for r in report.by_user if r.key == query.user_name), UsageTotals(key=query.user_name))
            gpus = sum([d["gpu_count"] async for d in self.open.find({"project_id": query.project_id,
                                                                      "user_name": query.user_name})])
            refusal = policy.check(user_limits, scope=f"{query.project_id}/{query.user_name}", used=used,
                                   gpus_in_use=gpus, gpus_queued=await self._queued_gpus(query, user=True),
                                   query=query)
        return (refusal or AdmitReply(allowed=True)).model_copy(update={"limited": True})

    async def _queued_gpus(self, query: AdmitQuery, *, user: bool = False) -> int:
        """GPUs the scope's jobs not finished and not running ask for; none for a node rented for a queued job (that
        job is the node's reason, counted by the node's GPUs)."""
        if query.purpose != "submit" or self.placements is None:
            return 0
        scope = {"project_id": query.project_id} | ({"user_name": query.user_name} if user else {})
        running = {d["job_id"] async for d in self.open.find(scope)}
        return await self.placements.unfinished_gpus(project_id=query.project_id,
                                                     user_name=query.user_name if user else None, running=running)

    async def check_budgets(self, project_id: str) -> None:
        """Raise the 80% and 100% alerts of the project's and its users' budgets, each once."""
        if self.quotas is None or self.alerts is None:
            return
        limits = await self.load_quotas(project_id)
        scopes = [(None, limits)] + [(u, q) for u, q in limits.users.items()]
        scopes = [(u, q) for u, q in scopes if q.budget_per_month is not None]
        if not scopes:
            return
        now = utcnow()
        report = await self.usage(UsageQuery(project_id=project_id, start=policy.month_start(now)))
        spent = {r.key: r.spend for r in report.by_user}
        for user, q in scopes:
            total = report.total.spend if user is None else spent.get(user, 0.0)
            for pct in policy.due_alerts(q, spent=total):
                await self._alert(project_id, user, pct=pct, budget=q.budget_per_month, spent=total,
                                  month=policy.month_key(now))

    async def _alert(self, project_id: str, user: str | None, *, pct: int, budget: float, spent: float,
                     month: str) -> None:
        """Raise one alert once: the record and its notification in one write (the relay publishes what a crash
        left unpublished); an alert already raised is not raised again."""
        event_id = f"budget:{project_id}:{user or '*'}:{month}:{budget:g}:{pct}"
        who = f"user {user} in project {project_id}" if user else f"project {project_id}"
        notification = Notification(event_id=event_id, project_id=project_id, job_id="", user_name=user or "",
                                    kind="budget", message=f"{who} has used {pct}% of its {month} budget: "
                                                           f"${spent:.4f} of ${budget:g}")
        raised = {"project_id": project_id, "user_name": user, "month": month, "budget": budget, "pct": pct}
        await self.alerts.save(event_id, raised, None, [notification])

    async def check_all_budgets(self) -> None:
        """Every project with a budget (running attempts spend without any event)."""
        async for doc in self.quotas.find({}):
            await self.check_budgets(doc["_id"])


def _limited(q: Any) -> bool:
    return any(v is not None for v in (q.max_gpus, q.gpu_hours_per_month, q.budget_per_month))
