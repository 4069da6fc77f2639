"""Which attempts billing may charge: those placement made, as reported by an agent of the node each rank was
placed on. A task event that arrives before the placement it refers to waits here (parked, bounded in number and
age) and is replayed when the placement comes, instead of being lost or charged on its own word."""

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.events import JobPlaced, JobStatusChanged, JobSubmitted, TaskExited, TaskStarted
from shared.grouped import insert_grouped, update_grouped
from shared.jobs import Phase
from shared.lru import Lru

log = logging.getLogger(__name__)

TaskEvent = Annotated[TaskStarted | TaskExited, Field(discriminator="type")]
TASK_EVENT = TypeAdapter(TaskEvent)
PARK_MAX = 10_000  # events waiting for a placement; beyond it the newest is dropped (a flood, not a delay)
PARK_PER_NODE = 1_000  # of them, one node's: a node reporting attempts never placed cannot crowd out the others'
PARK_TTL_S = 3600.0  # a placement never lags its tasks this long: what waited longer was never placed
REMEMBERED = 4096  # placements kept in memory
# A task event the bus recorded this long before its attempt's placement was made (by placement's clock) is no
# report of that attempt: its node spoke before anything was placed (an end parked ahead of the placement closed
# the attempt's line at its start, and the real start and end were then ignored: hours run, nothing charged).
PLACED_SKEW_S = 10.0  # placement's clock against the bus server's: hosts kept by NTP differ by far less
# A record or ledger line waits this long for others before it is written (`shared.grouped`'s window): billing is
# no step between a submission and its start, so a job's four writes can wait; at a few jobs a second each went
# alone. Each event is acknowledged once its write landed, as before.
WRITE_WINDOW_S = 0.2
Verdict = Literal["charge", "park", "drop"]


def attempt_key(job_id: str, attempt: int) -> str:
    return f"{job_id}:{attempt}"


def placement_doc(event: JobPlaced, owner: dict[str, Any] | None) -> dict[str, Any]:
    """What billing keeps of a placement: each rank's node with its kind, GPUs and price as placement recorded
    them, when placement made it (Unix seconds; no attempt is charged from before), and whose job it is (from its
    submission)."""
    gpus = event.launch.spec.resource.gpu_count
    return {
        "_id": attempt_key(event.job_id, event.attempt),
        "job_id": event.job_id,
        "attempt": event.attempt,
        "nodes": {str(a.rank): a.node_id for a in event.assignments},
        "terms": {
            str(a.rank): {
                "node_id": a.node_id,
                "node_kind": a.node_kind,
                "price_per_hour": a.price_per_hour,
                "node_gpu_count": a.node_gpu_count,
                "gpu_count": len(a.gpu_indices) or gpus,
            }
            for a in event.assignments
        },
        "placed_t": event.occurred_at.timestamp(),
        "project_id": (owner or {}).get("project_id"),
        "user_name": (owner or {}).get("user_name"),
    }


def rank_terms(placement: dict[str, Any], rank: int, node: dict[str, Any] | None) -> dict[str, Any]:
    """The node, kind, GPUs and price a rank is charged at: placement's record of it; what billing recorded of the
    node (`node`: provisioning or registration, capped to the fleet's records) where the placement did not say
    (one made before placements carried them). Never what the node's agent reports of itself."""
    terms = dict((placement.get("terms") or {}).get(str(rank)) or {})
    node = node or {}
    node_id = terms.get("node_id") or placement["nodes"][str(rank)]
    return {
        "node_id": node_id,
        "node_kind": terms.get("node_kind") or node.get("kind", ""),
        "price_per_hour": terms["price_per_hour"]
        if terms.get("price_per_hour") is not None
        else float(node.get("price_per_hour", 0.0)),
        "node_gpu_count": terms.get("node_gpu_count") or node.get("gpu_count", 0),
        "gpu_count": terms.get("gpu_count", 0),
    }


def charged_from(placement: dict[str, Any], *, seen: datetime) -> datetime:
    """When a task began, for billing: when its first report was seen, never before placement made the attempt."""
    placed = placement.get("placed_t")
    return max(seen, datetime.fromtimestamp(placed, UTC)) if placed is not None else seen


def verdict(placement: dict[str, Any] | None, event: TaskStarted | TaskExited) -> Verdict:
    """Charge what the placed node reports; wait for a placement not seen yet; drop a report from anywhere else."""
    if placement is None:
        return "park"
    return "charge" if placement["nodes"].get(str(event.rank)) == event.node_id else "drop"


def status_update(event: JobStatusChanged, *, seen: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) that keep on the job's record what its status says of its attempts' ends (Unix seconds:
    a `$set` datetime is a string on nx-27017), if the status is newer than the one kept; the record is created
    if billing has not seen the job's submission yet."""
    ends = {str(a.attempt): a.ended_at.timestamp() for a in event.attempts if a.ended_at}
    final = event.end_time.timestamp() if event.phase.is_finished() and event.end_time else None
    return {"_id": event.job_id, **newer_than(event.version)}, {
        "$set": {
            "version": event.version,
            "attempt": event.attempt,
            "final_at": final,
            "ends": ends,
            "seen_at": seen,
            "finished": event.phase.is_finished(),
        },
        "$setOnInsert": {"project_id": event.project_id, "user_name": event.user_name},
    }


def newer_than(version: int) -> dict[str, Any]:
    """The filter of a job's record that holds an older status than `version` (or none yet)."""
    return {"$or": [{"version": {"$lt": version}}, {"version": {"$exists": False}}]}


def status_said(event: JobStatusChanged) -> dict[str, Any]:
    """What of a status billing keeps (its attempt, the attempts' ends, the final end, finished), as `status_update`
    writes it."""
    _, update = status_update(event, seen=0.0)
    return {k: v for k, v in update["$set"].items() if k not in ("version", "seen_at")}


def nothing_new(said: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether a status says nothing of how the job's attempts ended that the kept one did not. The attempt it is
    at alone is no news: it is read only beside an end (`missed_end`, with `final_at`), and each status that
    carries one carries its attempt too, so a job moving to its next attempt is not written."""
    return {k: v for k, v in said.items() if k != "attempt"} == {k: v for k, v in kept.items() if k != "attempt"}


def completed_first_time(event: JobStatusChanged) -> bool:
    """Whether a status completes its job in its first and only attempt: every rank of it started before this
    status in the job's order (the monitor completes a job only once each of its tasks started and exited 0), so
    no line of it opens after the status; what reconciliation would read of it is then never read, but for a
    line still open when it comes."""
    return event.phase == Phase.COMPLETED and event.attempt == 1 and all(a.attempt == 1 for a in event.attempts)


SUBMITTED_SAYS: dict[str, Any] = {
    "attempt": 0,
    "final_at": None,
    "ends": {},
    "finished": False,
}  # a record as submission stores it


def missed_end(job: dict[str, Any] | None, *, attempt: int, now: float, grace_s: float) -> float | None:
    """When an attempt still open in billing ended, by the job's status, if billing has known it for `grace_s`
    (its own end report is then lost: a service killed mid-ack); None while the attempt may still run."""
    if job is None or now - job.get("seen_at", now) < grace_s:
        return None
    end = (job.get("ends") or {}).get(str(attempt))
    if end is None and job.get("final_at") is not None and attempt <= job.get("attempt", 0):
        end = job["final_at"]  # the job finished with this attempt (or after it) still open
    return end


@dataclass
class Placements:
    jobs: AsyncCollection  # job id → project and user, from JobSubmitted
    attempts: AsyncCollection  # "job:attempt" → each rank's node, from JobPlaced
    parked: AsyncCollection  # task events that came before their placement
    # The latest placements as written or read (billing alone writes them, and a placement never changes once
    # made): a task's start and end are checked against it without a read.
    known: Lru[str, dict[str, Any]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    # Whose each job is, from its submission as billing stored it (never changes): read at its placement.
    owners: Lru[str, dict[str, Any]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    # The attempts some task event waits for: read from the collection at the first use (this process leads by
    # then; a leader that loses its lease exits), then kept as billing parks them, so a placement nothing waits
    # for reads nothing. A key is dropped once its placement's events are all taken off.
    waiting_for: set[str] | None = field(default=None, repr=False)
    _reading_waiting: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # read once, whoever asks
    # Each job's newest status as kept here (version, what it says): a status that says nothing new, or an older
    # one, is not written (each job's events come in order; a restarted billing writes the first it sees).
    statuses: Lru[str, tuple[int, dict[str, Any]]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    # The attempts whose placement this process stored first, with the lines of theirs it closed since: no line of
    # such an attempt was opened before (a task event before its placement waits), so whether one was closed is
    # known here without a read of the ledger (`Attempts.started`).
    first_placed: Lru[str, set[str]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)

    async def submitted(self, event: JobSubmitted) -> None:
        """Whose job it is, and the GPUs it asks for until it finishes (`max_gpus` counts queued jobs too)."""
        resource = event.spec.resource
        record = {
            "_id": event.job_id,
            "project_id": event.project_id,
            "user_name": event.user_name,
            "finished": False,
            "version": 0,
            "gpus": resource.gpu_count * resource.node_count,
        }
        if not await insert_grouped(self.jobs, record, window_s=WRITE_WINDOW_S):  # with other jobs' submitted then
            return  # the stored record stands (it is read when needed)
        self.owners.put(
            event.job_id, {"project_id": event.project_id, "user_name": event.user_name, "gpus": record["gpus"]}
        )
        self.statuses.put(event.job_id, (0, SUBMITTED_SAYS))

    def asks_no_gpus(self, job_id: str) -> bool:
        """Whether the job, as this process stored its submission, asks for no GPUs (`unfinished_gpus` counts none
        of it, finished or not); False where this process did not store it."""
        return (self.owners.get(job_id) or {}).get("gpus") == 0

    def noted(self, event: JobStatusChanged) -> None:
        """A status kept in memory only (its record needs it not): an older or repeated one is not written."""
        self.statuses.put(event.job_id, (event.version, status_said(event)))

    async def opened_after_status(self, job_id: str, *, seen: float) -> None:
        """A line of the job opened after its completion was kept in memory only (its start delivered again after
        the completion): what `statuses` keeps of it is written now, as of `seen`, so that reconciliation closes
        the line if its end never comes (a status kept there that the record holds already finds it as new)."""
        kept = self.statuses.get(job_id)
        if kept is None or not kept[1].get("finished"):
            return
        version, said = kept
        self.statuses.pop(job_id)
        update = {"$set": {"version": version, **said, "seen_at": seen}}
        await update_grouped(self.jobs, [({"_id": job_id, **newer_than(version)}, update)], window_s=WRITE_WINDOW_S)

    async def unfinished_gpus(
        self, *, project_id: str, user_name: str | None = None, running: Collection[str] = ()
    ) -> int:
        """GPUs the scope's jobs not finished ask for, but for the `running` ones (their attempts count them). Only
        jobs that ask for GPUs are read: a record of one that asks for none may stay unfinished (`job_status`)."""
        scope = {"project_id": project_id, "finished": False, "gpus": {"$gt": 0}} | (
            {"user_name": user_name} if user_name else {}
        )
        return sum([d.get("gpus", 0) async for d in self.jobs.find(scope, {"gpus": 1}) if d["_id"] not in running])

    async def status(self, event: JobStatusChanged, *, seen: float) -> None:
        """Keep what the job's newest status says of how its attempts ended (for reconciliation): one conditional
        write; an older or repeated status finds the record newer (the upsert then meets the record's id). A
        status that says nothing new of the attempts' ends (`nothing_new`) is not written."""
        said, kept = status_said(event), self.statuses.get(event.job_id)
        if kept is not None and (event.version <= kept[0] or nothing_new(said, kept[1])):
            if event.version > kept[0]:
                self.statuses.put(event.job_id, (event.version, said))  # nothing new, and the record's seen_at
            return  # stays when billing first learned it
        query, update = status_update(event, seen=seen)
        if await update_grouped(self.jobs, [(query, update)], upsert=True, window_s=WRITE_WINDOW_S):  # with others
            self.statuses.pop(event.job_id)  # a newer one is stored: read it when it matters
            return
        self.statuses.put(event.job_id, (event.version, said))

    async def placed(self, event: JobPlaced) -> list[tuple[TaskStarted | TaskExited, datetime]]:
        """Record the placement; return the task events that were waiting for it, starts before ends, each with
        when it was seen."""
        owner = self.owners.get(event.job_id) or await self.jobs.find_one({"_id": event.job_id})
        doc = placement_doc(event, owner)
        if await insert_grouped(self.attempts, doc, window_s=WRITE_WINDOW_S):  # never changes once made: stored once
            self.first_placed.put(doc["_id"], set())
            self.known.put(doc["_id"], doc)
        elif (
            self.known.get(doc["_id"]) is None
            and (stored := await self.attempts.find_one({"_id": doc["_id"]})) is not None
        ):
            self.known.put(doc["_id"], stored)  # the one stored first stands, whatever this delivery says
        if doc["_id"] not in await self._waiting_for():
            return []
        placed_t = (self.known.get(doc["_id"]) or doc).get("placed_t")  # none in a record of an older version
        waiting: list[dict[str, Any]] = []
        early: list[dict[str, Any]] = []
        async for d in self.parked.find({"attempt_key": doc["_id"]}):
            too_early = placed_t is not None and d.get("seen_t", d["parked_at"]) < placed_t - PLACED_SKEW_S
            (early if too_early else waiting).append(d)
        if early:  # no agent starts or ends an attempt before it is placed: a node's report ahead of it is forged
            await self.parked.delete_many({"_id": {"$in": [d["_id"] for d in early]}})
            log.warning(
                "%d task events of job %s attempt %d dropped: their node reported them before the attempt was placed",
                len(early),
                event.job_id,
                event.attempt,
            )
        waiting.sort(key=lambda d: (d["order"], d["parked_at"]))
        return [
            (TASK_EVENT.validate_python(d["payload"]), datetime.fromtimestamp(d.get("seen_t", d["parked_at"]), UTC))
            for d in waiting
        ]

    async def unpark(self, event: TaskStarted | TaskExited) -> None:
        await self.parked.delete_one({"_id": event.event_id})

    def settled(self, event: JobPlaced) -> None:
        """Every task event that waited for this placement is taken off."""
        if self.waiting_for is not None:
            self.waiting_for.discard(attempt_key(event.job_id, event.attempt))

    async def _waiting_for(self) -> set[str]:
        """The attempts whose task events are parked: read once, by the first of the handlers that ask at once."""
        async with self._reading_waiting:
            if self.waiting_for is None:
                self.waiting_for = {d["attempt_key"] async for d in self.parked.find({}, {"attempt_key": 1})}
        return self.waiting_for

    async def check(self, event: TaskStarted | TaskExited, *, seen: datetime) -> dict[str, Any] | None:
        """The placement that vouches for the event, or None (the event is parked or dropped, and logged)."""
        key = attempt_key(event.job_id, event.attempt)
        placement = self.known.get(key) or await self.attempts.find_one({"_id": key})
        if placement is not None:
            self.known.put(key, placement)
        match verdict(placement, event):
            case "charge":
                return placement
            case "drop":
                log.warning(
                    "%s of job %s attempt %d rank %d from node %s not charged: placed on %s",
                    event.type,
                    event.job_id,
                    event.attempt,
                    event.rank,
                    event.node_id,
                    placement["nodes"].get(str(event.rank), "no such rank") if placement else "no placement",
                )
            case "park":
                await self._park(event, seen=seen)
        return None

    async def _park(self, event: TaskStarted | TaskExited, *, seen: datetime) -> None:
        now = time.time()
        old = {"parked_at": {"$lt": now - PARK_TTL_S}}
        stale = {d["attempt_key"] async for d in self.parked.find(old, {"attempt_key": 1})}
        expired = await self.parked.delete_many(old)
        if expired.deleted_count:
            log.warning("%d task events dropped: no placement for them within %.0fs", expired.deleted_count, PARK_TTL_S)
        if stale and self.waiting_for is not None:  # the attempts whose events expired wait no more (it only grew)
            still = {d["attempt_key"] async for d in self.parked.find({"attempt_key": {"$in": sorted(stale)}})}
            self.waiting_for -= stale - still
        if await self.parked.count_documents({}) >= PARK_MAX:
            log.warning(
                "%s of job %s from node %s dropped: %d events already wait for a placement",
                event.type,
                event.job_id,
                event.node_id,
                PARK_MAX,
            )
            return
        if await self.parked.count_documents({"node_id": event.node_id}) >= PARK_PER_NODE:
            log.warning(
                "%s of job %s from node %s dropped: %d of its events already wait for a placement",
                event.type,
                event.job_id,
                event.node_id,
                PARK_PER_NODE,
            )
            return
        (await self._waiting_for()).add(attempt_key(event.job_id, event.attempt))  # before it is stored
        try:
            await self.parked.insert_one(
                {
                    "_id": event.event_id,
                    "attempt_key": attempt_key(event.job_id, event.attempt),
                    "node_id": event.node_id,
                    "order": 0 if isinstance(event, TaskStarted) else 1,
                    "parked_at": now,
                    "seen_t": seen.timestamp(),
                    "payload": event.model_dump(mode="json"),
                }
            )
        except DuplicateKeyError:
            return
        log.info("%s of job %s attempt %d waits for its placement", event.type, event.job_id, event.attempt)
