"""Billing's service layer: record attempts exactly once, close them on exit or node loss, report usage."""
from dataclasses import dataclass
from datetime import datetime

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.clock import utcnow
from shared.events import NodeStateChanged, TaskExited, TaskStarted
from shared.rpc import UsageQuery, UsageReport, UsageTotals
from services.billing.ledger import clip, close_entry, open_entry, totals


@dataclass
class Billing:
    ledger: AsyncCollection
    open: AsyncCollection

    async def started(self, event: TaskStarted) -> None:
        entry = open_entry(event)
        if await self.ledger.find_one({"_id": entry["_id"]}, {"_id": 1}):
            return
        try:
            await self.open.insert_one(entry)
        except DuplicateKeyError:
            pass

    async def exited(self, event: TaskExited) -> None:
        await self._close(f"{event.job_id}:{event.attempt}:{event.rank}", ended_at=event.ended_at,
                          reason=event.reason)

    async def node_state(self, event: NodeStateChanged) -> None:
        if event.state != "lost":
            return
        async for opened in self.open.find({"node_id": event.node_id}, {"_id": 1}):
            await self._close(opened["_id"], ended_at=event.last_seen, reason="node_lost")

    async def _close(self, key: str, *, ended_at: datetime, reason: str) -> None:
        opened = await self.open.find_one({"_id": key})
        if opened is None:
            return
        try:
            await self.ledger.insert_one(close_entry(opened, ended_at=max(ended_at, opened["started_at"]),
                                                     reason=reason))
        except DuplicateKeyError:
            pass
        await self.open.delete_one({"_id": key})

    async def usage(self, query: UsageQuery) -> UsageReport:
        match = {"project_id": query.project_id} if query.project_id else {}
        if query.end:
            match["started_at"] = {"$lt": query.end}
        closed = [d async for d in self.ledger.find({**match, **({"ended_at": {"$gte": query.start}}
                                                                 if query.start else {})})]
        now = utcnow()
        running = [close_entry(d, ended_at=now, reason="running") async for d in self.open.find(match)]
        entries = [c for e in closed + running if (c := clip(e, start=query.start, end=query.end))]
        return UsageReport(
            project_id=query.project_id, start=query.start, end=query.end,
            total=(totals(entries) or [UsageTotals()])[0],
            by_user=totals(entries, by="user_name"),
            by_node_kind=totals(entries, by="node_kind"),
            open_attempts=len(running),
        )
