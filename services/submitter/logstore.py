"""api_logs and api_log_sizes: a job's stored output, each chunk once (the chunk document is all a chunk writes),
capped per job (the oldest goes, counted in the job's api_log_sizes document), and whether a task's output is all
stored. The only door to those collections (`logs` reads pages and follows output through it)."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared.events import LogChunk
from shared.grouped import insert_grouped
from shared.lru import Lru
from shared.origin import dedup_key

LOG_CAP_BYTES = 10 * 1024 * 1024
TRIM_TO = 0.9  # a job over its cap is trimmed to 90% of it, so a chatty job is not trimmed at every chunk
# A job's stored bytes are summed from its chunks each time this process stored this share of the cap more of its
# output: what this process alone holds in memory would miss the output another API replica (or this one before a
# restart) stored, so a job may go past its cap by this share per replica before it is trimmed.
SUM_EVERY = 0.1
COUNTS_REMEMBERED = 10_000  # jobs whose output this process stored is tallied in memory


def _chunks_key(attempt: int, rank: int) -> str:
    """Tally of a job's output: chunks of one task stored (each counted once: a repeat is refused)."""
    return f"chunks_{attempt}_{rank}"


def _last_key(attempt: int, rank: int) -> str:
    """Tally of a job's output: the number of one task's chunk marked last."""
    return f"last_{attempt}_{rank}"


def _top_key(attempt: int, rank: int) -> str:
    """Tally of a job's output: the highest number of one task's chunks stored."""
    return f"top_{attempt}_{rank}"


def _all_counted(sizes: dict[str, Any], attempt: int, rank: int) -> bool:
    """Whether the tally says every chunk of the task up to the one marked last is stored: the task's chunks are
    distinct numbers from 0 (one stored id each), so last + 1 of them, none above last, are exactly 0..last (a
    count alone would take numbers past "last" for missing ones)."""
    last = sizes.get(_last_key(attempt, rank))
    return (
        last is not None
        and sizes.get(_chunks_key(attempt, rank), 0) == last + 1
        and sizes.get(_top_key(attempt, rank)) == last
    )


def held_up_to_last(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The pipeline that answers, on the server, one task's chunk marked last (`last`, -1: none) and how many
    distinct chunk numbers from 0 to it are stored (`held`): all of its output is stored when held is last + 1.
    Standard stages and operators the embedded server also runs (a `$cond` on an expression, not a bare field)."""
    return [
        {"$match": task},
        {"$group": {"_id": "$seq", "marked": {"$max": {"$cond": [{"$eq": ["$last", True]}, 1, 0]}}}},
        {
            "$group": {
                "_id": None,
                "last": {"$max": {"$cond": [{"$eq": ["$marked", 1]}, "$_id", -1]}},
                "seqs": {"$push": "$_id"},
            }
        },
        {
            "$project": {
                "_id": 0,
                "last": 1,
                "held": {
                    "$size": {
                        "$filter": {
                            "input": "$seqs",
                            "as": "seq",
                            "cond": {"$and": [{"$gte": ["$$seq", 0]}, {"$lte": ["$$seq", "$last"]}]},
                        }
                    }
                },
            }
        },
    ]


def chunk_bytes(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


@dataclass
class LogStore:
    chunks: AsyncCollection  # api_logs: one document per chunk
    sizes: AsyncCollection  # api_log_sizes: one document per job whose output was trimmed (lines dropped, by rank)
    cap_bytes: int = LOG_CAP_BYTES
    trimming: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # one trim at a time (one submitter)
    # Each job's output as this process stored it (chunks per task, the one marked last, bytes not yet summed): it
    # only grows, so when it says a task's output is all stored, it is; when it does not, the chunks are read.
    counts: Lru[str, dict[str, Any]] = field(default_factory=lambda: Lru(COUNTS_REMEMBERED), repr=False)

    async def create_indexes(self) -> None:
        await self.chunks.create_index([("job_id", 1), ("rank", 1), ("attempt", 1), ("seq", 1)])

    async def forget(self, job_id: str) -> None:
        """A deleted job's output and counters."""
        self.counts.pop(job_id)
        await self.chunks.delete_many({"job_id": job_id})
        await self.sizes.delete_one({"_id": job_id})

    async def add(self, chunk: LogChunk) -> None:
        """Keep a chunk of output once: one insert, with other jobs' chunks of this moment (its counters were a
        second write before); past the job's cap its oldest chunks go (and are counted as dropped)."""
        lines = [line.line for line in chunk.lines]
        size = chunk_bytes(lines)
        stored = await insert_grouped(
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
        tally = self.counts.get(chunk.job_id) or self.counts.put(chunk.job_id, {})
        key = _chunks_key(chunk.attempt, chunk.rank)
        tally[key] = tally.get(key, 0) + 1
        top = _top_key(chunk.attempt, chunk.rank)
        tally[top] = max(tally.get(top, chunk.seq), chunk.seq)
        if chunk.last:
            tally[_last_key(chunk.attempt, chunk.rank)] = chunk.seq
        tally["unsummed"] = tally.get("unsummed", 0) + size
        if tally["unsummed"] >= self.cap_bytes * SUM_EVERY:
            tally["unsummed"] = 0
            await self.trim(chunk.job_id)

    async def stored_bytes(self, job_id: str) -> int:
        """The bytes of the job's output stored, summed from its chunks on the server."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"job_id": job_id}},
            {"$group": {"_id": None, "bytes": {"$sum": "$bytes"}}},
        ]
        summed = await (await self.chunks.aggregate(pipeline)).to_list()
        return int(summed[0]["bytes"]) if summed else 0

    async def trim(self, job_id: str) -> None:
        """Drop the job's oldest chunks until it is back under 90% of its cap. Oldest by (attempt, seq), not by
        arrival: chunks arrive out of order, and the lines dropped must be the first ones for the line numbers of
        the rest to hold. Chunks are stored concurrently: one trim at a time, each summing the bytes afresh."""
        async with self.trimming:
            stored = await self.stored_bytes(job_id)
            if stored <= self.cap_bytes:
                return  # the trim before this one did it
            await self._drop_oldest(job_id, excess=stored - int(self.cap_bytes * TRIM_TO))

    async def _drop_oldest(self, job_id: str, *, excess: int) -> None:
        cursor = self.chunks.find({"job_id": job_id}).sort([("attempt", 1), ("seq", 1), ("rank", 1)])
        async for old in cursor:
            if excess <= 0:
                break
            if not (await self.chunks.delete_one({"_id": old["_id"]})).deleted_count:
                continue
            excess -= old.get("bytes", chunk_bytes(old["lines"]))
            await self.sizes.update_one(
                {"_id": job_id}, {"$inc": {f"dropped_{old['rank']}": len(old["lines"])}}, upsert=True
            )

    async def complete(self, job_id: str, *, attempt: int, rank: int) -> bool:
        """Whether one task's output is all stored: its chunk marked last and every chunk before it (or some of its
        output was trimmed away, when the chunks can no longer tell). Answered first from what this process
        stored (it counts a chunk only once it is stored, so it never says "all" too early); else the server counts
        the task's chunks (one command, no chunk read back), and where they do not say so, whether lines of the
        rank were dropped."""
        if _all_counted(self.counts.get(job_id) or {}, attempt, rank):
            return True
        task = {"job_id": job_id, "attempt": attempt, "rank": rank}
        [counted] = await (await self.chunks.aggregate(held_up_to_last(task))).to_list() or [{"last": -1, "held": 0}]
        if counted["last"] >= 0 and counted["held"] == counted["last"] + 1:
            return True
        return counted["last"] >= 0 and await self.dropped_lines(job_id, rank=rank) > 0

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
