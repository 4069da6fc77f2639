"""The monitor's view of the fleet in memory: every node's record, when it was last heard, what the database has.

Heartbeats land here and nowhere else unless they change something (`nodes.changed`); the database gets a node's
last_seen in bulk every `persist_every_s` (a restarted monitor then knows roughly when each node was last heard)
and every other change at once, with its events. No I/O here: `Monitor` reads and writes, this only remembers.
"""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from services.monitor.nodes import NodeRecord, overdue, stale


@dataclass
class Fleet:
    persist_every_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    records: dict[str, NodeRecord] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)  # monotonic seconds of the last heartbeat received
    stored_seen: dict[str, datetime] = field(default_factory=dict)  # last_seen as the database has it
    dirty: set[str] = field(default_factory=set)  # nodes whose stored last_seen is `stale`
    caught_up_at: float = field(default=0.0)  # when the heartbeat intake last had nothing waiting
    _order: list[str] | None = None

    def __post_init__(self) -> None:
        self.caught_up_at = self.clock()

    def loaded(self, node: NodeRecord) -> None:
        """A node read from the database at start: heard now (silence is counted from our own start)."""
        self.stored(node)
        self.heard[node.node_id] = self.clock()

    def stored(self, node: NodeRecord) -> None:
        """The database holds this record now (a node new to us counts as heard now)."""
        if node.node_id not in self.records:
            self._order = None
            self.heard.setdefault(node.node_id, self.clock())
        self.records[node.node_id] = node
        self.stored_seen[node.node_id] = node.last_seen
        self.dirty.discard(node.node_id)

    def beat(self, node: NodeRecord) -> bool:
        """A heartbeat changed only the liveness clock: keep it in memory; True when its stored last_seen is stale
        (then it is written with the next bulk)."""
        self.records[node.node_id] = node
        if stale(self.stored_seen.get(node.node_id), node.last_seen, every_s=self.persist_every_s):
            self.dirty.add(node.node_id)
            return True
        return False

    def size(self) -> int:
        """Nodes not given back (lost ones count: they may come back, at the interval they were told)."""
        return sum(1 for r in self.records.values() if r.state != "released")

    def hear(self, node_id: str) -> None:
        self.heard[node_id] = self.clock()

    def caught_up(self) -> None:
        """Every heartbeat that reached this process has been read."""
        self.caught_up_at = self.clock()

    def gone(self, node_ids: Iterable[str]) -> frozenset[str]:
        """Those of the nodes this monitor holds as lost or released (a node it never heard of is not gone)."""
        return frozenset(n for n in node_ids if n in self.records and self.records[n].state != "ready")

    def silences(self, node_ids: Iterable[str]) -> dict[str, int]:
        """Each node's silences as it last reported them (0 for a node never heard): what its starts carry."""
        return {n: self.records[n].silences if n in self.records else 0 for n in node_ids}

    def overdue(self, timeout_s: float, among: Iterable[str] | None = None) -> list[str]:
        """Ready nodes (of `among`, or all) silent past the timeout, judged as of when the intake was caught up."""
        ids = self.records if among is None else among
        ready = [n for n in ids if n in self.records and self.records[n].state == "ready"]
        return overdue(self.heard, ready, caught_up_at=self.caught_up_at, timeout_s=timeout_s)

    def take_dirty(self) -> list[NodeRecord]:
        """The records whose last_seen is to be written now (they count as written)."""
        taken = [self.records[n] for n in self.dirty if n in self.records]
        for node in taken:
            self.stored_seen[node.node_id] = node.last_seen
        self.dirty.clear()
        return taken

    def page(self, *, offset: int, limit: int) -> tuple[int, list[NodeRecord]]:
        """The total and one page of nodes by id."""
        if self._order is None:
            self._order = sorted(self.records)
        return len(self._order), [self.records[n] for n in self._order[offset : offset + limit]]
