"""A task's bars redrawn with carriage returns are shipped as the updates they are: the latest frame at most every
UPDATE_EVERY_S and the last one of each run, never every frame, never a line holding them all."""

import shlex
from pathlib import Path

from shared.events import LogChunk, StartTask, TaskExited
from shared.jobs import Algorithm
from services.agent.carriage import MAX_LINE_BYTES, UPDATE_EVERY_S, OutputSplitter
from services.agent.jobsecrets import Masker
from tests.factories import spec, unique
from tests.unit.test_agent_shim_death import make_agent, until

TQDM = Path(__file__).parents[1] / "data" / "progress" / "tqdm.txt"


def shipped(chunks: list[bytes], *, step_s: float) -> list[str]:
    splitter, out, now = OutputSplitter(), [], 0.0
    for chunk in chunks:
        now += step_s
        out += splitter.feed(chunk, now) + splitter.due(now)
    return out + splitter.end()


def test_a_real_tqdm_output_ships_a_frame_now_and_then_and_the_last_of_each_bar():
    raw = TQDM.read_bytes()
    frames = raw.count(b"\r")  # a plain bar, then nested ones (their frames end with a newline and a cursor-up)
    lines = shipped([raw[i : i + 100] for i in range(0, len(raw), 100)], step_s=0.1)  # 100 bytes every 0.1 s
    assert not any("\r" in line for line in lines)
    seconds = len(raw) / 100 * 0.1
    # a frame every UPDATE_EVERY_S at most, and the last of each run (the first bar's, each epoch's)
    assert len(lines) <= seconds / UPDATE_EVERY_S + 10 < frames / 10
    assert any("200/200" in line for line in lines)  # the first bar's last frame, kept
    assert "3/3" in lines[-1]


def test_crlf_and_plain_lines_are_lines_and_a_quiet_bar_goes_out_once_due():
    splitter = OutputSplitter(every_s=2.0)
    assert splitter.feed(b"one\r\ntwo\n\nthree", 0.0) == ["one", "two", ""]
    assert splitter.end() == ["three"]
    splitter = OutputSplitter(every_s=2.0)
    assert splitter.feed(b"\r 10%| 1/10\r 20%| 2/10\r", 0.5) == [" 10%| 1/10"]  # the first, then held
    assert splitter.due(1.0) == []
    assert splitter.due(2.6) == [" 20%| 2/10"]
    assert splitter.feed(b" 30%| 3/10\r          \r{'loss': 1}\n", 2.7) == [" 30%| 3/10", "{'loss': 1}"]
    assert splitter.end() == []


def test_a_line_past_the_cap_is_shipped_in_pieces():
    splitter = OutputSplitter()
    pieces = splitter.feed(b"x" * (2 * MAX_LINE_BYTES + 5), 0.0)
    assert [len(p) for p in pieces] == [MAX_LINE_BYTES] * 2 and splitter.end() == ["x" * 5]


def fed(splitter: OutputSplitter, data: bytes, *, read: int = 2**16) -> list[str]:
    """What `data` ships read as the agent reads a task's output (64 KiB at a time)."""
    out: list[str] = []
    for i in range(0, len(data), read):
        out += splitter.feed(data[i : i + read], 0.0)
    return out + splitter.end()


def test_a_long_lines_cut_never_splits_a_secret_so_every_piece_is_masked():
    secret, other = "hf_" + "S" * 61, "é-tøken-Ω"  # the second: several bytes a character
    masker = Masker([secret, other])
    for at in (MAX_LINE_BYTES - 1, MAX_LINE_BYTES - 30, MAX_LINE_BYTES - 63, MAX_LINE_BYTES - 5, MAX_LINE_BYTES):
        for value in (secret, other):
            line = b"x" * at + value.encode() + b"y" * MAX_LINE_BYTES
            splitter = OutputSplitter()
            splitter.whole = masker.encoded()
            pieces = fed(splitter, line + b"\n")
            assert "".join(pieces).encode() == line  # nothing lost, nothing added
            assert len(pieces) >= 2 and all(0 < len(p.encode()) <= MAX_LINE_BYTES for p in pieces[:-1])
            masked = [masker(p) for p in pieces]
            assert sum(p.count("***") for p in masked) == 1, (at, value)
            assert not any(value[:2] in p or value[-2:] in p for p in masked), (at, value)
    # the code before: the cut falls inside the value, and neither piece is masked
    pieces = fed(OutputSplitter(), b"x" * (MAX_LINE_BYTES - 30) + secret.encode() + b"y" * 2**17 + b"\n")
    assert len(pieces) == 2 and not any("***" in masker(p) for p in pieces)


def test_a_value_whose_end_is_not_read_yet_is_not_split_and_overlapping_values_cost_a_bounded_look():
    masker = Masker(["hf_SECRETVALUE123"])
    splitter = OutputSplitter()
    splitter.whole = masker.encoded()
    # the read that passes the cap ends within the value: the cut waits for the rest of it
    pieces = splitter.feed(b"x" * (MAX_LINE_BYTES - 5) + b"hf_SE", 0.0)
    pieces += splitter.feed(b"CRETVALUE123 tail " + b"y" * 100, 0.0) + splitter.end()
    assert len(pieces) == 2 and pieces[0] == "x" * (MAX_LINE_BYTES - 5) and masker(pieces[1]) == "*** tail " + "y" * 100
    # a value that overlaps itself all along a long line: any cut splits one; the look is bounded, the pieces long
    periodic = Masker(["aaaa"])
    splitter = OutputSplitter()
    splitter.whole = periodic.encoded()
    pieces = splitter.feed(b"a" * (2 * MAX_LINE_BYTES + 200), 0.0) + splitter.end()
    # (was: a cut walked back a byte at a time, a one-byte piece for each byte past the cap, 24 s for 200 of them)
    assert len(pieces) == 3 and all(len(p) >= MAX_LINE_BYTES - 3 for p in pieces[:2])


BAR = r"""
import sys, time
for i in range(2001):
    sys.stderr.write(f"\r{i // 20}%|##| {i}/2000 [00:01<00:02, 900it/s]")
    sys.stderr.flush()
    time.sleep(0.0005)
sys.stderr.write("\n")
print("done", flush=True)
"""


async def test_the_agent_ships_a_bars_frames_as_updates_not_one_line_of_them_all(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    job = unique("bar")
    await agent.start(
        StartTask(
            event_id=f"{job}:1:0:start",
            node_id="n1",
            job_id=job,
            attempt=1,
            project_id="p",
            user_name="alice",
            spec=spec(),
            algorithm=Algorithm(command=f"python3 -c {shlex.quote(BAR)}"),
        )
    )
    await until(lambda: [m for m in sent if isinstance(m, TaskExited)], sent=sent)
    lines = [line.line for m in sent if isinstance(m, LogChunk) for line in m.lines]
    bar = [line for line in lines if "/2000" in line]
    assert bar and not any("\r" in line for line in lines)
    assert len(bar) < 50 and bar[-1].endswith("2000/2000 [00:01<00:02, 900it/s]")
    assert "done" in lines
