"""api_logs and api_log_sizes: a job's stored output, each chunk once, capped per job (the oldest goes first), and
the counters that say when a task's output is all stored. The only door to those collections (`logs` reads pages
and follows output through it)."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection

from shared.events import LogChunk
from shared.grouped import insert_grouped
from shared.lru import Lru
from shared.origin import dedup_key

LOG_CAP_BYTES = 10 * 1024 * 1024
TRIM_TO = 0.9  # a job over its cap is trimmed to 90% of it, so a chatty job is not trimmed at every chunk
COUNTS_REMEMBERED = 10_000  # jobs whose output counters are remembered


def _chunks_key(attempt: int, rank: int) -> str:
    """Field of a job's output counters: chunks of one task stored (each counted once: a repeat is refused)."""
    return f"chunks_{attempt}_{rank}"


def _last_key(attempt: int, rank: int) -> str:
    """Field of a job's output counters: the number of one task's chunk marked last."""
    return f"last_{attempt}_{rank}"


def _all_counted(sizes: dict[str, Any], attempt: int, rank: int) -> bool:
    """Whether the counters say every chunk of the task up to the one marked last is stored."""
    last = sizes.get(_last_key(attempt, rank))
    return last is not None and sizes.get(_chunks_key(attempt, rank), 0) > last


def chunk_bytes(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


@dataclass
class LogStore:
    chunks: AsyncCollection  # api_logs: one document per chunk
    sizes: AsyncCollection  # api_log_sizes: one document per job (bytes, chunks counted, last seen, dropped)
    cap_bytes: int = LOG_CAP_BYTES
    trimming: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # one trim at a time (one submitter)
    # Each job's output counters as this process last wrote them: they only grow, so when they say a task's output
    # is all stored, it is (another replica's chunks only add to them); when they do not, they are read.
    counts: Lru[str, dict[str, Any]] = field(default_factory=lambda: Lru(COUNTS_REMEMBERED), repr=False)

    async def create_indexes(self) -> None:
        await self.chunks.create_index([("job_id", 1), ("rank", 1), ("attempt", 1), ("seq", 1)])

    async def forget(self, job_id: str) -> None:
        """A deleted job's output and counters."""
        await self.chunks.delete_many({"job_id": job_id})
        await self.sizes.delete_one({"_id": job_id})

    async def add(self, chunk: LogChunk) -> None:
        """Keep a chunk of output once; past the job's cap its oldest chunks go (and are counted as dropped)."""
        lines = [line.line for line in chunk.lines]
        size = chunk_bytes(lines)
        stored = await insert_grouped(  # with other jobs' chunks of this moment
            self.chunks,
            {
                "_id": dedup_key(chunk),
                "job_id": chunk.job_id,
                "attempt": chunk.attempt,
                "rank": chunk.rank,
                "seq": chunk.seq,
                "lines": lines,
                "bytes": size,
                "last": chunk.last,
            },
        )
        if not stored:
            return  # a redelivery: counted when it was stored
        update: dict[str, Any] = {"$inc": {"bytes": size, _chunks_key(chunk.attempt, chunk.rank): 1}}
        if chunk.last:
            update["$set"] = {_last_key(chunk.attempt, chunk.rank): chunk.seq}
        total = await self.sizes.find_one_and_update(
            {"_id": chunk.job_id}, update, upsert=True, return_document=ReturnDocument.AFTER
        )
        if total:
            self.counts.put(chunk.job_id, total)
        if total and total.get("bytes", 0) > self.cap_bytes:
            await self.trim(chunk.job_id)

    async def trim(self, job_id: str) -> None:
        """Drop the job's oldest chunks until it is back under 90% of its cap. Oldest by (attempt, seq), not by
        arrival: chunks arrive out of order, and the lines dropped must be the first ones for the line numbers of
        the rest to hold. Chunks are stored concurrently: one trim at a time, each reading the size afresh."""
        async with self.trimming:
            total = await self.sizes.find_one({"_id": job_id})
            if not total or total.get("bytes", 0) <= self.cap_bytes:
                return  # the trim before this one did it
            await self._drop_oldest(job_id, excess=total["bytes"] - int(self.cap_bytes * TRIM_TO))

    async def _drop_oldest(self, job_id: str, *, excess: int) -> None:
        cursor = self.chunks.find({"job_id": job_id}).sort([("attempt", 1), ("seq", 1), ("rank", 1)])
        async for old in cursor:
            if excess <= 0:
                break
            if not (await self.chunks.delete_one({"_id": old["_id"]})).deleted_count:
                continue
            size = old.get("bytes", chunk_bytes(old["lines"]))
            excess -= size
            await self.sizes.update_one(
                {"_id": job_id}, {"$inc": {"bytes": -size, f"dropped_{old['rank']}": len(old["lines"])}}
            )

    async def complete(self, job_id: str, *, attempt: int, rank: int) -> bool:
        """Whether one task's output is all stored: its chunk marked last and every chunk before it (or some of its
        output was trimmed away, when the count can no longer tell). Read first from the job's counters (one
        document, kept by `add`; they count a chunk only once it is stored, so they never say "all" too early);
        when they do not say so (a crash between a chunk and its count, output from before they were kept), the
        chunks themselves are counted."""
        if _all_counted(self.counts.get(job_id) or {}, attempt, rank):
            return True
        sizes = await self.sizes.find_one({"_id": job_id}) or {}
        if sizes.get(f"dropped_{rank}"):
            return sizes.get(_last_key(attempt, rank)) is not None or await self._has_last(job_id, attempt, rank)
        if _all_counted(sizes, attempt, rank):
            return True
        where = {"job_id": job_id, "attempt": attempt, "rank": rank}
        last = await self.chunks.find_one({**where, "last": True}, {"seq": 1})
        return last is not None and await self.chunks.count_documents(where) > last["seq"]

    async def _has_last(self, job_id: str, attempt: int, rank: int) -> bool:
        return (
            await self.chunks.find_one({"job_id": job_id, "attempt": attempt, "rank": rank, "last": True}, {"seq": 1})
            is not None
        )

    async def dropped_lines(self, job_id: str, *, rank: int) -> int:
        """Lines of this rank's output that went to keep the job under its cap."""
        sizes = await self.sizes.find_one({"_id": job_id})
        return int((sizes or {}).get(f"dropped_{rank}", 0))

    async def after(self, job_id: str, *, rank: int, position: tuple[int, int]) -> list[dict[str, Any]]:
        """Chunks of one rank after (attempt, seq), in order."""
        attempt, seq = position
        query = {
            "job_id": job_id,
            "rank": rank,
            "$or": [{"attempt": attempt, "seq": {"$gt": seq}}, {"attempt": {"$gt": attempt}}],
        }
        return [d async for d in self.chunks.find(query).sort([("attempt", 1), ("seq", 1)])]

    async def each(self, job_id: str, *, rank: int) -> AsyncIterator[dict[str, Any]]:
        """Every stored chunk of one rank in order, read as the caller goes (a page stops early)."""
        async for chunk in self.chunks.find({"job_id": job_id, "rank": rank}).sort([("attempt", 1), ("seq", 1)]):
            yield chunk
