"""An agent the bus stopped answering stops its own tasks before the monitor could call its node lost: a fake
clock stands for the time, the tasks are real processes."""

import asyncio
import os
import signal
import sys
import time

import pytest
from pydantic import ValidationError

from shared.events import NodeCadence, NodeHeartbeat, StopTask, TaskExited, TaskStarted
from shared.storage import StoragePolicy
from services.agent import agent as agent_module
from services.agent.agent import Agent
from services.agent.app import AgentSettings, fence_check, node_timeout_s
from services.agent.checkpoints import CheckpointStore
from services.agent.fence import CHECK_S, RESERVE_S, Fence, fence_due, margin_problem
from services.agent.hangs import HangPolicy
from services.agent.journal import Journal
from services.agent.nvml import GpuProbe
from services.agent.pace import Pace
from services.agent.preparation import Preparer
from services.monitor.app import MonitorSettings
from tests.factories import node, start_task, unique

NODE = node(node_id="n1")
TIMEOUT_S, MARGIN_S, GRACE_S = 10.0, 4.0, 0.5
WINDOW_S = TIMEOUT_S - MARGIN_S
# saves a checkpoint when told to stop, as a training script does: a fenced one must not reach the storage
SAVES_ON_SIGTERM = """
import os, signal, sys, time
def save(*_):
    with open(os.path.join(os.environ["TRAINMASTER_CHECKPOINT_DIR"], "last"), "w") as f:
        f.write("saved at SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open("ready", "w").close()
while True:
    time.sleep(0.1)
"""


class Bus:
    """What the agent publishes while the bus answers. While it is down a heartbeat (core NATS: buffered by the
    client, never acknowledged) is lost, any other publish (JetStream, with its ack) and any acknowledgement fail."""

    def __init__(self) -> None:
        self.sent: list = []
        self.down = False

    async def publish(self, message) -> None:
        if self.down and isinstance(message, NodeHeartbeat):
            return
        if self.down:
            raise ConnectionError("bus unreachable")
        self.sent.append(message)

    async def acknowledge(self) -> None:
        if self.down:
            raise ConnectionError("bus unreachable")

    def exits(self) -> list[TaskExited]:
        return [m for m in self.sent if isinstance(m, TaskExited)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_agent(root, bus: Bus, clock: Clock, **extra) -> Agent:
    """An agent on n1 fenced by `clock`, publishing on `bus`; `extra`: more of Agent's."""
    return Agent(
        node=NODE,
        root=root,
        publish=bus.publish,
        checkpoints=CheckpointStore(f"file://{root}/checkpoints"),
        preparer=Preparer(root / "engines", {}),
        storage=StoragePolicy(storage_root=f"file://{root}/storage", checkpoint_root=f"file://{root}/checkpoints"),
        shutdown_grace_s=1,
        fence=Fence(timeout_s=lambda: TIMEOUT_S, margin_s=MARGIN_S, grace_s=GRACE_S, clock=clock),
        acknowledge=bus.acknowledge,
        **extra,
    )


async def running(agent: Agent, bus: Bus, root, job_id: str) -> int:
    """Start the checkpointing task of `job_id` and return its pid once it is ready for a SIGTERM."""
    script = root / "task.py"
    script.write_text(SAVES_ON_SIGTERM)
    await agent.start(start_task(job_id, f"{sys.executable} {script}"))
    ready = root / "jobs" / job_id / "attempt-1-rank-0" / "ready"
    for _ in range(400):
        started = [m for m in bus.sent if isinstance(m, TaskStarted) and m.job_id == job_id]
        if started and ready.exists():
            return started[0].pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"task of {job_id} never started: {bus.sent}")


async def until(condition, what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def checkpoint(root, job_id: str):
    return root / "checkpoints" / "p" / job_id / "last"


def test_the_fence_falls_the_margin_before_the_node_timeout():
    assert not fence_due(acked_at=0.0, now=WINDOW_S - 0.01, timeout_s=TIMEOUT_S, margin_s=MARGIN_S)
    assert fence_due(acked_at=0.0, now=WINDOW_S, timeout_s=TIMEOUT_S, margin_s=MARGIN_S)
    clock = Clock()
    fence = Fence(timeout_s=lambda: TIMEOUT_S, margin_s=MARGIN_S, grace_s=GRACE_S, clock=clock)
    clock.now += 5.0
    fence.acked(clock.now - 1.0)  # the heartbeat sent a second ago was acknowledged now
    fence.acked(clock.now - 3.0)  # an older acknowledgement arriving late moves nothing back
    clock.now += WINDOW_S - 1.0 - 0.01
    assert not fence.due()
    clock.now += 0.01
    assert fence.due()


def test_a_margin_too_small_for_the_kill_or_a_window_of_less_than_two_heartbeats_is_refused():
    assert margin_problem(timeout_s=10, margin_s=4, grace_s=1, interval_s=2) is None
    assert "fence_grace_s" in (margin_problem(timeout_s=10, margin_s=2, grace_s=1, interval_s=2) or "")
    assert "two heartbeat" in (margin_problem(timeout_s=10, margin_s=4, grace_s=1, interval_s=3.5) or "")
    with pytest.raises(ValidationError, match="fence_margin_s"):
        AgentSettings(node_id="n", fence_margin_s=1.0, fence_grace_s=1.0)
    # an operator who turns the fence off is not held to its margins, and the agent gets none
    assert AgentSettings(node_id="n", fence=False, fence_margin_s=1.0, fence_grace_s=1.0).fence is False


def test_the_agent_and_the_monitor_agree_on_the_node_timeout_by_default():
    """One setting (CommonSettings.node_timeout_s) for both; the stack gives every process the same value, and a
    running monitor's announcement (NodeCadence) overrides the agent's copy."""
    agent, monitor = AgentSettings(node_id="n"), MonitorSettings()
    assert agent.node_timeout_s == monitor.node_timeout_s
    assert agent.heartbeat_interval_s == monitor.heartbeat_interval_s
    assert agent.fence_margin_s >= 2 * agent.fence_grace_s + CHECK_S + RESERVE_S
    assert agent.node_timeout_s - agent.fence_margin_s >= 2 * agent.heartbeat_interval_s


async def test_no_acknowledged_heartbeat_for_the_window_stops_every_task_and_writes_no_checkpoint(tmp_path):
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    job_id = unique("j")
    pid = await running(agent, bus, tmp_path, job_id)
    await agent.heartbeat()  # acknowledged: the window counts from this beat
    bus.down = True  # cut off: nothing published from now on is heard
    clock.now += 1.0
    await agent.heartbeat()  # not acknowledged
    clock.now += WINDOW_S - 1.0 - 0.01
    await agent.fence_if_unheard()
    assert alive(pid) and agent.tasks[Journal.key(job_id, 1, 0)].stop_reason is None
    clock.now += 0.01
    await agent.fence_if_unheard()
    await until(lambda: not alive(pid), "the fenced task ended while the bus is down")
    assert Journal(tmp_path / "journal.json").fenced == {Journal.key(job_id, 1, 0)}
    await agent.heartbeat()  # still unheard; and a fenced task is no longer listed as running
    bus.down = False  # the bus answers again: the end is reported, so the monitor's books agree
    await until(lambda: bus.exits(), "the fenced task's end reported once the bus is back")
    [exited] = bus.exits()
    assert (exited.job_id, exited.reason, exited.message) == (job_id, "terminated", "stopped: fenced")
    assert not checkpoint(tmp_path, job_id).exists()  # the next attempt's checkpoint is not written over
    await until(lambda: not agent.tasks, "the task forgotten")
    await agent.heartbeat()
    assert bus.sent[-1].running == ()


async def test_acknowledgements_resuming_within_the_window_stop_nothing(tmp_path):
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    job_id = unique("j")
    pid = await running(agent, bus, tmp_path, job_id)
    for _ in range(3):  # three outages each just shorter than the window, acknowledged heartbeats between them
        await agent.heartbeat()
        bus.down = True
        clock.now += WINDOW_S - 0.01
        await agent.heartbeat()
        await agent.fence_if_unheard()
        bus.down = False
    assert alive(pid) and bus.exits() == []
    assert Journal(tmp_path / "journal.json").fenced == set()
    key = Journal.key(job_id, 1, 0)
    assert agent.tasks[key].stop_reason is None
    await agent.stop(StopTask(event_id="s", node_id="n1", job_id=job_id, attempt=1, grace_s=1))
    await until(lambda: bus.exits(), "the stopped task's end")
    assert checkpoint(tmp_path, job_id).exists()  # a task stopped by command saves its checkpoint, as before


@pytest.mark.parametrize("begun", [False, True], ids=["before-its-first-step", "while-preparing"])
async def test_a_task_preparing_when_the_fence_falls_never_starts(tmp_path, begun):
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    job_id = unique("j")
    gate, preparing = asyncio.Event(), asyncio.Event()

    async def slow_prepare(*_args) -> list[str]:
        preparing.set()
        await gate.wait()
        return ["true"]

    agent.supervisor.preparer.prepare = slow_prepare  # type: ignore[method-assign]
    await agent.start(start_task(job_id, "true"))
    assert Journal.key(job_id, 1, 0) in agent.launching
    if begun:
        await asyncio.wait_for(preparing.wait(), timeout=20)
    clock.now += WINDOW_S
    await agent.fence_if_unheard()
    await agent.fence_if_unheard()  # cancelled once only: the second look leaves its report alone
    await until(lambda: bus.exits(), "the cancelled launch's end")
    [exited] = bus.exits()
    assert (exited.reason, exited.message) == ("terminated", "stopped while preparing")
    assert not any(isinstance(m, TaskStarted) for m in bus.sent)


async def test_a_fenced_task_whose_end_an_agent_restart_lost_is_reported_fenced(tmp_path):
    (tmp_path / "journal.json").write_text(
        '{"started": ["j:1:0", "k:1:0"], "stopped": [], "exited": [], "fenced": ["j:1:0"]}'
    )
    bus = Bus()
    await make_agent(tmp_path, bus, Clock()).report_unreported()
    assert sorted((m.job_id, m.message) for m in bus.exits()) == [
        ("j", "stopped: fenced"),
        ("k", "the agent restarted while this task ran"),
    ]


def test_the_fence_counts_with_the_node_timeout_the_monitor_announces_and_its_own_until_then():
    settings = AgentSettings(node_id="n")
    pace = Pace(settings.heartbeat_interval_s)
    assert node_timeout_s(pace, settings) == settings.node_timeout_s
    assert fence_check(pace, settings) is None
    pace.heard(NodeCadence(event_id="c", interval_s=4.0, timeout_s=20.0).model_dump_json().encode())
    assert node_timeout_s(pace, settings) == 20.0  # a large fleet: slower heartbeats, a longer timeout
    assert fence_check(pace, settings) is None
    pace.heard(NodeCadence(event_id="c", interval_s=2.0, timeout_s=3.0).model_dump_json().encode())
    assert node_timeout_s(pace, settings) == 3.0  # a monitor configured apart: fenced early, and said so
    assert "fence_margin_s" in (fence_check(pace, settings) or "")


async def test_a_task_that_ended_during_the_silence_and_is_not_yet_reported_is_fenced_too(tmp_path):
    """Its exit waits for the bus behind its last output; its outputs and final checkpoint are not stored yet, so
    it may no longer store them, and its attempt is reported stopped (the job runs again), not ended by itself."""
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    job_id = unique("j")
    pid = await running(agent, bus, tmp_path, job_id)
    bus.down = True
    os.killpg(pid, signal.SIGTERM)  # from outside the agent: the script saves a checkpoint and ends
    await until(lambda: not alive(pid), "the task ended by itself")
    clock.now += WINDOW_S
    await agent.fence_if_unheard()
    bus.down = False
    await until(lambda: bus.exits(), "its end reported once the bus is back")
    [exited] = bus.exits()
    assert (exited.reason, exited.message) == ("terminated", "stopped: fenced")  # unfenced: failed, code 143
    assert Journal(tmp_path / "journal.json").fenced == {Journal.key(job_id, 1, 0)}


def test_a_node_timeout_announced_too_short_for_two_heartbeats_fences_nothing():
    """A rented agent keeps its own defaults (2 s heartbeats, 4 s margin) while a monitor announces 3 s: fencing
    at once would stop every task it ever runs; it does not fence there (the error is logged) and fences again once
    a timeout it can fence within is announced."""
    clock, announced = Clock(), [3.0]
    fence = Fence(timeout_s=lambda: announced[0], margin_s=4.0, grace_s=1.0, clock=clock, interval_s=lambda: 2.0)
    clock.now += 60
    assert not fence.due()
    announced[0] = 10.0
    assert fence.due()  # 60 s unacknowledged against a 6 s window


async def test_a_start_issued_before_the_nodes_latest_silence_never_runs_and_its_end_is_reported(tmp_path):
    """A start the monitor wrote before it called this node lost, delivered only after it dropped the node's queued
    starts (its outbox relayed once the bus was back): the agent refuses it, since it was issued at a lower count
    of silences than the node has now, and reports its end, so an attempt still waiting for it is queued again."""
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    await agent.heartbeat()
    assert bus.sent[-1].silences == 0
    bus.down = True
    clock.now += WINDOW_S
    await agent.fence_if_unheard()  # the silence the monitor may have taken for the node's loss
    bus.down = False
    await agent.heartbeat()
    assert bus.sent[-1].silences == 1  # the monitor's next starts for this node carry 1
    stale_job, fresh_job = unique("j"), unique("j")
    ran = tmp_path / "ran"
    stale = start_task(stale_job, f"touch {ran}")  # issued when the node had reported 0
    await agent.start(stale)
    await agent.start(stale)  # redelivered: refused once, reported once
    [refused] = bus.exits()
    assert (refused.job_id, refused.reason) == (stale_job, "terminated")
    assert refused.message.startswith("refused: issued before this node last went unheard")
    assert not any(isinstance(m, TaskStarted) for m in bus.sent) and not agent.launching
    await agent.start(start_task(fresh_job, "true").model_copy(update={"silences": 1}))
    await until(lambda: any(isinstance(m, TaskStarted) and m.job_id == fresh_job for m in bus.sent), "the fresh start")
    await until(lambda: len(bus.exits()) == 2, "the fresh task's end")
    assert not ran.exists()


async def test_a_restarted_agent_goes_on_counting_and_a_gap_of_the_window_since_its_last_heartbeat_is_a_silence(
    tmp_path,
):
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    assert agent.silences() == 0  # a node's first run
    bus.down = True
    clock.now += WINDOW_S
    await agent.fence_if_unheard()
    bus.down = False
    await agent.heartbeat()  # acknowledged: the count and the time are kept on disk
    assert make_agent(tmp_path, bus, Clock()).silences() == 1  # restarted at once: the same count
    heard = tmp_path / "silences.json"
    heard.write_text(f'{{"silences": 1, "acked_wall": {time.time() - WINDOW_S - 1}}}')
    assert make_agent(tmp_path, bus, Clock()).silences() == 2  # down longer than the window: perhaps lost
    heard.write_text("{not json")
    assert make_agent(tmp_path, bus, Clock()).silences() >= 1  # a doubt is a silence


async def test_a_start_carrying_more_silences_than_a_node_that_lost_its_count_never_runs(tmp_path):
    """The node had reported 3 silences when a start was issued; its agent restarted with its count file unreadable
    (the count starts over, 1): the start may be older than the node's latest silence, so it is refused too."""
    bus, clock = Bus(), Clock()
    (tmp_path / "silences.json").write_text("{not json")
    agent = make_agent(tmp_path, bus, clock)
    assert agent.silences() == 1
    ran = tmp_path / "ran"
    job_id = unique("j")
    await agent.start(start_task(job_id, f"touch {ran}").model_copy(update={"silences": 3}))
    [refused] = bus.exits()
    assert (refused.job_id, refused.reason) == (job_id, "terminated") and refused.message.startswith("refused")
    assert not ran.exists() and not agent.launching


async def test_the_count_file_is_written_when_the_count_changes_or_half_a_window_passed_not_at_every_heartbeat(
    tmp_path, monkeypatch
):
    bus, clock = Bus(), Clock()
    agent = make_agent(tmp_path, bus, clock)
    wall = [1_000_000.0]
    monkeypatch.setattr("services.agent.agent.time.time", lambda: wall[0])
    writes = []
    real_save = agent_module.save
    monkeypatch.setattr(agent_module, "save", lambda path, heard: writes.append(heard) or real_save(path, heard))
    for _ in range(3):  # heartbeats well within half the window of each other
        await agent.heartbeat()
        wall[0] += WINDOW_S / 8
    assert len(writes) == 1
    wall[0] += WINDOW_S / 2
    await agent.heartbeat()
    assert len(writes) == 2 and writes[-1].acked_wall == wall[0]


async def test_a_connection_lost_while_the_gpus_are_read_sends_no_heartbeat(tmp_path):
    """The connection was looked at before the GPUs' (NVML) read: one lost during that read still had its heartbeat
    buffered by the client, to be sent at the reconnection with the count of silences of before the outage. It is
    now looked at last, right before the publish; the unsent heartbeat is unacknowledged, as it should be."""
    bus, clock, up = Bus(), Clock(), [True]

    class LostDuringTheRead(GpuProbe):
        def read(self, indices):
            up[0] = False
            return ()

    agent = make_agent(tmp_path, bus, clock, hangs=HangPolicy(gpus=LostDuringTheRead()), connected=lambda: up[0])
    assert agent.fence is not None
    acked_at, clock.now = agent.fence.acked_at, clock.now + 1
    await agent.heartbeat()
    assert bus.sent == [] and agent.fence.acked_at == acked_at
