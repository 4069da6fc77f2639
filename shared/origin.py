"""Whose output a chunk is: only the node an attempt's rank was placed on speaks for that task's output (and its
GPU telemetry, checked the same way, for the GPUs placement gave it: `given`).

A node's agent may publish on its own log subject chunks naming any job; what it says is a claim. A receiver of
output (the submitter, which shows it; the estimator, which reads metrics from it) keeps a chunk only when
placement put that attempt's rank on the chunk's node, as the monitor does for task events. Placements are read
from `tm.job.placed` by a consumer of their own (`placements_consumer`), up to 256 at once in any order (a placement
never changes once made): each is known at once, and its record goes out with the others read within 1 s, in one
insert, before its delivery is acknowledged; a chunk whose placement has not been read yet waits while that consumer
still has placements to read or acknowledge (the real one was stored before any output of its task existed), and is
dropped once it has read them all.
"""

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from faststream.exceptions import NackMessage
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from shared.batch import GroupCommit
from shared.bus import PULL_BATCH_WAIT_S, durable
from shared.events import JobPlaced
from shared.grouped import DUPLICATE_KEY
from shared.lru import Lru

log = logging.getLogger(__name__)

Verdict = Literal["keep", "wait", "drop"]
WAIT_S = 0.5  # a chunk that came before its placement was read is looked at again after this long
MAX_WAITS = 120  # ... at most this often (a minute): a placement read never, after that, was never made
REMEMBERED = 4096  # placements kept in memory (a placement never changes once made)
# Placements a consumer handles side by side (their records in one write): each waits its window, so this many a
# window at most (256 a second; 64 at 0.2 s were 320).
PLACEMENTS_AT_ONCE = 256
# A placement's record waits this long for others (its placement is known meanwhile, so no output waits for it; its
# delivery is acknowledged once written). At 0.2 s a burst of 8-10 jobs a second wrote one insert every 2 jobs.
RECORDS_WINDOW_S = 1.0
RESTART_WAIT_S = 120.0  # a start waits for its placement's record only this long after its process judged the first


def placements_consumer(consumer: str) -> dict[str, Any]:
    """The `@router.subscriber` arguments of a service's own placements consumer: unordered (a placement's record
    is written once under its attempt's key, so neither order nor a redelivery changes it), up to 256 handled side
    by side while it goes on fetching (`max_workers`: a handler waiting for its record's write holds no fetch
    back), so that the records of placements read within `RECORDS_WINDOW_S` go out in one insert, not one each."""
    return {
        **durable(
            "tm.job.placed", consumer=consumer, batch=PLACEMENTS_AT_ONCE, ordered=False, wait_s=PULL_BATCH_WAIT_S
        ),
        "max_workers": PLACEMENTS_AT_ONCE,
    }


def attempt_key(job_id: str, attempt: int) -> str:
    return f"{job_id}:{attempt}"


def placed_nodes(event: JobPlaced) -> dict[str, str]:
    """Each rank's node, as placement decided it."""
    return {str(a.rank): a.node_id for a in event.assignments}


class FromTask(Protocol):
    """What a task's node says of it (a chunk of output, a telemetry sample): whose, and from where (read-only, as
    the frozen events that carry it)."""

    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def node_id(self) -> str: ...


@dataclass(frozen=True)
class Given:
    """The GPUs placement gave one rank, and the memory of the largest (0: not recorded)."""

    gpu_indices: tuple[int, ...]
    gpu_memory_gb: float


def given_gpus(event: JobPlaced) -> dict[str, dict]:
    """Each rank's GPUs as placement gave them."""
    return {
        str(a.rank): {"gpu_indices": list(a.gpu_indices), "gpu_memory_gb": a.gpu_memory_gb} for a in event.assignments
    }


UNPLACED_S = 5.0  # how long an attempt found never placed is taken for one without looking again


def verdict(nodes: dict[str, str] | None, chunk: FromTask, *, all_placements_read: bool) -> Verdict:
    """Keep what the rank's own node says; wait for a placement not read yet; drop anything else."""
    if nodes is not None:
        return "keep" if nodes.get(str(chunk.rank)) == chunk.node_id else "drop"
    return "drop" if all_placements_read else "wait"


class Numbered(FromTask, Protocol):
    """A report numbered within its task (a log chunk, a telemetry sample)."""

    @property
    def seq(self) -> int: ...


def dedup_key(chunk: Numbered) -> str:
    """A chunk's storage id: per (job, attempt, rank, node), so no other node's chunk can take its place."""
    return f"{chunk.job_id}:{chunk.attempt}:{chunk.rank}:{chunk.node_id}:{chunk.seq}"


@dataclass
class Origins:
    """The placements a service has read, and the check of each chunk against them."""

    placements: AsyncCollection  # "job:attempt" -> each rank's node
    all_read: Callable[[], Awaitable[bool]]  # whether the placements consumer has read everything stored so far
    known: Lru[str, dict[str, str]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    stored: Lru[str, bool] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)  # inserted by this process
    known_gpus: Lru[str, dict[str, dict]] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    latest: Lru[str, int] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)  # job -> its newest attempt
    # attempts found neither known nor stored while every placement was read, and when: a node's reports of
    # attempts never placed each cost a database read and a question to the bus, on the consumer every job's
    # output waits on (found by review); remembered `UNPLACED_S`, forgotten at once when the placement comes
    unplaced: Lru[str, float] = field(default_factory=lambda: Lru(REMEMBERED), repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    records: GroupCommit[dict[str, Any], None] = field(init=False, repr=False)  # inserts waiting for their window
    restart_wait_s: float = RESTART_WAIT_S
    _writing: dict[str, "asyncio.Future[None]"] = field(default_factory=dict, repr=False)  # records being written
    _waits_until: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.records = GroupCommit(self._insert, max_size=1000, window_s=RECORDS_WINDOW_S)

    async def placed(self, event: JobPlaced) -> None:
        """Keep a placement (a redelivery finds it stored), inserted with the others read at the same moment. Only a
        landed write marks it stored: a redelivery while its first delivery's write is still out (a slow database
        past the acknowledgement wait) waits for that write and fails with it, rather than be acknowledged on the
        strength of a write that may yet fail."""
        key = self.learn(event)
        if self.stored.get(key):
            return
        write = self._writing.get(key)
        if write is None:  # else another delivery of it (another consumer, a redelivery) waits on the same write
            record = {
                "_id": key,
                "job_id": event.job_id,
                "attempt": event.attempt,
                "nodes": placed_nodes(event),
                "gpus": given_gpus(event),
                "why": event.why,
            }
            write = self._writing[key] = asyncio.ensure_future(self.records(record))
            write.add_done_callback(functools.partial(self._written, key))
        await asyncio.shield(write)  # its error is every waiting delivery's: each comes again
        self.stored.put(key, True)

    def _written(self, key: str, write: "asyncio.Future[None]") -> None:
        self._writing.pop(key, None)
        if not write.cancelled():
            write.exception()  # retrieved here too: every delivery that waited may have stopped waiting

    async def _insert(self, docs: list[dict[str, Any]]) -> list[None | Exception]:
        """One insert of a window's records; one stored already (a redelivery, a lost answer) is no error. A
        failure that is not the database's (a record the driver cannot encode) is one record's: each is then
        inserted alone, so the others are stored and only that delivery fails."""
        try:
            await self.placements.insert_many(docs, ordered=False)
        except PyMongoError as exc:
            if not isinstance(exc, BulkWriteError):
                raise  # the database is away: every record of the group comes again
            return self._refused(docs, exc)
        except Exception:
            return [await self._insert_alone(doc) for doc in docs]
        return [None] * len(docs)

    async def _insert_alone(self, doc: dict[str, Any]) -> None | Exception:
        try:
            await self.placements.insert_one(doc)
        except DuplicateKeyError:
            return None
        except PyMongoError:
            raise
        except Exception as exc:
            return exc
        return None

    @staticmethod
    def _refused(docs: list[dict[str, Any]], exc: BulkWriteError) -> list[None | Exception]:
        """Each record's answer from an unordered insert that refused some: a duplicate is stored already."""
        refused = {e["index"]: e for e in exc.details.get("writeErrors", [])}
        if (exc.details.get("writeConcernErrors") or []) or len(refused) == 0:
            raise exc
        return [
            None if i not in refused or refused[i].get("code") == DUPLICATE_KEY else BulkWriteError(refused[i])
            for i in range(len(docs))
        ]

    def may_wait(self, now: float) -> bool:
        """Whether a report read in its job's order after the placement (a start) may wait for the placement's
        record: only for `restart_wait_s` after this process judged its first (the backlog after a restart, whose
        placements were read before it). Later, the placement of such a report was read first in this process, so
        one neither known nor stored was never made: waiting for it would only let a node hold the consumer's
        slots with starts of attempts never placed."""
        if self._waits_until is None:
            self._waits_until = now + self.restart_wait_s
        return now < self._waits_until

    def learn(self, event: JobPlaced) -> str:
        """Know a placement, its nodes and GPUs, without storing it (its record is the placements consumer's to
        write); its key."""
        key = attempt_key(event.job_id, event.attempt)
        self.known.put(key, placed_nodes(event))
        self.known_gpus.put(key, given_gpus(event))
        self.latest.put(event.job_id, max(event.attempt, self.latest.get(event.job_id) or 0))
        self.unplaced.pop(key)
        return key

    async def superseded(self, report: FromTask) -> bool:
        """Whether a later attempt of the report's job was placed: a node an earlier attempt ran on has no say on
        the job once it moved (its late output is still the job's log, not its estimate)."""
        current = await self.current_attempt(report.job_id)
        return current is not None and report.attempt < current

    async def current_attempt(self, job_id: str) -> int | None:
        """The job's newest attempt placed, as read (None: none read)."""
        if (attempt := self.latest.get(job_id)) is not None:
            return attempt
        attempts = [d["attempt"] async for d in self.placements.find({"job_id": job_id}, {"attempt": 1})]
        return self.latest.put(job_id, max(attempts)) if attempts else None

    async def later_placed(self, job_id: str, attempt: int) -> bool:
        """Whether an attempt after `attempt` was placed, as this process read it or as any process stored it (the
        next attempt's record, by id: attempts are numbered one after another)."""
        if (newest := self.latest.get(job_id)) is not None and newest > attempt:
            return True
        return await self.placements.find_one({"_id": attempt_key(job_id, attempt + 1)}, {"_id": 1}) is not None

    async def forget(self, job_id: str) -> None:
        """A deleted job's placements (its output is no longer taken: every chunk of it is then dropped)."""
        self.latest.pop(job_id)
        async for doc in self.placements.find({"job_id": job_id}, {"_id": 1}):
            self.known.pop(doc["_id"])
            self.stored.pop(doc["_id"])
            self.known_gpus.pop(doc["_id"])
        await self.placements.delete_many({"job_id": job_id})

    async def prepare(self) -> None:
        """The index `forget` reads."""
        await self.placements.create_index("job_id")

    async def nodes(self, job_id: str, attempt: int) -> dict[str, str] | None:
        key = attempt_key(job_id, attempt)
        if (nodes := self.known.get(key)) is not None:
            return nodes
        doc = await self.placements.find_one({"_id": key})
        return None if doc is None else self.known.put(key, doc["nodes"])

    async def given(self, job_id: str, attempt: int, rank: int) -> Given | None:
        """The GPUs placement gave a rank of an attempt; None for a placement not stored or stored without them."""
        key = attempt_key(job_id, attempt)
        gpus = self.known_gpus.get(key)
        if gpus is None:
            doc = await self.placements.find_one({"_id": key}, {"gpus": 1})
            gpus = self.known_gpus.put(key, doc.get("gpus") or {}) if doc else {}
        rank_gpus = gpus.get(str(rank))
        if not isinstance(rank_gpus, dict):
            return None
        return Given(
            gpu_indices=tuple(rank_gpus.get("gpu_indices") or ()),
            gpu_memory_gb=float(rank_gpus.get("gpu_memory_gb") or 0),
        )

    async def admit(self, chunk: FromTask, *, deliveries: int) -> bool:
        """Whether to take the chunk in: False (logged) for one from a node its task was not placed on; a chunk
        whose placement may still come is handed back to the stream for later (NackMessage)."""
        key, now = attempt_key(chunk.job_id, chunk.attempt), self.clock()
        if (found := self.unplaced.get(key)) is not None and now - found < UNPLACED_S:
            return False  # said when it was found
        nodes = await self.nodes(chunk.job_id, chunk.attempt)
        decided = verdict(nodes, chunk, all_placements_read=nodes is not None or await self.all_read())
        if nodes is None and decided == "drop":
            self.unplaced.put(key, now)
        if decided == "wait" and deliveries < MAX_WAITS:
            raise NackMessage(delay=WAIT_S)
        if decided != "keep":
            log.warning(
                "dropped %s of job %s attempt %d rank %d from node %s: %s",
                type(chunk).__name__,
                chunk.job_id,
                chunk.attempt,
                chunk.rank,
                chunk.node_id,
                "not placed there" if nodes is not None else "never placed",
            )
        return decided == "keep"


class NotReadYet(TimeoutError):
    """A report whose placement the placements consumer has not read yet (nor stored): a passing failure
    (`shared.bus.TRANSIENT_ERRORS`), retried in place by a keyed consumer until it has read them all."""


def deliveries(message: Any) -> int:
    """How often JetStream has delivered a message (1 the first time; 1 where the transport does not say)."""
    try:
        return int(message.raw_message.metadata.num_delivered)
    except Exception:  # noqa: BLE001 - a test broker's message carries no JetStream metadata
        return 1
