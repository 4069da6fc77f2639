"""Output lines of a task to the bus in ordered chunks, and to a file beside the attempt."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from shared.events import LogChunk, LogLine
from services.agent.outputrate import OutputRate, dropped_notice

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
MAX_LINES_PER_CHUNK = 500


class LogShipper:
    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        rank: int,
        node_id: str,
        path: Path,
        publish: Callable[[LogChunk], Awaitable[None]],
        rate: OutputRate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id, self.attempt, self.rank, self.node_id = job_id, attempt, rank, node_id
        self.publish = publish
        self.rate, self.clock = rate, clock  # how fast the task may print; past it its lines are dropped
        self.file = path.open("a", encoding="utf-8")
        self.buffer: list[LogLine] = []
        self.seq = 0
        self.wakeup = asyncio.Event()
        self.closing = False
        self.ended = False  # the chunk marked last was shipped
        self.task = asyncio.create_task(self._loop())

    def add(self, line: LogLine) -> None:
        """A line the task printed: shipped within its allowance, else dropped (and counted in one notice line
        before the next line that goes out, or at the end)."""
        if self.rate is not None:
            if not self.rate.admit(len(line.line.encode(errors="replace")), now=self.clock()):
                return
            self._notice_dropped()
        self._keep(line)

    def note(self, text: str) -> None:
        """A line of the agent's own about the task (never dropped)."""
        self._keep(LogLine(t=time.time(), s="err", line=f"[trainmaster] {text}"))

    def _notice_dropped(self) -> None:
        if self.rate is not None and (dropped := self.rate.take_dropped()):
            self._keep(LogLine(t=time.time(), s="err", line=dropped_notice(dropped, self.rate)))

    def _keep(self, line: LogLine) -> None:
        self.buffer.append(line)
        self.file.write(f"{line.line}\n")
        if len(self.buffer) >= MAX_LINES_PER_CHUNK:
            self.wakeup.set()

    async def close(self) -> None:
        """Ship everything still buffered, the final chunk marked `last` (empty when nothing was left), then stop.
        Every publish waits for the stream's ack, so the output is all in the stream before the task's end is
        reported: the submitter shows a job finished only once it has stored up to that chunk."""
        self._notice_dropped()
        self.closing = True
        self.wakeup.set()
        await self.task
        self.file.close()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.wakeup.wait(), timeout=FLUSH_INTERVAL_S)
            except TimeoutError:
                pass
            self.wakeup.clear()
            self.file.flush()
            closing = self.closing  # nothing is added once closing: what is buffered now is the rest
            while self.buffer or (closing and not self.ended):
                lines = tuple(self.buffer[:MAX_LINES_PER_CHUNK])
                last = closing and len(lines) == len(self.buffer)
                # the node in the id too: no other publisher's chunk can share it, signed or not (`bus.dedup_id`)
                event_id = f"{self.job_id}:{self.attempt}:{self.rank}:{self.node_id}:log:{self.seq}"
                chunk = LogChunk(
                    event_id=event_id,
                    job_id=self.job_id,
                    attempt=self.attempt,
                    rank=self.rank,
                    node_id=self.node_id,
                    seq=self.seq,
                    lines=lines,
                    last=last,
                )
                try:
                    await self.publish(chunk)
                except Exception as exc:  # the bus is down: keep the lines, try again shortly
                    log.warning("log chunk %s not shipped yet: %r", chunk.event_id, exc)
                    await asyncio.sleep(1)
                    continue
                del self.buffer[: len(lines)]
                self.seq += 1
                self.ended = last
            if closing:
                return
