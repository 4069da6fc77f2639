"""The list view of the submitter's jobs: one small entry per job (project, user, creation second, phase), written for
a status version and refused where one for a newer status is there. A page of a job list counts and sorts these;
the queue caps count those in a queued phase (the places this process gave are also counted in memory, `added`).
Written by the repository as a job is stored and its statuses come; no other module names this collection."""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from shared.grouped import update_grouped
from shared.jobs import FINISHED
from services.submitter.caps import QUEUED_PHASES
from services.submitter.later import LaterWrites, older_than

# A list entry of a phase that does not end the job (nor puts it in the queue) is written this much later, replaced
# by the job's next phase if that comes first (a short job's Pending and Running): a page filtered by phase may see
# a job's previous phase this long, and the caps count a job that just left the queue this long (never one that
# just entered it: that entry is written at once, as one of a phase that ends the job).
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
        "user_name": doc["user_name"],
        "created_s": created.timestamp(),
        "phase": doc.get("status", {}).get("phase"),
        "v": doc.get("status_version", 0),
    }


def _unversioned(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if entry is None else {k: v for k, v in entry.items() if k != "v"}


@dataclass
class ViewEntries:
    listing: AsyncCollection  # api_job_list
    list_later_s: float = LIST_LATER_S  # 0: every entry at once
    # Places in the queue this process gave since it started, by ("project" | "user", name): they only grow (a job
    # leaving the queue is not taken off), so a count read from the view plus those given since never counts fewer
    # than the view holds, whatever another replica took off meanwhile (`QueueCaps`).
    added: Counter[tuple[str, str]] = field(default_factory=Counter, repr=False)
    later_entries: LaterWrites = field(init=False, repr=False)  # entries of passing phases, written later

    def __post_init__(self) -> None:
        self.later_entries = LaterWrites(self.listing, delay_s=self.list_later_s)

    async def create_indexes(self) -> None:
        await self.listing.create_index([("project_id", 1), ("created_s", -1)])
        await self.listing.create_index([("project_id", 1), ("phase", 1)])
        await self.listing.create_index([("user_name", 1), ("phase", 1)])

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        """Jobs of a project or of a user accepted and not yet running, as their list entries say."""
        owner = {"project_id": project_id} if project_id else {"user_name": user_name}
        return await self.listing.count_documents({**owner, "phase": {"$in": QUEUED_PHASES}})

    def _added(self, project_id: str, user_name: str) -> None:
        self.added[("project", project_id)] += 1
        self.added[("user", user_name)] += 1

    async def add_new(self, stored: list[dict[str, Any]]) -> None:
        """The entries of jobs just stored (each in the queue), in one command (a queue entry each was a second)."""
        await self.listing.bulk_write(
            [UpdateOne({"_id": entry.pop("_id")}, {"$set": entry}, upsert=True) for entry in map(list_entry, stored)],
            ordered=False,
        )
        for doc in stored:
            self._added(doc["project_id"], doc["user_name"])

    async def rebuild(self, jobs: AsyncCollection, *, legacy_queue: AsyncCollection | None = None) -> int:
        """At start, before anything is submitted or projected: the list entries that differ from the jobs written
        (in step, that is none: a restart rewrites nothing of the history; entries from before they named the
        user are rewritten once), in one read of the jobs (one that died between a job's write and its entry is
        mended here). The queue view of earlier versions (`legacy_queue`) is emptied. Returns how many jobs are
        queued."""
        if legacy_queue is not None:
            await legacy_queue.delete_many({})
        have = {d["_id"]: d async for d in self.listing.find({})}
        queued, changed = 0, []
        async for d in jobs.find({}, VIEW_FIELDS):
            entry = list_entry(d)
            if _unversioned(have.pop(d["_id"], None)) != _unversioned(entry):  # entries from before versions stay
                changed.append(entry)
            queued += entry["phase"] in QUEUED_PHASES
        if have:  # entries of jobs that are gone
            await self.listing.delete_many({"_id": {"$in": list(have)}})
        for i in range(0, len(changed), 1000):
            part = changed[i : i + 1000]
            await self.listing.bulk_write([ReplaceOne({"_id": e["_id"]}, e, upsert=True) for e in part], ordered=False)
        return queued

    async def gone(self, job_id: str) -> None:
        """The job is not stored (deleted, or never was): its entry goes."""
        self.later_entries.drop(job_id)
        await self.listing.delete_one({"_id": job_id})

    async def write(self, doc: dict[str, Any], *, entered: bool = False, later: bool = False) -> None:
        """The job's list entry as its stored phase at its version says (made where there is none); `later`: one
        of a phase that does not end the job waits (`LIST_LATER_S`), unless the job `entered` the queue with it."""
        entry = list_entry(doc)
        job_id = entry.pop("_id")
        given = entry["phase"] in QUEUED_PHASES and (entered or not later)  # a place in the queue, given now
        await self.list_entry(job_id, entry["v"], {"$set": entry}, later=later and not given, upsert=True)
        if given:  # once written: a count read meanwhile that missed it is not taken for one that has it
            self._added(doc["project_id"], doc["user_name"])

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


async def _versioned(
    collection: AsyncCollection, job_id: str, version: int, update: dict[str, Any], *, upsert: bool = True
) -> None:
    """One view entry written for the job's status `version`, unless one for a newer status is there (its word
    stands); with other jobs' entries written at the same moment (`shared.grouped`)."""
    await update_grouped(collection, [({"_id": job_id, **older_than(version)}, update)], upsert=upsert)
