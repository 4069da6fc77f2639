"""The views of the submitter's jobs: a queue entry per job accepted and not yet running (what the caps count; the
places this process gave are also counted in memory, `added`) and a list entry per job (what a page counts and
sorts), each written for a status version and refused where one for a newer status is there. Written by the
repository as a job is stored and its statuses come; no other module names these collections."""

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from shared.grouped import update_grouped
from shared.jobs import FINISHED
from services.submitter.caps import QUEUED_PHASES
from services.submitter.later import LaterWrites, older_than

# A job that left the queue keeps a versioned tombstone there this long (no project: the caps do not count it), so
# an older status handled at the same moment cannot put it back; statuses of one job race only while handled side
# by side (one fetched batch, a redelivery after ACK_WAIT_S), seconds apart at most.
TOMBSTONE_S = 120.0
SWEEP_EVERY = 100  # tombstones older than TOMBSTONE_S are deleted once every this many jobs leaving the queue
# A list entry of a phase that does not end the job is written this much later, replaced by the job's next phase
# if that comes first (a short job's Pending and Running): a page filtered by phase may see a job's previous phase
# this long; a phase that ends the job is written at once (a page read right after the job ends shows it).
LIST_LATER_S = 0.5

VIEW_FIELDS = {"status": 1, "status_version": 1, "project_id": 1, "user_name": 1, "create_time": 1}  # whole
# top-level fields: nx-27017 flattens dotted ones


def list_entry(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's list entry: its creation time as Unix seconds (a datetime set by `$set` is a string on the embedded
    server, and seconds sort the same everywhere)."""
    created = doc["create_time"]
    created = datetime.fromisoformat(created) if isinstance(created, str) else created
    return {
        "_id": doc["_id"],
        "project_id": doc["project_id"],
        "created_s": created.timestamp(),
        "phase": doc.get("status", {}).get("phase"),
        "v": doc.get("status_version", 0),
    }


Owner = tuple[str, str]  # (project, user) of a job holding a place in the queue


def _unversioned(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if entry is None else {k: v for k, v in entry.items() if k != "v"}


def _owner(doc: dict[str, Any]) -> Owner | None:
    """The (project, user) whose place in the queue the job holds as stored, None when not queued."""
    return (doc["project_id"], doc["user_name"]) if doc.get("status", {}).get("phase") in QUEUED_PHASES else None


@dataclass
class ViewEntries:
    # api_queue: one small document per job accepted and not yet running (and tombstones), what the caps count. A
    # count of the list entries in a queued phase reads every job ever listed on the embedded server (350 ms with
    # 20,000 stored, 4 ms here), so the queue keeps a view of its own.
    queue: AsyncCollection
    listing: AsyncCollection  # api_job_list
    list_later_s: float = LIST_LATER_S  # 0: every entry at once
    # Places in the queue this process gave since it started, by ("project" | "user", name): they only grow (a job
    # leaving the queue is not taken off), so a count read from the view plus those given since never counts fewer
    # than the view holds, whatever another replica took off meanwhile (`QueueCaps`).
    added: Counter[tuple[str, str]] = field(default_factory=Counter, repr=False)
    left_queue: int = field(default=0, repr=False)  # jobs that left the queue since the last sweep
    later_entries: LaterWrites = field(init=False, repr=False)  # list entries of passing phases, written later
    later_leaves: LaterWrites = field(init=False, repr=False)  # tombstones of jobs that left the queue, later

    def __post_init__(self) -> None:
        self.later_entries = LaterWrites(self.listing, delay_s=self.list_later_s)
        self.later_leaves = LaterWrites(self.queue, delay_s=self.list_later_s)

    async def create_indexes(self) -> None:
        await self.queue.create_index([("project_id", 1)])
        await self.queue.create_index([("user_name", 1)])
        await self.listing.create_index([("project_id", 1), ("created_s", -1)])

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        """Jobs of a project or of a user accepted and not yet running, as the queue view holds them."""
        return await self.queue.count_documents({"project_id": project_id} if project_id else {"user_name": user_name})

    def _added(self, owner: Owner) -> None:
        self.added[("project", owner[0])] += 1
        self.added[("user", owner[1])] += 1

    async def add_new(self, stored: list[dict[str, Any]]) -> None:
        """The entries of jobs just stored: a queue entry and a list entry each, one command per collection, the two
        sent side by side (a submission waits for both: one round trip, not two); the first failure raised once
        both are answered."""

        async def queue_entries() -> None:
            await self.queue.bulk_write(
                [
                    UpdateOne(
                        {"_id": doc["_id"]},
                        {"$set": {"project_id": doc["project_id"], "user_name": doc["user_name"], "v": _version(doc)}},
                        upsert=True,
                    )
                    for doc in stored
                ],
                ordered=False,
            )
            for doc in stored:
                self._added((doc["project_id"], doc["user_name"]))

        listed = [UpdateOne({"_id": e.pop("_id")}, {"$set": e}, upsert=True) for e in map(list_entry, stored)]
        outcomes = await asyncio.gather(
            queue_entries(), self.listing.bulk_write(listed, ordered=False), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def rebuild(self, jobs: AsyncCollection) -> int:
        """At start, before anything is submitted or projected: the queue from the jobs themselves, and the list
        entries that differ from them written (in step, that is none: a restart rewrites nothing of the history),
        in one read of the jobs (they are kept exact while the process runs; one that died between a job's write
        and its entries is mended here). Returns how many jobs are queued."""
        await self.queue.delete_many({})
        have = {d["_id"]: d async for d in self.listing.find({})}
        queued, changed = [], []
        async for d in jobs.find({}, VIEW_FIELDS):
            entry = list_entry(d)
            if _unversioned(have.pop(d["_id"], None)) != _unversioned(entry):  # entries from before versions stay
                changed.append(entry)
            if (owner := _owner(d)) is not None:
                queued.append({"_id": d["_id"], "project_id": owner[0], "user_name": owner[1], "v": _version(d)})
        if have:  # entries of jobs that are gone
            await self.listing.delete_many({"_id": {"$in": list(have)}})
        for i in range(0, len(queued), 1000):
            await self.queue.insert_many(queued[i : i + 1000])
        for entry in changed:
            await self.listing.replace_one({"_id": entry["_id"]}, entry, upsert=True)
        return len(queued)

    async def gone(self, job_id: str) -> None:
        """The job is not stored (deleted, or never was): its entries go."""
        self.later_entries.drop(job_id)
        self.later_leaves.drop(job_id)
        await self.queue.delete_one({"_id": job_id})
        await self.listing.delete_one({"_id": job_id})

    async def write(self, doc: dict[str, Any], *, queue: bool, later: bool = False) -> None:
        """The job's list entry, and (`queue`) its queue entry, as its stored phase at its version says; `later`:
        a list entry of a phase that does not end the job, and a queue entry that leaves the queue, wait
        (`LIST_LATER_S`)."""
        version = _version(doc)
        if queue:
            await self.queue_entry(doc["_id"], version, owner=_owner(doc), later=later)
        entry = list_entry(doc)
        job_id = entry.pop("_id")
        await self.list_entry(job_id, version, {"$set": entry}, later=later, upsert=True)

    async def queue_entry(self, job_id: str, version: int, *, owner: Owner | None, later: bool = False) -> None:
        """The job's place in the queue for its status `version`: held by its (project, user), or (None) a
        tombstone that holds none; `later`: the tombstone waits (`LaterWrites`) like a passing phase's list entry,
        so the caps count a job that just left the queue a moment longer (never one that just entered it)."""
        if owner is not None:
            self.later_leaves.drop(job_id)
            update = {"$set": {"project_id": owner[0], "user_name": owner[1], "v": version}, "$unset": {"gone_s": ""}}
            await _versioned(self.queue, job_id, version, update)
            self._added(owner)
            return
        tombstone = {"$set": {"v": version, "gone_s": time.time()}, "$unset": {"project_id": "", "user_name": ""}}
        if later and self.list_later_s > 0:
            self.later_leaves.add(job_id, version, tombstone)
        else:
            self.later_leaves.drop(job_id)
            await _versioned(self.queue, job_id, version, tombstone)
        await self._sweep_queue()

    async def list_entry(self, job_id: str, version: int, update: dict[str, Any], *, later: bool, upsert: bool) -> None:
        """The job's list entry for its status `version`; one of a phase that does not end the job waits when
        `later` (`LaterWrites`: it updates the entry the job's insert made, never makes one)."""
        if later and self.list_later_s > 0 and update["$set"]["phase"] not in FINISHED:
            self.later_entries.add(job_id, version, update)
            return
        self.later_entries.drop(job_id)
        await _versioned(self.listing, job_id, version, update, upsert=upsert)

    async def write_waiting(self) -> None:
        """The entries that wait, written now."""
        await self.later_entries.write_now()
        await self.later_leaves.write_now()

    async def close(self) -> None:
        """At a graceful stop: the entries that wait, written (bounded: `LaterWrites.close`)."""
        await asyncio.gather(self.later_entries.close(), self.later_leaves.close())

    async def _sweep_queue(self) -> None:
        """Now and then, the tombstones of jobs that left the queue long enough ago that no status still races."""
        self.left_queue += 1
        if self.left_queue >= SWEEP_EVERY:
            self.left_queue = 0
            await self.queue.delete_many({"gone_s": {"$lt": time.time() - TOMBSTONE_S}})


def _version(doc: dict[str, Any]) -> int:
    return doc.get("status_version", 0)


async def _versioned(
    collection: AsyncCollection, job_id: str, version: int, update: dict[str, Any], *, upsert: bool = True
) -> None:
    """One view entry written for the job's status `version`, unless one for a newer status is there (its word
    stands); with other jobs' entries written at the same moment (`shared.grouped`)."""
    await update_grouped(collection, [({"_id": job_id, **older_than(version)}, update)], upsert=upsert)
