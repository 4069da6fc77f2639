"""Stored output: paged by lines, capped per job (the oldest goes, and the log says so), followed across a trim."""

import asyncio
from types import SimpleNamespace

from shared.events import LogChunk, LogLine
from services.submitter.logs import follow, read_page
from services.submitter.repository import Repository
from tests.memory import MemoryCollection


def repository(*, cap: int = 1 << 20) -> Repository:
    db = SimpleNamespace(
        api_jobs=MemoryCollection(),
        api_logs=MemoryCollection(),
        api_log_sizes=MemoryCollection(),
        api_notifications=MemoryCollection(),
        api_projects=MemoryCollection(),
    )
    return Repository(db=db, broker=None, log_cap_bytes=cap)


async def ship(repo: Repository, *, job_id: str = "j", attempt: int = 1, seq: int, lines: list[str], rank: int = 0):
    await repo.output.add(
        LogChunk(
            event_id=f"{job_id}:{attempt}:{rank}:{seq}",
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            node_id="n1",
            seq=seq,
            lines=tuple(LogLine(t=0, line=line) for line in lines),
        )
    )


async def test_pages_cover_the_output_once_and_say_where_the_next_starts():
    repo = repository()
    for seq in range(5):
        await ship(repo, seq=seq, lines=[f"line {seq * 10 + i}" for i in range(10)])
    await ship(repo, attempt=2, seq=0, lines=["again"])
    first = await read_page(repo.output, "j", rank=0, offset=0, limit=15)
    assert first.text.splitlines() == [f"line {i}" for i in range(15)]
    assert (first.offset, first.next_offset, first.more, first.dropped) == (0, 15, True, 0)
    second = await read_page(repo.output, "j", rank=0, offset=first.next_offset, limit=100)
    assert second.text.splitlines() == [f"line {i}" for i in range(15, 50)] + ["--- attempt 2 ---", "again"]
    assert (second.next_offset, second.more) == (51, False)
    past = await read_page(repo.output, "j", rank=0, offset=1000, limit=10)
    assert (past.text, past.next_offset, past.more) == ("", 1000, False)


async def test_a_redelivered_chunk_is_counted_once():
    repo = repository()
    await ship(repo, seq=0, lines=["a" * 99])
    await ship(repo, seq=0, lines=["a" * 99])
    assert await repo.output.stored_bytes("j") == 100


async def test_past_the_cap_the_oldest_chunks_go_and_the_log_says_so():
    repo = repository(cap=2000)
    for seq in range(30):  # 30 chunks of 10 lines of 10 bytes: 3,000 bytes
        await ship(repo, seq=seq, lines=[f"{seq:03d}-{i:05d}" for i in range(10)])
    stored = await repo.output.stored_bytes("j")
    assert stored <= 2000
    dropped = await repo.output.dropped_lines("j", rank=0)
    assert dropped > 0 and dropped + stored // 10 == 300  # every line is either stored or counted as dropped
    page = await read_page(repo.output, "j", rank=0, offset=0, limit=10_000)
    lines = page.text.splitlines()
    assert lines[0] == f"… {dropped} earlier lines dropped (the job's stored output is capped; the oldest goes first) …"
    assert lines[-1] == "029-00009" and len(lines) == 1 + 300 - dropped
    assert (page.offset, page.next_offset, page.dropped) == (dropped, 300, dropped)
    same = await read_page(repo.output, "j", rank=0, offset=295, limit=10)  # numbers survive the trim
    assert same.text.splitlines() == [f"029-0000{i}" for i in range(5, 10)]


async def test_follow_reports_the_trimmed_gap_instead_of_waiting_for_it():
    repo = repository(cap=2000)
    await repo.db.api_jobs.insert_one({"_id": "j", "status": {"phase": "Completed"}})
    for seq in range(30):
        await ship(repo, seq=seq, lines=[f"{seq:03d}-{i:05d}" for i in range(10)])

    async def connected() -> bool:
        return False

    text = "".join([piece async for piece in follow(repo, "j", rank=0, disconnected=connected)])
    assert text.startswith(f"… {await repo.output.dropped_lines('j', rank=0)} earlier lines dropped")
    assert text.rstrip().endswith("029-00009")


class Yielding(MemoryCollection):
    """Gives the loop away before every write, as a real database does, so concurrent handlers interleave."""

    async def insert_one(self, doc):
        await asyncio.sleep(0)
        return await super().insert_one(doc)

    async def update_one(self, *args, **kwargs):
        await asyncio.sleep(0)
        return await super().update_one(*args, **kwargs)

    async def delete_one(self, query):
        await asyncio.sleep(0)
        return await super().delete_one(query)


async def test_chunks_stored_concurrently_are_trimmed_once_not_once_each():
    repo = repository(cap=2000)
    repo.output.chunks, repo.output.sizes = Yielding(), Yielding()
    await asyncio.gather(*(ship(repo, seq=seq, lines=[f"{seq:03d}-{i:05d}" for i in range(10)]) for seq in range(30)))
    stored = await repo.output.stored_bytes("j")
    assert 2000 * 0.9 - 100 <= stored <= 2000  # back under the cap, not emptied by thirty trims at once
    assert await repo.output.dropped_lines("j", rank=0) + stored // 10 == 300
