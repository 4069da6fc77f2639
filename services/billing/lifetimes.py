"""Node lifetimes recorded exactly once: a rented node is charged from provisioning to release, an owned node
offers capacity from registration (or turning ready) to its loss. One open record per node, one closed line per
lifetime (its id names the node and the moment it began), so the same event seen again never charges twice."""

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.clock import utcnow
from shared.events import NodeProvisioned, NodeRegistered, NodeReleased, NodeStateChanged
from services.billing.ledger import close_lifetime, lifetime_id, open_lifetime
from services.billing.records import NodeRecords

Spent = Callable[[str], Awaitable[None]]  # told the project whose money a closed line spent


@dataclass
class Writes:
    """The lifetimes' writes this process made (`generation`: begun) and has under way: while none is under way and
    none began since a read, the lifetimes read are as stored (`Reports` reuses them)."""

    generation: int = 0
    under_way: int = 0

    @contextmanager
    def writing(self) -> Iterator[None]:
        self.generation += 1
        self.under_way += 1
        try:
            yield
        finally:
            self.under_way -= 1
            self.generation += 1


@dataclass
class Lifetimes:
    nodes: AsyncCollection  # closed node lifetimes
    nodes_open: AsyncCollection  # node lifetimes still running
    records: NodeRecords  # each node's kind, GPUs and price, for whom
    spent: Spent  # a rented node's lifetime closed: its project's budgets are looked at
    clock: Callable[[], datetime] = utcnow  # billing's own now: no registration opens a lifetime later than it
    writes: Writes = field(default_factory=Writes)  # shared with `Reports`

    async def node_state(self, event: NodeStateChanged) -> None:
        """A node ready opens its lifetime (if none runs); a node lost closes it at its last sign of life."""
        if event.state == "ready":
            await self._open(event.node_id, at=event.last_seen, source="ready")
            return
        await self._close(event.node_id, ended_at=event.last_seen, reason="node_lost")

    async def registered(self, event: NodeRegistered, *, seen: datetime | None = None) -> None:
        """Charged as its record says (`NodeRecords.registered`) from when the platform recorded the registration
        (`seen`: the bus server's time, never later than billing's now), not from the time its agent states; a
        node with no record is not charged or counted."""
        info = await self.records.registered(event.node)
        if info is not None:
            now = self.clock()
            at = min(seen, now) if seen is not None else now
            await self._open(event.node.node_id, at=at, source="registered", info=info)

    async def provisioned(self, event: NodeProvisioned) -> None:
        info = await self.records.provisioned(event)
        await self._open(event.node_id, at=event.provisioned_at, source="provisioned", info=info)

    async def released(self, event: NodeReleased) -> None:
        await self._close(event.node_id, ended_at=event.released_at, reason=f"released: {event.reason}")
        await self.records.released(event.node_id)

    async def _open(self, node_id: str, *, at: datetime, source: str, info: dict[str, Any] | None = None) -> None:
        """Open a node's lifetime; `info` is what billing knows of the node (read when the caller has not)."""
        if info is None:  # a node turning ready: most often its lifetime is open since it registered
            if await self.nodes_open.find_one({"_id": node_id}, {"_id": 1}):
                return
            info = await self.records.get(node_id)
        if info is None or info.get("released"):  # a rented node given back is charged no more
            return
        opened = open_lifetime(
            node_id=node_id,
            kind=info["kind"],
            price_per_hour=info["price_per_hour"],
            gpu_count=info["gpu_count"],
            started_at=at,
            project_id=info.get("project_id"),
            user_name=info.get("user_name"),
            for_job_id=info.get("for_job_id"),
            source=source,
        )
        if await self.nodes.find_one({"_id": lifetime_id(opened)}, {"_id": 1}):
            return  # this lifetime was already charged: the same event again
        try:
            with self.writes.writing():
                await self.nodes_open.insert_one(opened)
        except DuplicateKeyError:
            pass  # already running

    async def _close(self, node_id: str, *, ended_at: datetime, reason: str) -> None:
        opened = await self.nodes_open.find_one({"_id": node_id})
        if opened is None:
            return
        line = close_lifetime(opened, ended_at=ended_at, reason=reason)
        with self.writes.writing():
            try:
                await self.nodes.insert_one(line)
            except DuplicateKeyError:
                pass
            await self.nodes_open.delete_one({"_id": node_id})
        if opened.get("project_id"):
            await self.spent(opened["project_id"])
