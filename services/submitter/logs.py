"""Reading a job's output: everything so far, or following it until the job ends."""
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from shared.jobs import FINISHED
from services.submitter.repository import Repository

POLL_S = 0.3
GAP_PATIENCE_S = 3.0  # a chunk still in flight after the job ended is waited for this long
TAIL_PATIENCE_S = 1.0  # output and status travel on different streams: the last lines may land after the end


def contiguous(chunks: list[dict], position: tuple[int, int]) -> list[dict]:
    """The chunks that follow `position` without a gap (a new attempt starts at seq 0)."""
    out = []
    attempt, seq = position
    for chunk in chunks:
        if (chunk["attempt"] == attempt and chunk["seq"] == seq + 1) or (chunk["attempt"] > attempt
                                                                          and chunk["seq"] == 0):
            out.append(chunk)
            attempt, seq = chunk["attempt"], chunk["seq"]
        else:
            break
    return out


def render_chunk(chunk: dict, previous_attempt: int) -> str:
    header = f"--- attempt {chunk['attempt']} ---\n" if chunk["attempt"] != previous_attempt and \
        previous_attempt > 0 else ""
    return header + "".join(f"{line}\n" for line in chunk["lines"])


async def read_all(repo: Repository, job_id: str, *, rank: int) -> str:
    chunks = await repo.log_chunks(job_id, rank=rank, after=(0, -1))
    text, previous = [], 0
    for chunk in chunks:
        text.append(render_chunk(chunk, previous))
        previous = chunk["attempt"]
    return "".join(text)


async def follow(
    repo: Repository, job_id: str, *, rank: int, disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[str]:
    """Yield output as it arrives until the job has finished and its last chunk was sent."""
    position = (0, -1)
    previous_attempt = 0
    gap_since: float | None = None
    quiet_since: float | None = None
    loop = asyncio.get_running_loop()
    while not await disconnected():
        job = await repo.jobs.find_one({"_id": job_id}, {"status": 1})
        finished = job is None or job["status"]["phase"] in FINISHED
        chunks = await repo.log_chunks(job_id, rank=rank, after=position)
        ready = contiguous(chunks, position)
        if not ready and chunks and finished:  # a gap that will not fill: skip it after a while
            gap_since = gap_since or loop.time()
            if loop.time() - gap_since > GAP_PATIENCE_S:
                ready, gap_since = chunks, None
        for chunk in ready:
            yield render_chunk(chunk, previous_attempt)
            previous_attempt = chunk["attempt"]
            position = (chunk["attempt"], chunk["seq"])
        if finished and not chunks:
            quiet_since = quiet_since or loop.time()
            if loop.time() - quiet_since > TAIL_PATIENCE_S:
                return
        else:
            quiet_since = None
        if not ready:
            await asyncio.sleep(POLL_S)
