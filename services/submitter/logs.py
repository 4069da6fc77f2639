"""Reading a job's output: a page of lines, or following it until the job ends.

Lines are numbered from 0, the first line the rank ever printed; lines dropped to keep the job under its stored
output cap keep their numbers, so an offset means the same line before and after a trim. The `--- attempt N ---`
separators and the dropped-lines notice are not numbered.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from shared.events import JobStatusChanged
from services.submitter.logstore import LogStore
from services.submitter.repository import Repository

log = logging.getLogger(__name__)

POLL_S = 0.3
PAGE_LINES = 10_000  # the default page
MAX_PAGE_LINES = 100_000
MAX_PAGE_BYTES = 1024 * 1024  # a page also ends here, whatever its limit
GAP_PATIENCE_S = 3.0  # a chunk still in flight after the job ended is waited for this long
TAIL_PATIENCE_S = 1.0  # a chunk of a task whose end no agent reported (lost with its node) may still land
OUTPUT_HOLD_S = 15.0  # a finished status waits at most this long for its tasks' output (an agent that never marks it)


def reported_ranks(event: JobStatusChanged) -> list[int]:
    """Ranks of a finished status whose end an agent reported with an exit code: each shipped its whole output,
    marked last, before that report."""
    if not event.phase.is_finished() or not event.attempt:
        return []
    return [
        int(t.task.rsplit("-", 1)[-1])
        for t in event.task_statuses
        if t.exit_code is not None and t.task.rsplit("-", 1)[-1].isdigit()
    ]


async def output_stored(repo: Repository, event: JobStatusChanged, *, now: datetime) -> bool:
    """Whether a status may be shown: a finished one only once its tasks' final output is stored (output and status
    travel on different streams), so a job shown Completed has its last line stored; never held past
    OUTPUT_HOLD_S."""
    missing = [
        rank
        for rank in reported_ranks(event)
        if not await repo.output.complete(event.job_id, attempt=event.attempt, rank=rank)
    ]
    if missing and (now - event.occurred_at).total_seconds() > OUTPUT_HOLD_S:
        log.warning(
            "job %s shown %s without all of its output (ranks %s): not stored after %.0fs",
            event.job_id,
            event.phase,
            missing,
            OUTPUT_HOLD_S,
        )
        return True
    return not missing


def contiguous(chunks: list[dict], position: tuple[int, int]) -> list[dict]:
    """The chunks that follow `position` without a gap (a new attempt starts at seq 0)."""
    out = []
    attempt, seq = position
    for chunk in chunks:
        if (chunk["attempt"] == attempt and chunk["seq"] == seq + 1) or (
            chunk["attempt"] > attempt and chunk["seq"] == 0
        ):
            out.append(chunk)
            attempt, seq = chunk["attempt"], chunk["seq"]
        else:
            break
    return out


def render_chunk(chunk: dict, previous_attempt: int) -> str:
    header = (
        f"--- attempt {chunk['attempt']} ---\n" if chunk["attempt"] != previous_attempt and previous_attempt > 0 else ""
    )
    return header + "".join(f"{line}\n" for line in chunk["lines"])


def dropped_notice(count: int) -> str:
    return f"… {count} earlier lines dropped (the job's stored output is capped; the oldest goes first) …\n"


@dataclass(frozen=True)
class Page:
    text: str
    offset: int
    next_offset: int
    more: bool
    dropped: int


async def read_page(output: LogStore, job_id: str, *, rank: int, offset: int, limit: int) -> Page:
    """Lines [offset, offset + limit) of one rank's output, at most MAX_PAGE_BYTES of them."""
    dropped = await output.dropped_lines(job_id, rank=rank)
    start = max(offset, dropped)
    text, size, taken, position, previous = [], 0, 0, dropped, 0  # position: the current chunk's first line
    if offset < dropped:
        text.append(dropped_notice(dropped - offset))
    more = False
    async for chunk in output.each(job_id, rank=rank):
        lines = chunk["lines"]
        if position + len(lines) <= start:
            position, previous = position + len(lines), chunk["attempt"]
            continue
        skip = max(0, start - position)
        if chunk["attempt"] != previous and previous > 0 and skip == 0:
            text.append(f"--- attempt {chunk['attempt']} ---\n")
        previous = chunk["attempt"]
        for line in lines[skip:]:
            if taken >= limit or (taken and size + len(line) + 1 > MAX_PAGE_BYTES):
                more = True
                break
            text.append(f"{line}\n")
            size, taken = size + len(line) + 1, taken + 1
        if more:
            break
        position += len(lines)
    return Page(text="".join(text), offset=start, next_offset=start + taken, more=more, dropped=dropped)


async def follow(
    repo: Repository, job_id: str, *, rank: int, disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[str]:
    """Yield output as it arrives until the job has finished and its last chunk was sent."""
    position = (0, -1)
    previous_attempt, announced = 0, 0
    gap_since: float | None = None
    quiet_since: float | None = None
    loop = asyncio.get_running_loop()
    while not await disconnected():
        finished = await repo.finished(job_id)
        chunks = await repo.output.after(job_id, rank=rank, position=position)
        ready = contiguous(chunks, position)
        if not ready and chunks and (dropped := await repo.output.dropped_lines(job_id, rank=rank)) > announced:
            yield dropped_notice(dropped - announced)  # the gap was trimmed away: it will never fill
            announced = dropped
            ready = contiguous(chunks, (chunks[0]["attempt"], chunks[0]["seq"] - 1))
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
