"""The submitter's collections: jobs as the API shows them, their output, users and tokens."""
from dataclasses import dataclass
from typing import Any

from faststream.nats import NatsBroker
from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from shared.events import EtaEstimated, JobStatusChanged, LogChunk, Message
from shared.store import OUTBOX, OUTBOX_COUNT, flush, outbox_entries
from services.submitter.views import status_fields


class NameTaken(Exception):
    """Another existing job of the project has this name."""


@dataclass
class Repository:
    db: AsyncDatabase
    broker: NatsBroker

    @property
    def jobs(self):
        return self.db.api_jobs

    @property
    def logs(self):
        return self.db.api_logs

    async def create_indexes(self) -> None:
        await self.jobs.create_index([("project_id", 1), ("name", 1)], unique=True)
        await self.jobs.create_index([("project_id", 1), ("create_time", -1)])
        await self.logs.create_index([("job_id", 1), ("rank", 1), ("attempt", 1), ("seq", 1)])
        await self.db.api_tokens.create_index("user_name")

    async def add(self, doc: dict[str, Any], event: Message) -> None:
        """Store a new job and the event announcing it in one write, then publish."""
        entries = outbox_entries([event])
        try:
            await self.jobs.insert_one({**doc, OUTBOX: entries, OUTBOX_COUNT: len(entries)})
        except DuplicateKeyError as exc:
            raise NameTaken(doc["name"]) from exc
        await flush(self.broker, self.jobs, doc["_id"], entries)

    async def get(self, project_id: str, job_id: str) -> dict[str, Any] | None:
        return await self.jobs.find_one({"_id": job_id, "project_id": project_id})

    async def page(self, project_id: str, *, phases: list[str], offset: int, limit: int) -> tuple[int, list[dict]]:
        query: dict[str, Any] = {"project_id": project_id}
        if phases:
            query["status.phase"] = {"$in": phases}
        total = await self.jobs.count_documents(query)
        cursor = self.jobs.find(query).sort([("create_time", DESCENDING), ("_id", DESCENDING)])
        return total, [d async for d in cursor.skip(offset).limit(limit)]

    async def delete(self, job_id: str, *, finished: list[str]) -> bool:
        result = await self.jobs.delete_one({"_id": job_id, "status.phase": {"$in": finished}})
        if result.deleted_count:
            await self.logs.delete_many({"job_id": job_id})
        return bool(result.deleted_count)

    async def apply_status(self, event: JobStatusChanged) -> None:
        """Newer versions only: a redelivered or out-of-order event changes nothing."""
        await self.jobs.update_one({"_id": event.job_id, "status_version": {"$lt": event.version}},
                                   {"$set": status_fields(event)})

    async def apply_eta(self, event: EtaEstimated) -> None:
        eta = event.eta.model_dump(mode="json") if event.eta else None
        await self.jobs.update_one({"_id": event.job_id, "status.phase": {"$nin": ["Completed", "Failed",
                                                                                     "Terminated"]}},
                                   {"$set": {"status.eta": eta}})

    async def add_log(self, chunk: LogChunk) -> None:
        try:
            await self.logs.insert_one({
                "_id": f"{chunk.job_id}:{chunk.attempt}:{chunk.rank}:{chunk.seq}",
                "job_id": chunk.job_id, "attempt": chunk.attempt, "rank": chunk.rank, "seq": chunk.seq,
                "lines": [line.line for line in chunk.lines],
            })
        except (DuplicateKeyError, BulkWriteError):
            pass

    async def log_chunks(self, job_id: str, *, rank: int, after: tuple[int, int]) -> list[dict[str, Any]]:
        """Chunks of one rank after (attempt, seq), in order."""
        attempt, seq = after
        query = {"job_id": job_id, "rank": rank,
                 "$or": [{"attempt": attempt, "seq": {"$gt": seq}}, {"attempt": {"$gt": attempt}}]}
        cursor = self.logs.find(query).sort([("attempt", 1), ("seq", 1)])
        return [d async for d in cursor]
