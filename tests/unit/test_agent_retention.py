"""Finished attempts' directories leave the node's disk once their end is reported and what they made is stored:
after the retention, or sooner past the budget (oldest first); a restarted agent clears what its previous run left."""

import asyncio
import os
import threading
from pathlib import Path

from shared.events import LogChunk, NodeHeartbeat, TaskExited
from shared.jobs import Algorithm, DataOut
from services.agent import retention
from services.agent.agent import Agent
from services.agent.retention import Finished, Retention, size_of, to_remove
from tests.factories import start_task, unique
from tests.unit.test_agent_journal import make_agent as journal_agent

# writes an output and a checkpoint, then ends
WORK = "mkdir -p outputs/model && echo weights > outputs/model/w && echo saved > $TRAINMASTER_CHECKPOINT_DIR/state"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_agent(root, sent: list, *, retention_s: float = 0, budget_bytes: int = 10**9, clock=None) -> Agent:
    clock = clock or Clock()
    retention = Retention(jobs=root / "jobs", retention_s=retention_s, budget_bytes=budget_bytes, clock=clock)
    return journal_agent(root, sent, retention=retention)


def working(root, job_id: str):
    start = start_task(job_id, WORK)
    outputs = [DataOut(name="model", url=f"file://{root}/storage/p/{job_id}", mode="upload_at_end")]
    return start.model_copy(update={"algorithm": Algorithm(command=WORK, outputs=outputs)})


async def ended(agent: Agent, sent: list, job_id: str) -> TaskExited:
    """The task's end, once the agent is done with it (reported, and its directory handed to retention)."""
    for _ in range(400):
        exits = [m for m in sent if isinstance(m, TaskExited) and m.job_id == job_id]
        if exits and not agent.supervisors:  # its launch, supervision and cleanup all done
            return exits[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} never ended: {sent}")


def test_past_their_retention_or_oldest_first_past_the_budget():
    a, b, c = (Finished(path=f"/x/{n}", ended_at=t, size=s) for n, t, s in (("a", 0, 5), ("b", 50, 5), ("c", 90, 5)))
    assert to_remove([c, b, a], now=100, retention_s=60, budget_bytes=100) == [a]
    assert to_remove([c, b, a], now=100, retention_s=60, budget_bytes=5) == [a, b]  # the oldest of the rest first
    assert to_remove([c, b, a], now=100, retention_s=0, budget_bytes=100) == [a, b, c]
    assert to_remove([c, b, a], now=100, retention_s=600, budget_bytes=10**9) == []


async def test_an_attempts_directory_goes_once_its_end_is_reported_and_its_outputs_and_checkpoint_are_stored(
    tmp_path,
):
    sent: list = []
    agent = make_agent(tmp_path, sent)
    job_id = unique("j")
    await agent.start(working(tmp_path, job_id))
    exited = await ended(agent, sent, job_id)
    assert exited.reason == "completed", exited
    assert (tmp_path / "storage" / "p" / job_id / "w").read_text() == "weights\n"
    assert (tmp_path / "checkpoints" / "p" / job_id / "state").read_text() == "saved\n"
    assert [m.last for m in sent if isinstance(m, LogChunk)][-1] is True  # its output all shipped
    assert not (tmp_path / "jobs" / job_id).exists()  # the attempt's directory, and its job's once empty


async def test_a_finished_attempt_stays_for_its_retention_and_the_oldest_goes_first_past_the_budget(tmp_path):
    sent: list = []
    clock = Clock()
    agent = make_agent(tmp_path, sent, retention_s=600, clock=clock)
    first, second = unique("a"), unique("b")
    await agent.start(start_task(first, "head -c 8 /dev/zero > blob"))
    await ended(agent, sent, first)
    workdir = tmp_path / "jobs" / first / "attempt-1-rank-0"
    assert (workdir / "blob").exists()  # within its retention and the budget: kept to look into
    agent.retention.budget_bytes = size_of(workdir) * 3 // 2  # room for one such attempt, not two
    clock.now += 1
    await agent.start(start_task(second, "head -c 8 /dev/zero > blob"))
    await ended(agent, sent, second)
    assert not workdir.exists() and (tmp_path / "jobs" / second / "attempt-1-rank-0" / "blob").exists()
    clock.now += 600
    await agent.sweep_attempts()
    assert not (tmp_path / "jobs" / second).exists()


async def test_a_restarted_agent_clears_what_its_previous_run_left_without_following_a_planted_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("not the task's")
    left = tmp_path / "jobs" / "j" / "attempt-1-rank-0"
    (left / "outputs").mkdir(parents=True)
    (left / "outputs" / "big").write_bytes(b"x" * 100)
    os.symlink(outside, left / "outputs" / "link")
    os.symlink(tmp_path, left / "dirlink")
    also = tmp_path / "jobs" / "k" / "attempt-2-rank-1"
    also.mkdir(parents=True)
    agent = make_agent(tmp_path, [], retention_s=3600, budget_bytes=0)  # no retention room for anything
    await agent.sweep_attempts()
    assert not (tmp_path / "jobs" / "j").exists() and not (tmp_path / "jobs" / "k").exists()
    assert outside.read_text() == "not the task's" and (tmp_path / "jobs").is_dir()  # links removed as links


def test_a_sparse_file_counts_what_it_holds_not_what_it_claims(tmp_path):
    """A task's `truncate -s 1T` file must not push every other finished attempt past the budget at once."""
    attempt = tmp_path / "attempt-1-rank-0"
    attempt.mkdir()
    with open(attempt / "sparse", "wb") as f:
        f.truncate(1 << 40)
    assert 0 < size_of(attempt) < 1 << 20


async def test_a_slow_look_at_what_a_previous_run_left_holds_back_no_heartbeat_nor_takes_this_runs_attempts(
    tmp_path, monkeypatch
):
    """The walk over a previous run's attempts ran in the agent's constructor, before it registered: a long one on a
    node's first start could count a silence. They are listed there (cheap) and measured at the first sweep, in a
    thread: a heartbeat goes out while the measuring goes on; an attempt this run made before it is left alone."""
    left = tmp_path / "jobs" / "old" / "attempt-1-rank-0"
    left.mkdir(parents=True)
    measuring, measured, order = threading.Event(), threading.Event(), []

    def slow_size(path):
        measuring.set()
        measured.wait(5)  # a walk over many files, until the heartbeat is sent (else 5 s)
        order.append("measured")
        return size_of(path)

    monkeypatch.setattr(retention, "size_of", slow_size)
    sent: list = []
    agent = make_agent(tmp_path, sent, retention_s=3600)
    job_id = unique("j")
    await agent.start(start_task(job_id, "sleep 30"))
    mine = tmp_path / "jobs" / job_id / "attempt-1-rank-0"
    for _ in range(200):
        if mine.is_dir():
            break
        await asyncio.sleep(0.05)
    sweep = asyncio.create_task(agent.sweep_attempts())
    assert await asyncio.to_thread(measuring.wait, 5)  # the sweep is measuring what was left
    await asyncio.wait_for(agent.heartbeat(), 5)
    order.append("heartbeat")
    measured.set()
    await sweep
    assert order == ["heartbeat", "measured"] and any(isinstance(m, NodeHeartbeat) for m in sent)
    assert left in agent.retention.finished and mine not in agent.retention.finished
    await agent.shutdown()


def test_one_folder_larger_than_the_whole_budget_goes_first_not_every_older_one():
    """A link farm counted once a link, or a tree too deep to measure, had every older job's folder removed before
    it (found by review)."""
    from services.agent.quota import UNMEASURABLE

    older = [Finished(path=Path(f"/a{i}"), ended_at=float(i), size=10) for i in range(3)]
    huge = Finished(path=Path("/huge"), ended_at=5.0, size=UNMEASURABLE)
    assert [f.path.name for f in to_remove([*older, huge], now=6.0, retention_s=100, budget_bytes=100)] == ["huge"]


def test_a_file_of_many_names_is_counted_once(tmp_path):
    from services.agent.quota import disk_usage

    (tmp_path / "data").write_bytes(os.urandom(1 << 20))
    once = disk_usage(str(tmp_path))
    for n in range(50):
        os.link(tmp_path / "data", tmp_path / f"link-{n}")
    assert disk_usage(str(tmp_path)) == once
