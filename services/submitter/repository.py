"""The submitter's collections: jobs as the API shows them, their views (queue, list), the placements their output
is checked against; their output (`logstore`) and notifications (`notificationstore`) through stores of their own.
The one door to them: no other module of the submitter names a collection."""

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from faststream.nats import NatsBroker
from pymongo import DESCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from shared.events import EtaEstimated, JobStatusChanged, Message
from shared.grouped import update_grouped
from shared.jobs import FINISHED
from shared.lru import Lru
from shared.origin import Origins
from shared.store import DocumentStore
from services.submitter.caps import QUEUED_PHASES
from services.submitter.later import LaterWrites, older_than
from services.submitter.logstore import LOG_CAP_BYTES, LogStore
from services.submitter.notificationstore import NotificationStore
from services.submitter.refusals import NameTaken
from services.submitter.views import status_fields

# A job that left the queue keeps a versioned tombstone there this long (no project: the caps do not count it), so
# an older status handled at the same moment cannot put it back; statuses of one job race only while handled side
# by side (one fetched batch, a redelivery after ACK_WAIT_S), seconds apart at most.
TOMBSTONE_S = 120.0
SWEEP_EVERY = 100  # tombstones older than TOMBSTONE_S are deleted once every this many jobs leaving the queue
OWNERS_REMEMBERED = 100_000  # jobs whose project is remembered (it never changes): ~10 MB at most
FINISHED_REMEMBERED = 100_000  # jobs seen finishing here (never to run again): their late estimates are not written
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


def _unversioned(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if entry is None else {k: v for k, v in entry.items() if k != "v"}


def moved_from(event: JobStatusChanged) -> str | None:
    """The phase a status moved its job from, where it says so and the views follow from it alone: None for a
    status that does not say (the views are then written from the job as stored) or that puts the job in the
    queue (its entry is made only for a job still stored)."""
    was = event.previous_phase.value if event.previous_phase is not None else None
    if was is None or (event.phase.value in QUEUED_PHASES and was not in QUEUED_PHASES):
        return None
    return was


@dataclass
class Repository:
    db: AsyncDatabase
    broker: NatsBroker
    log_cap_bytes: int = LOG_CAP_BYTES
    known_owners: Lru[str, str] = field(default_factory=lambda: Lru(OWNERS_REMEMBERED), repr=False)
    origins: Origins | None = None  # the placements output is checked against (the bus handlers need it)
    list_later_s: float = LIST_LATER_S  # 0: every list entry at once
    finished_here: Lru[str, bool] = field(default_factory=lambda: Lru(FINISHED_REMEMBERED), repr=False)
    left_queue: int = field(default=0, repr=False)  # jobs that left the queue since the last sweep
    output: LogStore = field(init=False, repr=False)  # the jobs' stored output
    notifications: NotificationStore = field(init=False, repr=False)  # notifications and the projects' webhooks

    def __post_init__(self) -> None:
        self.output = LogStore(self.db.api_logs, self.db.api_log_sizes, cap_bytes=self.log_cap_bytes)
        self.notifications = NotificationStore(self.db.api_notifications, self.db.api_projects)

    @property
    def jobs(self):
        return self.db.api_jobs

    @property
    def store(self) -> DocumentStore:
        """Jobs as every service stores its state: with their outgoing events, by revision."""
        return DocumentStore(self.jobs, self.broker)

    @property
    def queue(self):
        """One small document per job accepted and not yet running: what the queue caps count. A count over
        every job ever stored is a scan of the whole history on the embedded server, at each submission."""
        return self.db.api_queue

    @cached_property
    def later_entries(self) -> LaterWrites:
        """List entries of phases a job passes through, written a moment later (`LIST_LATER_S`)."""
        return LaterWrites(self.listing, delay_s=self.list_later_s)

    @cached_property
    def later_leaves(self) -> LaterWrites:
        """Queue entries of jobs that left the queue, written a moment later (`LIST_LATER_S`)."""
        return LaterWrites(self.queue, delay_s=self.list_later_s)

    @property
    def listing(self):
        """One small document per job (project, creation second, phase): what a page of a job list counts and
        sorts, before the page's own jobs are read by id. Sorting the jobs themselves reads every stored job on the
        embedded server at each page (1.5 s a page with 3,000 stored)."""
        return self.db.api_job_list

    async def create_indexes(self) -> None:
        await self.jobs.create_index([("project_id", 1), ("name", 1)], unique=True)
        await self.jobs.create_index([("project_id", 1), ("create_time", -1)])
        await self.jobs.create_index([("user_name", 1)])
        await self.queue.create_index([("project_id", 1)])
        await self.queue.create_index([("user_name", 1)])
        await self.listing.create_index([("project_id", 1), ("created_s", -1)])
        await self.output.create_indexes()
        await self.db.api_tokens.create_index("user_name")
        if self.origins is not None:
            await self.origins.prepare()

    async def insert(self, doc: dict[str, Any], event: Message) -> list[dict[str, Any]]:
        """Store a new job with the event announcing it in its outbox (the relay publishes it if we cannot)."""
        [stored] = await self.insert_many([(doc, event)])
        if isinstance(stored, NameTaken):
            raise stored
        return stored

    async def insert_many(self, new: list[tuple[dict[str, Any], Message]]) -> list[list[dict[str, Any]] | NameTaken]:
        """`insert` of many jobs in three commands (the jobs, their queue entries, their list entries): per job its
        pending outbox entries, or NameTaken where the unique (project_id, name) index or the id refused it."""
        pending = await self.store.insert_many([(doc["_id"], doc, [event]) for doc, event in new])
        stored = [doc for (doc, _), entries in zip(new, pending) if entries is not None]
        if stored:
            await self.queue.bulk_write(
                [
                    UpdateOne(
                        {"_id": doc["_id"]},
                        {
                            "$set": {
                                "project_id": doc["project_id"],
                                "user_name": doc["user_name"],
                                "v": doc.get("status_version", 0),
                            }
                        },
                        upsert=True,
                    )
                    for doc in stored
                ],
                ordered=False,
            )
            await self.listing.bulk_write(
                [
                    UpdateOne({"_id": entry.pop("_id")}, {"$set": entry}, upsert=True)
                    for entry in map(list_entry, stored)
                ],
                ordered=False,
            )
        return [
            NameTaken(doc["name"], project_id=doc["project_id"]) if entries is None else entries
            for (doc, _), entries in zip(new, pending)
        ]

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        """Jobs of a project or of a user accepted and not yet running."""
        return await self.queue.count_documents({"project_id": project_id} if project_id else {"user_name": user_name})

    async def rebuild_views(self) -> int:
        """At start, before anything is submitted or projected: the queue from the jobs themselves, and the list
        entries that differ from them written (in step, that is none: a restart rewrites nothing of the history),
        in one read of the jobs (they are kept exact while the process runs; one that died between a job's write
        and its entries is mended here). Returns how many jobs are queued."""
        await self.queue.delete_many({})
        have = {d["_id"]: d async for d in self.listing.find({})}
        queued, changed = [], []
        async for d in self.jobs.find({}, VIEW_FIELDS):
            entry = list_entry(d)
            if _unversioned(have.pop(d["_id"], None)) != _unversioned(entry):  # entries from before versions stay
                changed.append(entry)
            if d.get("status", {}).get("phase") in QUEUED_PHASES:
                queued.append(
                    {
                        "_id": d["_id"],
                        "project_id": d["project_id"],
                        "user_name": d["user_name"],
                        "v": d.get("status_version", 0),
                    }
                )
        if have:  # entries of jobs that are gone
            await self.listing.delete_many({"_id": {"$in": list(have)}})
        for i in range(0, len(queued), 1000):
            await self.queue.insert_many(queued[i : i + 1000])
        for entry in changed:
            await self.listing.replace_one({"_id": entry["_id"]}, entry, upsert=True)
        return len(queued)

    async def sync_views(self, job_id: str) -> None:
        """Bring the job's queue entry and list entry in line with its stored phase (a redelivered or older status:
        a crash may have come between the job's write and theirs). Entries are versioned: a write for an older
        status than the entry's is refused, so concurrent writers end at the latest version's views."""
        doc = await self.jobs.find_one({"_id": job_id}, VIEW_FIELDS)
        if doc is None:
            await self.queue.delete_one({"_id": job_id})
        else:
            await self._write_views(doc, queue=True)

    async def _write_views(self, doc: dict[str, Any], *, queue: bool, later: bool = False) -> None:
        """The job's list entry, and (`queue`) its queue entry, as its stored phase at its version says; `later`:
        a list entry of a phase that does not end the job, and a queue entry that leaves the queue, wait
        (`LIST_LATER_S`)."""
        version = doc.get("status_version", 0)
        if queue:
            queued = doc.get("status", {}).get("phase") in QUEUED_PHASES
            owner = (doc["project_id"], doc["user_name"]) if queued else None
            await self._queue_entry(doc["_id"], version, owner=owner, later=later)
        entry = list_entry(doc)
        job_id = entry.pop("_id")
        await self._list_entry(job_id, version, {"$set": entry}, later=later, upsert=True)

    async def _queue_entry(
        self, job_id: str, version: int, *, owner: tuple[str, str] | None, later: bool = False
    ) -> None:
        """The job's place in the queue for its status `version`: held by its (project, user), or (None) a
        tombstone that holds none; `later`: the tombstone waits (`LaterWrites`) like a passing phase's list entry,
        so the caps count a job that just left the queue a moment longer (never one that just entered it)."""
        if owner is not None:
            self.later_leaves.drop(job_id)
            update = {"$set": {"project_id": owner[0], "user_name": owner[1], "v": version}, "$unset": {"gone_s": ""}}
            await self._versioned(self.queue, job_id, version, update)
            return
        tombstone = {"$set": {"v": version, "gone_s": time.time()}, "$unset": {"project_id": "", "user_name": ""}}
        if later and self.list_later_s > 0:
            self.later_leaves.add(job_id, version, tombstone)
        else:
            self.later_leaves.drop(job_id)
            await self._versioned(self.queue, job_id, version, tombstone)
        await self._sweep_queue()

    async def write_waiting(self) -> None:
        """The entries that wait, written now."""
        await self.later_entries.write_now()
        await self.later_leaves.write_now()

    async def _list_entry(
        self, job_id: str, version: int, update: dict[str, Any], *, later: bool, upsert: bool
    ) -> None:
        """The job's list entry for its status `version`; one of a phase that does not end the job waits when
        `later` (`LaterWrites`: it updates the entry the job's insert made, never makes one)."""
        if later and self.list_later_s > 0 and update["$set"]["phase"] not in FINISHED:
            self.later_entries.add(job_id, version, update)
            return
        self.later_entries.drop(job_id)
        await self._versioned(self.listing, job_id, version, update, upsert=upsert)

    @staticmethod
    async def _versioned(collection, job_id: str, version: int, update: dict[str, Any], *, upsert: bool = True) -> None:
        """One view entry written for the job's status `version`, unless one for a newer status is there (its word
        stands); with other jobs' entries written at the same moment (`shared.grouped`)."""
        await update_grouped(collection, [({"_id": job_id, **older_than(version)}, update)], upsert=upsert)

    async def _sweep_queue(self) -> None:
        """Now and then, the tombstones of jobs that left the queue long enough ago that no status still races."""
        self.left_queue += 1
        if self.left_queue >= SWEEP_EVERY:
            self.left_queue = 0
            await self.queue.delete_many({"gone_s": {"$lt": time.time() - TOMBSTONE_S}})

    async def publish(self, job_id: str, entries: list[dict[str, Any]]) -> None:
        await self.store.flush(job_id, entries)

    async def publish_many(self, items: list[tuple[str, list[dict[str, Any]]]]) -> list[Exception | None]:
        return await self.store.flush_many(items)

    async def owners(self, job_ids: set[str]) -> dict[str, str]:
        """The project of each of these jobs that exists. A job's project never changes, so it is remembered: a
        page of nodes running known jobs reads nothing (a query by `$in` is a scan of every job on the embedded
        database, growing with the history)."""
        found = {job_id: project for job_id in job_ids if (project := self.known_owners.get(job_id)) is not None}
        if missing := list(job_ids - found.keys()):
            async for doc in self.jobs.find({"_id": {"$in": missing}}, {"project_id": 1}):
                found[doc["_id"]] = self.known_owners.put(doc["_id"], doc["project_id"])
        return found

    async def get(self, project_id: str, job_id: str) -> dict[str, Any] | None:
        return await self.jobs.find_one({"_id": job_id, "project_id": project_id})

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """The job whatever its project (a search's trial)."""
        return await self.jobs.find_one({"_id": job_id})

    async def exists(self, job_id: str) -> bool:
        return await self.jobs.find_one({"_id": job_id}, {"_id": 1}) is not None

    async def name_taken(self, project_id: str, name: str) -> bool:
        """Whether a job of the project has this name."""
        return await self.jobs.find_one({"project_id": project_id, "name": name}, {"_id": 1}) is not None

    async def finished(self, job_id: str) -> bool:
        """Whether the job is finished, or gone."""
        job = await self.jobs.find_one({"_id": job_id}, {"status": 1})
        return job is None or job["status"]["phase"] in FINISHED

    async def placements(self, job_id: str) -> list[dict[str, Any]]:
        """Where each attempt of the job was placed and why, by attempt (none when placements are not kept)."""
        if self.origins is None:
            return []
        docs = [d async for d in self.origins.placements.find({"job_id": job_id})]
        return sorted(docs, key=lambda d: d["attempt"])

    async def ping(self) -> None:
        """Raise when the database does not answer."""
        await self.db.command("ping")

    async def page(self, project_id: str, *, phases: list[str], offset: int, limit: int) -> tuple[int, list[dict]]:
        """A page of the project's jobs, newest first, and how many there are: counted and sorted on the list
        entries, then the page's jobs read by id (a job deleted in between is left out)."""
        query: dict[str, Any] = {"project_id": project_id}
        if phases:
            query["phase"] = {"$in": phases}
        total = await self.listing.count_documents(query)
        cursor = self.listing.find(query, {"_id": 1}).sort([("created_s", DESCENDING), ("_id", DESCENDING)])
        ids = [d["_id"] async for d in cursor.skip(offset).limit(limit)]
        docs = await asyncio.gather(*(self.jobs.find_one({"_id": job_id}) for job_id in ids))
        return total, [d for d in docs if d is not None]

    async def delete(self, job_id: str, *, finished: list[str]) -> bool:
        result = await self.jobs.delete_one({"_id": job_id, "status.phase": {"$in": finished}})
        if result.deleted_count:
            self.later_entries.drop(job_id)
            self.later_leaves.drop(job_id)
            await self.queue.delete_one({"_id": job_id})
            await self.listing.delete_one({"_id": job_id})
            await self.output.forget(job_id)
            if self.origins is not None:
                await self.origins.forget(job_id)
        return bool(result.deleted_count)

    async def apply_status(self, event: JobStatusChanged) -> None:
        """Newer versions only: a redelivered or out-of-order event changes nothing but brings the views in line
        again (a crash may have come between the job's write and theirs). The views follow the phase alone, so a
        status that keeps it costs one command; one that changes it writes only the entries it moves (the queue
        entry only when the job enters or leaves the queue), each refused where a newer status already wrote it."""
        if event.phase.is_finished():  # for good, whichever of its statuses this process writes
            self.finished_here.put(event.job_id, True)
        if moved_from(event) is not None:
            await self._apply_moved(event)
            return
        before = await self.jobs.find_one_and_update(
            {"_id": event.job_id, "status_version": {"$lt": event.version}},
            {"$set": status_fields(event)},
            projection=VIEW_FIELDS,
            return_document=ReturnDocument.BEFORE,
        )
        if before is None:
            await self.sync_views(event.job_id)
            return
        phase, was = event.phase.value, before.get("status", {}).get("phase")
        if phase == was:
            return
        after = {**before, "status": {**before.get("status", {}), "phase": phase}, "status_version": event.version}
        await self._write_views(after, queue=(phase in QUEUED_PHASES) != (was in QUEUED_PHASES), later=True)

    async def _apply_moved(self, event: JobStatusChanged) -> None:
        """A status that says its job's phase before it (the monitor's every status does: `previous_phase` at
        `version - 1`) and does not put the job in the queue: its write and its entries need no answer, so each
        goes with whatever else is written at that moment (`shared.grouped`). Each version moves the entries it
        moved the phase for, refused where a newer one wrote them, so they end at the latest status whatever the
        order; a redelivery rewrites nothing. Entries are updated, never made: a deleted job's stay gone."""
        update = {"$set": status_fields(event)}
        await update_grouped(self.jobs, [({"_id": event.job_id, "status_version": {"$lt": event.version}}, update)])
        phase, was = event.phase.value, moved_from(event)
        if phase == was:
            return
        if was in QUEUED_PHASES and phase not in QUEUED_PHASES:
            await self._queue_entry(event.job_id, event.version, owner=None, later=True)
        entry = {"$set": {"phase": phase, "v": event.version}}
        await self._list_entry(event.job_id, event.version, entry, later=True, upsert=False)

    async def apply_eta(self, event: EtaEstimated) -> None:
        """Show the job's latest estimate (None: none) while it has not finished. An estimate of a job this process
        saw finish (the estimator's last word on it, mostly) writes nothing: the finished status cleared it."""
        if self.finished_here.get(event.job_id):
            return
        eta = event.eta.model_dump(mode="json") if event.eta else None
        await update_grouped(
            self.jobs,
            [
                (
                    {"_id": event.job_id, "status.phase": {"$nin": ["Completed", "Failed", "Terminated"]}},
                    {"$set": {"status.eta": eta}},
                )
            ],
        )
