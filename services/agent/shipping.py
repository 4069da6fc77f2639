"""Output lines of a task to the bus in ordered chunks, and to a file beside the attempt."""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.errors import MaxPayloadError

from shared.events import LogChunk, LogLine
from services.agent.outputrate import OutputRate, dropped_notice

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
MAX_LINES_PER_CHUNK = 500
# A chunk's lines as the bus carries them (JSON), at most this many bytes unless one line alone is longer (a line
# is at most `carriage.MAX_LINE_BYTES`, 1 MiB, six times that encoded when all control characters: under the
# server's 8 MB). Counted by raw bytes, two such lines made a chunk the server refused at every try, and the task's
# end waited behind it for ever (found by review).
MAX_CHUNK_BYTES = 2**21
LINE_OVERHEAD = 48  # a line's time, stream and field names, encoded
MIN_CHUNK_BYTES = 2**16  # a server that takes less than this a message is no server to ship output to
CUT_NOTE = " [trainmaster: cut here, the bus takes no larger message]"


def encoded_size(line: LogLine) -> int:
    return len(json.dumps(line.line, ensure_ascii=False).encode(errors="replace")) + LINE_OVERHEAD


def chunk_length(buffer: list[LogLine], cap_bytes: int = MAX_CHUNK_BYTES) -> int:
    """How many of the buffer's first lines make the next chunk: at most `MAX_LINES_PER_CHUNK` lines and `cap_bytes`
    encoded, at least one."""
    size = 0
    for n, line in enumerate(buffer[:MAX_LINES_PER_CHUNK]):
        size += encoded_size(line)
        if size > cap_bytes and n > 0:
            return n
    return min(len(buffer), MAX_LINES_PER_CHUNK)


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
        self.cap_bytes = MAX_CHUNK_BYTES  # halved each time the server refuses a chunk as too large
        self.mask: Callable[[str], str] | None = None  # the task's secrets out of each line (`jobsecrets.Masker`)
        self.task = asyncio.create_task(self._loop())

    def add(self, line: LogLine) -> None:
        """A line the task printed: shipped within its allowance, else dropped (and counted in one notice line
        before the next line that goes out, or at the end)."""
        if self.rate is not None:
            if not self.rate.admit(len(line.line.encode(errors="replace")), now=self.clock()):
                return
            self._notice_dropped()
        self._keep(line)

    def spent(self) -> bool:
        """Whether the task's output allowance is used up for now: what it prints is dropped without being split
        into lines (a task printing as fast as it could held a core of the agent splitting lines it then dropped)."""
        return self.rate is not None and self.rate.spent(now=self.clock())

    def drop(self, lines: int) -> None:
        if self.rate is not None:
            self.rate.drop(lines)

    def note(self, text: str) -> None:
        """A line of the agent's own about the task (never dropped)."""
        self._keep(LogLine(t=time.time(), s="err", line=f"[trainmaster] {text}"))

    def _notice_dropped(self) -> None:
        if self.rate is not None and (dropped := self.rate.take_dropped()):
            self._keep(LogLine(t=time.time(), s="err", line=dropped_notice(dropped, self.rate)))

    def _keep(self, line: LogLine) -> None:
        if self.mask is not None:
            line = line.model_copy(update={"line": self.mask(line.line)})
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

    def _smaller(self, lines: tuple[LogLine, ...]) -> None:
        """The next chunk smaller: fewer lines, or its one line cut (the rest of it is in the attempt's file)."""
        self.cap_bytes = max(MIN_CHUNK_BYTES, self.cap_bytes // 2)
        if len(lines) > 1:
            return
        [line] = lines
        log.warning("a line of job %s's output was cut: the bus refused it as too large", self.job_id)
        keep = min(len(line.line) // 2, self.cap_bytes // 8)  # a character is at most 6 bytes encoded
        self.buffer[0] = line.model_copy(update={"line": line.line[:keep] + CUT_NOTE})

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
                lines = tuple(self.buffer[: chunk_length(self.buffer, self.cap_bytes)])
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
                except MaxPayloadError:  # a server configured for smaller messages: never taken as it is
                    self._smaller(lines)
                    continue
                except Exception as exc:  # the bus is down: keep the lines, try again shortly
                    log.warning("log chunk %s not shipped yet: %r", chunk.event_id, exc)
                    await asyncio.sleep(1)
                    continue
                del self.buffer[: len(lines)]
                self.seq += 1
                self.ended = last
            if closing:
                return
