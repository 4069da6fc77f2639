"""The submitter's collections: jobs as the API shows them, their views (queue, list), the placements their output
is checked against; their output (`logstore`) and notifications (`notificationstore`) through stores of their own.
The one door to them: no other module of the submitter names a collection."""

import asyncio
import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from faststream.nats import NatsBroker
from pymongo import DESCENDING, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from shared.events import EtaEstimated, JobStatusChanged, Message
from shared.grouped import update_grouped
from shared.jobs import FINISHED
from shared.lru import Lru
from shared.origin import Origins
from shared.store import DEFER_PULLS_S, DocumentStore
from services.submitter.caps import QUEUED_PHASES
from services.submitter.later import LaterWrites
from services.submitter.logstore import LOG_CAP_BYTES, LogStore
from services.submitter.notificationstore import NotificationStore
from services.submitter.refusals import NameTaken
from services.submitter.viewentries import LIST_LATER_S, VIEW_FIELDS, ViewEntries
from services.submitter.views import SECRET_VALUES, status_fields

log = logging.getLogger(__name__)

OWNERS_REMEMBERED = 100_000  # jobs whose project is remembered (it never changes): ~10 MB at most
FINISHED_REMEMBERED = 100_000  # jobs seen finishing here (never to run again): their late estimates are not written


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
    output: LogStore = field(init=False, repr=False)  # the jobs' stored output
    notifications: NotificationStore = field(init=False, repr=False)  # notifications and the projects' webhooks

    def __post_init__(self) -> None:
        self.output = LogStore(self.db.api_logs, self.db.api_log_sizes, cap_bytes=self.log_cap_bytes)
        self.notifications = NotificationStore(self.db.api_notifications, self.db.api_projects)

    @property
    def jobs(self):
        return self.db.api_jobs

    @cached_property
    def store(self) -> DocumentStore:
        """Jobs as every service stores its state: with their outgoing events, by revision. A new job's
        announcement is pulled off its outbox `DEFER_PULLS_S` after its publish, with every other published then (one
        write for a burst's seconds, not one for each intake group); a crash leaves it to the relay, stored once."""
        return DocumentStore(self.jobs, self.broker, defer_pulls_s=DEFER_PULLS_S)

    @cached_property
    def views(self) -> ViewEntries:
        """The jobs' queue and list entries."""
        return ViewEntries(self.db.api_queue, self.db.api_job_list, list_later_s=self.list_later_s)

    @property
    def queue(self):
        """The queue view (`ViewEntries`)."""
        return self.views.queue

    @property
    def listing(self):
        """The list view (`ViewEntries`)."""
        return self.views.listing

    @property
    def later_entries(self) -> LaterWrites:
        return self.views.later_entries

    @property
    def later_leaves(self) -> LaterWrites:
        return self.views.later_leaves

    async def create_indexes(self) -> None:
        await self.jobs.create_index([("project_id", 1), ("name", 1)], unique=True)
        await self.jobs.create_index([("project_id", 1), ("create_time", -1)])
        await self.jobs.create_index([("user_name", 1)])
        await self.views.create_indexes()
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
        try:
            pending = await self.store.insert_many([(doc["_id"], doc, [event]) for doc, event in new])
            stored = [doc for (doc, _), entries in zip(new, pending) if entries is not None]
            if stored:
                await self.views.add_new(stored)
        except Exception:  # the jobs may be stored all the same (an answer lost): their entries with them
            await self._mend_views([doc["_id"] for doc, _ in new])
            raise
        taken = [doc for (doc, _), entries in zip(new, pending) if entries is None]
        if taken:  # a retry, most often, of a create whose job was stored and whose entries may not have been
            await self._mend_views([await self.job_id_named(doc["project_id"], doc["name"]) for doc in taken])
        return [
            NameTaken(doc["name"], project_id=doc["project_id"]) if entries is None else entries
            for (doc, _), entries in zip(new, pending)
        ]

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        """Jobs of a project or of a user accepted and not yet running (counted on the queue view)."""
        return await self.views.queued_count(project_id=project_id, user_name=user_name)

    def queued_added(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        """Places in the queue this process gave a project's or a user's jobs since it started (only grows)."""
        return self.views.added[("project", project_id) if project_id else ("user", user_name or "")]

    async def rebuild_views(self) -> int:
        """At start: the views from the jobs themselves (`ViewEntries.rebuild`); how many jobs are queued."""
        return await self.views.rebuild(self.jobs)

    async def sync_views(self, job_id: str) -> None:
        """Bring the job's queue entry and list entry in line with its stored phase (a redelivered or older status:
        a crash may have come between the job's write and theirs). Entries are versioned: a write for an older
        status than the entry's is refused, so concurrent writers end at the latest version's views."""
        doc = await self.jobs.find_one({"_id": job_id}, VIEW_FIELDS)
        if doc is None:
            await self.queue.delete_one({"_id": job_id})
        else:
            await self.views.write(doc, queue=True)

    async def write_waiting(self) -> None:
        """The entries that wait, written now."""
        await self.views.write_waiting()

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

    async def secrets_of(self, job_id: str) -> tuple[str, int, str] | None:
        """A job's phase, attempt and its secrets as stored (sealed: `sealing`; "" for none, or once it ended); None
        for no such job."""
        doc = await self.jobs.find_one({"_id": job_id}, {SECRET_VALUES: 1, "status": 1})
        if doc is None:
            return None
        status, sealed = doc.get("status", {}), doc.get(SECRET_VALUES)
        return status.get("phase", ""), int(status.get("attempt") or 0), sealed if isinstance(sealed, str) else ""

    async def exists(self, job_id: str) -> bool:
        return await self.jobs.find_one({"_id": job_id}, {"_id": 1}) is not None

    async def name_taken(self, project_id: str, name: str) -> bool:
        """Whether a job of the project has this name."""
        return await self.job_id_named(project_id, name) is not None

    async def job_id_named(self, project_id: str, name: str) -> str | None:
        doc = await self.jobs.find_one({"project_id": project_id, "name": name}, {"_id": 1})
        return None if doc is None else doc["_id"]

    async def _mend_views(self, job_ids: list[str | None]) -> None:
        """The entries of jobs whose create failed after their write or whose name a retry found taken: a job
        stored whose entries were not (its answer lost, its process killed between the two) ran listed by no one
        and counted by no cap, its statuses updating entries, never making them (seen in the failover test). Best
        effort: what this cannot write is left to the next start's rebuild."""
        try:
            for job_id in job_ids:
                if job_id is not None:
                    await self.sync_views(job_id)
        except Exception as exc:
            log.warning("the entries of stored jobs not checked (the next start's rebuild will): %r", exc)

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
            await self.views.gone(job_id)
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
        await self.views.write(after, queue=(phase in QUEUED_PHASES) != (was in QUEUED_PHASES), later=True)

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
            await self.views.queue_entry(event.job_id, event.version, owner=None, later=True)
        entry = {"$set": {"phase": phase, "v": event.version}}
        await self.views.list_entry(event.job_id, event.version, entry, later=True, upsert=False)

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
