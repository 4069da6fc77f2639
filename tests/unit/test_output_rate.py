"""A task may print only so fast: past its lines/s and bytes/s (and the burst it saved up) lines are dropped, and
one notice line says how many before the next line that goes out, or at the end."""

import asyncio

from shared.events import LogChunk, LogLine
from services.agent.outputrate import OutputRate
from services.agent.shipping import LogShipper


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_past_the_allowance_are_refused_and_counted_until_it_refills():
    rate = OutputRate(lines_per_s=10, bytes_per_s=1_000_000, burst_s=2)  # 20 lines saved up
    assert sum(rate.admit(10, now=0.0) for _ in range(50)) == 20
    assert rate.take_dropped() == 30 and rate.take_dropped() == 0
    assert sum(rate.admit(10, now=1.0) for _ in range(50)) == 10  # one second: ten more


def test_bytes_past_the_allowance_are_refused_whatever_the_line_count():
    rate = OutputRate(lines_per_s=1_000_000, bytes_per_s=1000, burst_s=1)
    assert rate.admit(499, now=0.0) and rate.admit(499, now=0.0)
    assert not rate.admit(0, now=0.0)
    assert rate.admit(10**8, now=5.0)  # a line longer than the whole allowance waits for all of it
    assert not rate.admit(0, now=5.0)


async def test_a_task_printing_100_mb_ships_its_allowance_and_one_notice(tmp_path):
    chunks: list[LogChunk] = []

    async def publish(chunk: LogChunk) -> None:
        chunks.append(chunk)

    clock = Clock()
    rate = OutputRate(lines_per_s=100, bytes_per_s=64 * 1024, burst_s=10)
    shipper = LogShipper(
        job_id="j",
        attempt=1,
        rank=0,
        node_id="n1",
        path=tmp_path / "output.log",
        publish=publish,
        rate=rate,
        clock=clock,
    )
    line = "x" * 1023
    for _ in range(100 * 1024):  # 100 MB in one go
        shipper.add(LogLine(t=0.0, line=line))
    clock.now = 1.0
    shipper.add(LogLine(t=1.0, line="after a second"))
    await shipper.close()
    lines = [item.line for chunk in chunks for item in chunk.lines]
    shipped = [text for text in lines if text == line]
    assert len(shipped) == 640  # 10 s of 64 KiB, in 1 KiB lines
    notices = [text for text in lines if "lines dropped" in text]
    assert notices == [
        f"[trainmaster] {100 * 1024 - 640} lines dropped: the task printed faster than 100 lines/s "
        "or 65536 bytes/s (with 10 s of either saved up)"
    ]
    assert lines[-2:] == [notices[0], "after a second"]
    assert (tmp_path / "output.log").stat().st_size < 1024 * 1024


async def test_what_is_dropped_at_the_end_is_noticed_at_the_end(tmp_path):
    chunks: list[LogChunk] = []

    async def publish(chunk: LogChunk) -> None:
        chunks.append(chunk)

    shipper = LogShipper(
        job_id="j",
        attempt=1,
        rank=0,
        node_id="n1",
        path=tmp_path / "output.log",
        publish=publish,
        rate=OutputRate(lines_per_s=1, bytes_per_s=1000, burst_s=3),
        clock=Clock(),
    )
    for i in range(10):
        shipper.add(LogLine(t=0.0, line=f"line {i}"))
    shipper.note("own line, never dropped")
    await shipper.close()
    lines = [item.line for chunk in chunks for item in chunk.lines]
    assert lines[:3] == ["line 0", "line 1", "line 2"]
    assert lines[3] == "[trainmaster] own line, never dropped"
    assert lines[4].startswith("[trainmaster] 7 lines dropped") and chunks[-1].last


async def test_lines_of_control_characters_within_the_allowance_never_make_a_chunk_the_bus_refuses(tmp_path):
    """Two 1-MB lines of control characters passed the byte allowance and made one chunk of 11 MB as JSON, which
    the server (8 MB at most) refused at every try: the task's end waited behind it for ever (found by review)."""
    sent: list[LogChunk] = []

    async def publish(chunk: LogChunk) -> None:  # as nats-py refuses a payload past the server's max_payload
        if len(chunk.model_dump_json()) > 8 * 2**20:
            raise RuntimeError("nats: maximum payload exceeded")
        sent.append(chunk)

    rate = OutputRate(lines_per_s=500, bytes_per_s=65536, burst_s=40)
    shipper = LogShipper(
        job_id="j", attempt=1, rank=0, node_id="n", path=tmp_path / "out.log", publish=publish, rate=rate
    )
    for n in (1_000_000, 900_000, 10):
        shipper.add(LogLine(t=0.0, line="\x01" * n))
    await asyncio.wait_for(shipper.close(), 10)
    assert [len(c.lines) for c in sent] == [1, 1, 1] and sent[-1].last  # each past 2 MiB encoded alone
    assert [len(line.line) for c in sent for line in c.lines] == [1_000_000, 900_000, 10]


async def test_a_server_that_takes_smaller_messages_gets_smaller_chunks_and_cut_lines(tmp_path):
    """NATS's own default is 1 MB a message: a refused chunk was tried again as it was, for ever."""
    from nats.errors import MaxPayloadError

    sent: list[LogChunk] = []

    async def publish(chunk: LogChunk) -> None:
        if len(chunk.model_dump_json()) > 2**20:
            raise MaxPayloadError
        sent.append(chunk)

    shipper = LogShipper(job_id="j", attempt=1, rank=0, node_id="n", path=tmp_path / "out.log", publish=publish)
    for line in ["a" * 600_000, "b" * 600_000, "\x01" * 400_000, "end"]:
        shipper.add(LogLine(t=0.0, line=line))
    await asyncio.wait_for(shipper.close(), 10)
    shipped = [line.line for c in sent for line in c.lines]
    assert shipped[:2] == ["a" * 600_000, "b" * 600_000] and shipped[-1] == "end" and sent[-1].last
    assert shipped[2].startswith("\x01" * 1000) and shipped[2].endswith("the bus takes no larger message]")
    assert (tmp_path / "out.log").read_text().count("\x01") == 400_000  # the attempt's file has it whole


def test_a_spent_allowance_rests_until_a_second_of_it_is_saved_up_and_counts_what_it_drops():
    """While spent, what a task prints is dropped unsplit (`drop`); it resumes with a second of allowance saved, not
    a line's worth (each read would be split again for one line)."""
    rate = OutputRate(lines_per_s=10, bytes_per_s=1_000_000, burst_s=2)
    assert not rate.spent(now=0.0)
    assert sum(rate.admit(10, now=0.0) for _ in range(25)) == 20 and rate.spent(now=0.0)
    assert rate.spent(now=0.5)  # five lines saved up: still resting
    rate.drop(1_000)
    assert not rate.spent(now=1.0) and rate.take_dropped() == 1_005  # ten saved up: lines go out again


def test_output_dropped_unsplit_is_counted_by_its_lines_and_keeps_its_last_ones():
    from services.agent.carriage import OutputSplitter

    splitter = OutputSplitter()
    assert splitter.feed(b"first\npart", 0.0) == ["first"]
    assert splitter.skip(b"ial\n" + b"y\n" * 10 + b"last\nhalf") == (12, b"partial\n" + b"y\n" * 10 + b"last")
    assert splitter.skip(b" a line") is None  # ends no line: fed as usual
    assert splitter.feed(b" a line\n", 1.0) == ["half a line"]
    # a carriage return found once and looked for again only once passed (each line scanned the rest of a read)
    assert splitter.feed(b"a\rb\rc\n" + b"z\n" * 3 + b"p\rq\n", 5.0) == ["a", "b", "c", "z", "z", "z", "p", "q"]
