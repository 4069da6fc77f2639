"""A restarted agent reports the end of the tasks its previous run died with, once, and never reruns them."""

import asyncio
import json

import pytest

from shared.events import NodeRegistered, TaskExited, TaskStarted
from shared.storage import StoragePolicy
from services.agent import agent as agent_module
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore
from services.agent.journal import Journal
from services.agent.preparation import Preparer
from tests.factories import node, start_task

NODE = node(node_id="n1")


def make_agent(root, sent: list, **extra) -> Agent:
    """An agent on n1 with file storage under `root`, its messages appended to `sent`; `extra`: more of Agent's."""

    async def publish(message) -> None:
        sent.append(message)

    return Agent(
        node=NODE,
        root=root,
        publish=publish,
        checkpoints=CheckpointStore(f"file://{root}/checkpoints"),
        preparer=Preparer(root / "engines", {}),
        storage=StoragePolicy(storage_root=f"file://{root}/storage", checkpoint_root=f"file://{root}/checkpoints"),
        **extra,
    )


async def test_tasks_an_earlier_run_died_with_are_reported_ended_once(tmp_path):
    # what a run of the agent leaves behind when it is killed while job j:1:0 runs
    (tmp_path / "journal.json").write_text(json.dumps({"started": ["j:1:0"], "stopped": [], "exited": []}))
    sent: list = []
    await make_agent(tmp_path, sent).report_unreported()
    assert [(type(m), m.job_id, m.attempt, m.rank, m.reason, m.node_id) for m in sent] == [
        (TaskExited, "j", 1, 0, "terminated", "n1")
    ]
    again: list = []
    agent = make_agent(tmp_path, again)  # restarted once more
    await agent.report_unreported()
    await agent.start(start_task("j"))  # and its start command redelivered
    assert again == []


async def test_a_task_that_ended_normally_is_not_reported_again_after_a_restart(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent)
    await agent.start(start_task("k"))
    for _ in range(200):
        if any(isinstance(m, TaskExited) for m in sent):
            break
        await asyncio.sleep(0.05)
    assert [type(m) for m in sent if not hasattr(m, "lines")] == [TaskStarted, TaskExited]
    assert Journal(tmp_path / "journal.json").unreported() == []
    after: list = []
    await make_agent(tmp_path, after).report_unreported()
    assert after == []


def test_a_journal_from_before_ends_were_kept_reports_nothing(tmp_path):
    (tmp_path / "journal.json").write_text(json.dumps({"started": ["a:b:1:0"], "stopped": []}))
    assert Journal(tmp_path / "journal.json").unreported() == []
    (tmp_path / "journal.json").write_text(
        json.dumps({"started": ["a:b:1:0", "c:2:1"], "stopped": ["c:2:1"], "exited": []})
    )
    assert Journal(tmp_path / "journal.json").unreported() == [("a:b", 1, 0)]  # ids may hold a colon


async def test_a_stop_ends_the_retries_of_what_the_bus_will_not_take_and_the_end_waits_for_the_next_run(
    tmp_path, monkeypatch
):
    # an agent stopped while its bus is unreachable retried for ever, until the stack's SIGKILL
    monkeypatch.setattr(agent_module, "SEND_AFTER_GRACE_S", 0.2, raising=False)
    (tmp_path / "journal.json").write_text(json.dumps({"started": ["j:1:0"], "stopped": [], "exited": []}))
    tried: list = []

    async def unreachable(message) -> None:
        tried.append(message)
        raise ConnectionError("no bus")

    agent = make_agent(tmp_path, [], shutdown_grace_s=0.1)
    agent.publish = unreachable
    reporting = asyncio.create_task(agent.report_unreported())
    while not tried:
        await asyncio.sleep(0.01)
    await agent.shutdown()
    await asyncio.wait_for(reporting, timeout=10)
    assert Journal(tmp_path / "journal.json").unreported() == [("j", 1, 0)]  # the next run reports it
    sent: list = []
    await make_agent(tmp_path, sent).report_unreported()
    assert [(type(m), m.job_id) for m in sent] == [(TaskExited, "j")]


async def test_an_agent_heartbeats_while_the_bus_does_not_take_its_registration_yet(tmp_path):
    # a stream still electing its leader refused the registration: the agent sent no heartbeat until it took it
    tried: list = []

    async def refused(message) -> None:
        tried.append(message)
        raise TimeoutError("no response from stream")

    agent = make_agent(tmp_path, [])
    agent.publish = refused
    looping: list = []

    async def loops() -> None:
        looping.append("heartbeat")

    coming = asyncio.create_task(agent.come_up(loops))
    while not tried:
        await asyncio.sleep(0.01)
    assert looping == ["heartbeat"] and [type(m) for m in tried] == [NodeRegistered]
    coming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await coming


def test_a_restarted_agent_clears_the_launch_files_and_joined_markers_its_earlier_run_left(tmp_path):
    # the earlier run crashed mid-task: its task's `joined` marker and a launch file no shim read stayed for ever
    launches = tmp_path / "launch"
    launches.mkdir(mode=0o700)
    (launches / "0123abcd.joined").touch()
    (launches / "4567ef.json").write_text("{}")
    make_agent(tmp_path, [])
    assert list(launches.iterdir()) == []


def test_marks_are_appended_and_read_back_after_a_restart_and_a_compaction(tmp_path):
    """A mark is one line appended, not a rewrite of every task the node ever ran; the next run reads them all, and
    a snapshot written again (once the lines outnumber its tasks) keeps every mark."""
    path = tmp_path / "journal.json"
    journal = Journal(path, compact_after=4)
    for n in range(10):
        key = Journal.key(f"job-{n}", 1, 0)
        journal.mark_started(key)
        if n % 2:
            journal.mark_exited(key)
    journal.mark_stopped("job-9:1:0")
    journal.mark_fenced("job-8:1:0")
    again = Journal(path)
    assert again.started == {f"job-{n}:1:0" for n in range(10)}
    assert again.exited == {f"job-{n}:1:0" for n in range(1, 10, 2)}
    assert (again.stopped, again.fenced) == ({"job-9:1:0"}, {"job-8:1:0"})
    assert again.unreported() == [(f"job-{n}", 1, 0) for n in (0, 2, 4, 6, 8)]  # a fenced task was not reported
    assert len(path.read_text().splitlines()) < 1 + 17, "17 marks, the snapshot never written again"


def test_a_marks_write_does_not_grow_with_the_nodes_history(tmp_path):
    """One line appended to the same file, its earlier bytes untouched (the whole journal, ~8 KB here and growing
    with every task the node ever ran, was written and synced again at every mark)."""
    path = tmp_path / "journal.json"
    journal = Journal(path)
    for n in range(500):
        journal.mark_started(Journal.key(f"job-{n}", 1, 0))
    before, inode = path.read_bytes(), path.stat().st_ino
    journal.mark_exited(Journal.key("job-499", 1, 0))
    after = path.read_bytes()
    assert path.stat().st_ino == inode and after.startswith(before) and len(after) - len(before) < 100


def test_a_mark_cut_short_by_a_crash_is_left_out_and_the_next_mark_is_read(tmp_path):
    path = tmp_path / "journal.json"
    journal = Journal(path)
    journal.mark_started("a:1:0")
    journal.mark_started("b:1:0")
    with path.open("a") as f:
        f.write('{"kind": "exited", "ke')  # the agent died in this write
    after = Journal(path)
    assert after.started == {"a:1:0", "b:1:0"} and after.exited == set()
    after.mark_exited("a:1:0")
    assert Journal(path).exited == {"a:1:0"} and Journal(path).unreported() == [("b", 1, 0)]


def test_a_journal_written_whole_by_an_earlier_version_takes_marks_after_it(tmp_path):
    path = tmp_path / "journal.json"
    path.write_text(json.dumps({"started": ["a:1:0"], "stopped": [], "exited": [], "fenced": []}))  # no newline
    journal = Journal(path)
    journal.mark_exited("a:1:0")
    journal.mark_started("b:1:0")
    assert Journal(path).exited == {"a:1:0"} and Journal(path).unreported() == [("b", 1, 0)]


def test_the_journal_is_the_agents_alone(tmp_path):
    """It lists the ids of every task the node ran, other projects' included (their attempt folders' names): 0644
    let any task of the node read it (found by review); an older version's file is made 0600 at its next mark."""
    path = tmp_path / "journal.json"
    journal = Journal(path, compact_after=2)
    journal.mark_started("j1:1:0")
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    again = Journal(path, compact_after=2)
    again.mark_exited("j1:1:0")
    assert path.stat().st_mode & 0o777 == 0o600
    for n in range(5):  # past compact_after: the snapshot is written anew
        again.mark_started(f"j{n + 2}:1:0")
    assert path.stat().st_mode & 0o777 == 0o600 and Journal(path).started >= {"j1:1:0", "j6:1:0"}
