"""The attempt ledger: a line opened when a placed task's start is seen, closed when its end is seen (or its node
is lost, or reconciliation finds its end report lost), each attempt charged exactly once. One document per attempt
and rank: inserted open (the same line seen again, open or closed, is refused by its id), replaced by its closed
line once; the open ones are also kept in memory, all of them (billing alone writes them, one leader at a time,
which reads them at its start), so nothing scans the ledger for what runs.

A task's start and end may come in either order: the bus keeps each job's events in order, but a delivery lost on
the way (a bus server killed under it) is delivered again after later ones were handled. An end that finds no line
is kept (`billing_ends`) until its start comes, which then writes the line closed."""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.clock import utcnow
from shared.events import JobPlaced, JobStatusChanged, JobSubmitted, NodeStateChanged, TaskExited, TaskStarted
from shared.grouped import insert_grouped, replace_grouped
from services.billing.ledger import CLOSED_ONLY, OPEN, STAMP, close_entry, epoch_bounds, open_entry
from services.billing.live import LiveLines
from services.billing.placements import (
    PARK_TTL_S,
    WRITE_WINDOW_S,
    Placements,
    attempt_key,
    charged_from,
    completed_first_time,
    missed_end,
    rank_terms,
)
from services.billing.records import NodeRecords, as_read

log = logging.getLogger(__name__)

Spent = Callable[[str], Awaitable[None]]  # told the project whose money a closed line spent


async def move_open_lines(old: AsyncCollection, ledger: AsyncCollection) -> int:
    """Lines kept open in a collection of their own (before the ledger kept them, open) moved into the ledger,
    before `Attempts.load`; a line already there (moved by a start that died before the delete) stands."""
    moved = 0
    async for line in old.find({}):
        try:
            await ledger.insert_one({**line, OPEN: True})
            moved += 1
        except DuplicateKeyError:
            pass
        await old.delete_one({"_id": line["_id"]})
    return moved


@dataclass
class Attempts:
    ledger: AsyncCollection  # every attempt's line: open while it runs, then closed
    placements: Placements  # what placement decided: the only attempts that are charged
    records: NodeRecords  # each node's price where a placement did not record it
    spent: Spent  # an attempt closed: its project's budgets are looked at
    ends: AsyncCollection  # ends seen before their start (`ended_first`): one per line, until its start comes
    reconcile_grace_s: float = 60.0  # how long a job's status may say an attempt ended before billing closes it
    clock: Callable[[], datetime] = utcnow  # billing's own now: no report is charged past it
    # Every open line, as written (`load` reads them at the start), and the closed ones being written or just written:
    # what runs, for the ends, reports and admission.
    live: LiveLines = field(default_factory=LiveLines, repr=False)
    # Every end kept in `ends`, as written (`load` reads them): a start that finds its end here writes its line closed.
    ended_first: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    # Lines whose insert raised here (the answer lost, or the write group failed after it landed): stored or not.
    unanswered: set[str] = field(default_factory=set, repr=False)

    @property
    def running(self) -> dict[str, dict]:
        """Every open line, by id."""
        return self.live.running

    async def load(self) -> int:
        """At the start, before any event: the open lines into memory, the latest stamp (closes stamp after it).
        Returns how many attempts run."""
        self.running.clear()
        self.running.update({d["_id"]: d async for d in self.ledger.find({OPEN: True})})
        async for latest in self.ledger.find({STAMP: {"$gt": 0}}, {STAMP: 1}).sort(STAMP, -1).limit(1):
            self.live.resume(latest[STAMP])
        self.ended_first.clear()
        self.ended_first.update({d["_id"]: d async for d in self.ends.find({})})
        return len(self.running)

    async def submitted(self, event: JobSubmitted) -> None:
        await self.placements.submitted(event)

    async def placed(self, event: JobPlaced) -> None:
        """Learn where each rank of the attempt runs; charge what its nodes reported before this arrived."""
        for waiting, at in await self.placements.placed(event):
            await (
                self.started(waiting, seen=at) if isinstance(waiting, TaskStarted) else self.exited(waiting, seen=at)
            )
            await self.placements.unpark(waiting)
        self.placements.settled(event)

    async def started(self, event: TaskStarted, *, seen: datetime | None = None) -> None:
        """Open the attempt's line when its start is seen (`seen`: when the platform recorded the report, else
        now); the times, price, GPU counts and owner the agent reports are not read."""
        seen = self._seen(seen)
        placement = await self.placements.check(event, seen=seen)
        if placement is None:
            return
        info = await self.records.get(event.node_id)
        entry = open_entry(
            key={"job_id": event.job_id, "attempt": event.attempt, "rank": event.rank},
            terms=rank_terms(placement, event.rank, info),
            **await self._owner(event.job_id, placement),
            started_at=charged_from(placement, seen=seen),
        )
        if entry["_id"] in self.running or self._closed_here(entry["_id"], attempt_key(event.job_id, event.attempt)):
            return
        if (end := self.ended_first.get(entry["_id"])) is not None:
            await self._open_after_end(entry, end)
            return
        try:
            inserted = await insert_grouped(self.ledger, entry, window_s=WRITE_WINDOW_S)  # with others starting then
        except Exception:
            self.unanswered.add(entry["_id"])
            raise
        if inserted:
            self.running[entry["_id"]] = as_read(self.ledger, entry)
        elif entry["_id"] in self.unanswered and (  # it landed after all: the stored line, still open, is ours
            stored := await self.ledger.find_one({"_id": entry["_id"], OPEN: True})
        ):
            self.running[entry["_id"]] = stored
        # else opened, or opened and closed, by an earlier delivery this process (or its `load`) knows of
        self.unanswered.discard(entry["_id"])
        if entry["_id"] in self.running:
            await self.placements.opened_after_status(event.job_id, seen=seen.timestamp())

    async def exited(self, event: TaskExited, *, seen: datetime | None = None) -> None:
        """Close the attempt's line when its end is seen; the end time the agent reports is not read."""
        seen = self._seen(seen)
        if await self.placements.check(event, seen=seen) is None:
            return
        key = f"{event.job_id}:{event.attempt}:{event.rank}"
        if key not in self.running and not await self._opened_elsewhere(key):
            await self._end_first(key, event, seen=seen)
            return
        await self._close(key, ended_at=seen, reason=event.reason)

    async def job_status(self, event: JobStatusChanged) -> None:
        """Keep what the status says of the attempts' ends, for reconciliation; not at all for a job that asks
        for no GPUs and completed in its first attempt with none of its lines open (nothing would read it: its
        record stays as submitted, unfinished and of no GPUs)."""
        if (
            completed_first_time(event)
            and self.placements.asks_no_gpus(event.job_id)
            and not any(line["job_id"] == event.job_id for line in self.running.values())
        ):
            self.placements.noted(event)
            return
        await self.placements.status(event, seen=utcnow().timestamp())

    async def node_state(self, event: NodeStateChanged) -> None:
        """A node lost: its running attempts end at its last sign of life."""
        if event.state == "ready":
            return
        for line_id in [k for k, line in self.running.items() if line["node_id"] == event.node_id]:
            await self._close(line_id, ended_at=event.last_seen, reason="node_lost")

    async def reconcile(self, *, now: datetime | None = None) -> int:
        """Close the open attempts whose end report never came, though the job's status says they ended (finished
        job, or attempt moved on) at least `reconcile_grace_s` ago: at the end the status gives. Idempotent: an
        end report that comes later finds nothing open."""
        now = now or self.clock()
        await self._settle_doubts()
        closed = 0
        running = [line for key, line in self.running.items() if key not in self.live.doubt]
        ids = sorted({d["job_id"] for d in running})
        jobs = {j["_id"]: j async for j in self.placements.jobs.find({"_id": {"$in": ids}})} if ids else {}
        for opened in running:
            end = missed_end(
                jobs.get(opened["job_id"]),
                attempt=opened["attempt"],
                now=now.timestamp(),
                grace_s=self.reconcile_grace_s,
            )
            if end is not None:
                await self._close(opened["_id"], ended_at=datetime.fromtimestamp(end, UTC), reason="reconciled")
                closed += 1
        if closed:
            log.warning("%d open attempts closed by reconciliation: their end reports were lost", closed)
        await self._forget_old_ends(now)
        return closed

    async def backfill_epochs(self) -> int:
        """Give lines written before reports summed on Unix seconds their t0/t1 (numbers: `$set` is safe), and
        those written before closes were stamped their stamp, 0 (summed by every report): one look through the
        ledger at the start. Returns how many lines were given either."""
        count = 0
        async for line in self.ledger.find({"$or": [{"t0": None}, {STAMP: None}], **CLOSED_ONLY}):
            missing = epoch_bounds(line["started_at"], line["ended_at"]) if line.get("t0") is None else {}
            if line.get(STAMP) is None:
                missing[STAMP] = 0.0
            await self.ledger.update_one({"_id": line["_id"]}, {"$set": missing})
            self.live.generation += 1  # a line the sums left out (no stamp) now in them
            count += 1
        return count

    async def _owner(self, job_id: str, placement: dict[str, Any]) -> dict[str, Any]:
        """Whose attempt it is: as its placement recorded; where the placement came before the job's submission
        (a delivery of the submission lost, then delivered again), from the submission as stored since."""
        if placement.get("project_id") is not None:
            return {"project_id": placement["project_id"], "user_name": placement.get("user_name")}
        owner = self.placements.owners.get(job_id) or await self.placements.jobs.find_one({"_id": job_id}) or {}
        return {"project_id": owner.get("project_id"), "user_name": owner.get("user_name")}

    async def _opened_elsewhere(self, key: str) -> bool:
        """Whether an end that finds no line open here meets a line anyway: closed already (an end seen again, a
        node lost, reconciliation), or one whose insert raised here and landed (it is then closed as open)."""
        if key in self.ended_first:
            return True
        if (closed_here := self.placements.first_placed.get(key.rsplit(":", 1)[0])) is not None:
            return key in closed_here  # placed here first: no line of it was opened but here
        stored = await self.ledger.find_one({"_id": key})
        if stored is not None and stored.get(OPEN):
            self.running[key] = stored
        return stored is not None

    async def _end_first(self, key: str, event: TaskExited, *, seen: datetime) -> None:
        """An end whose start has not been seen (a task that never started, or a start delivered again after its
        end): kept for the start, which writes the line closed; forgotten after `PARK_TTL_S`."""
        end = {"_id": key, "job_id": event.job_id, "t": seen.timestamp(), "reason": event.reason}
        if not await insert_grouped(self.ends, end, window_s=WRITE_WINDOW_S):
            end = await self.ends.find_one({"_id": key}) or end  # an earlier delivery's stands
        self.ended_first[key] = end
        log.info("end of attempt line %s seen before its start: kept for it", key)

    async def _open_after_end(self, entry: dict[str, Any], end: dict[str, Any]) -> None:
        """A start whose end was seen first: its line written closed, at that end, once."""
        ended_at = max(datetime.fromtimestamp(end["t"], UTC), entry["started_at"])
        with self.live.closing(close_entry(as_read(self.ledger, entry), ended_at=ended_at, reason=end["reason"])) as w:
            # refused: written by an earlier delivery, or by this one's write whose answer was lost (its stamp)
            w.refused = not await insert_grouped(self.ledger, w.line, window_s=WRITE_WINDOW_S)
            if w.refused and w.again:
                stored = await self.ledger.find_one({"_id": w.line["_id"]})
                w.refused = stored is None or stored.get(STAMP) != w.line[STAMP]
        await self.ends.delete_one({"_id": entry["_id"]})
        self.ended_first.pop(entry["_id"], None)
        self._mark_closed(entry)
        log.info("attempt line %s written closed: its end had come first", entry["_id"])
        await self.spent(entry["project_id"])

    async def _settle_doubts(self) -> None:
        """Lines whose closed write raised and was not written again since (its retry given up, or still waiting):
        the ledger says whether it landed; if so the line is no longer open here, else it is open again."""
        for key, line in list(self.live.doubt.items()):
            stored = await self.ledger.find_one({"_id": key})
            if self.live.doubt.get(key) is not line:  # written again meanwhile
                continue
            if self.live.settle(key, stored) and (opened := self.running.pop(key, None)) is not None:
                self._mark_closed(opened)
                log.info("attempt line %s: its close, whose answer was lost, had landed", key)

    async def _forget_old_ends(self, now: datetime) -> None:
        """Ends whose start never came within `PARK_TTL_S` (a task that failed before it started): never will."""
        cutoff = now.timestamp() - PARK_TTL_S
        if stale := [k for k, end in self.ended_first.items() if end["t"] < cutoff]:
            await self.ends.delete_many({"_id": {"$in": stale}})
            for key in stale:
                self.ended_first.pop(key, None)

    def _seen(self, seen: datetime | None) -> datetime:
        """When the platform recorded an event (the bus server's time), never later than billing's own now."""
        now = self.clock()
        return min(seen, now) if seen is not None else now

    def _closed_here(self, line_id: str, attempt: str) -> bool:
        """Whether this process closed the line (known for an attempt whose placement it stored first): a start
        seen again is not even sent to the ledger, which would refuse it."""
        return line_id in (self.placements.first_placed.get(attempt) or ())

    async def _close(self, key: str, *, ended_at: datetime, reason: str) -> None:
        """The open line replaced by its closed one, once (a line closed already is no longer open: nothing)."""
        opened = self.running.get(key)
        if opened is None:
            return
        line = close_entry(opened, ended_at=max(ended_at, opened["started_at"]), reason=reason)
        with self.live.closing(line) as write:  # stamped: reports see it open or closed, never neither nor both
            await replace_grouped(self.ledger, {"_id": key, OPEN: True}, write.line, window_s=WRITE_WINDOW_S)
            self.running.pop(key, None)
        self._mark_closed(opened)
        await self.spent(opened["project_id"])

    def _mark_closed(self, line: dict[str, Any]) -> None:
        """Known here from now: the line was closed (for an attempt whose placement this process stored first)."""
        if (closed_here := self.placements.first_placed.get(attempt_key(line["job_id"], line["attempt"]))) is not None:
            closed_here.add(line["_id"])
