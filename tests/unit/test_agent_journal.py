"""A restarted agent reports the end of the tasks its previous run died with, once, and never reruns them."""

import asyncio
import json

from shared.events import TaskExited, TaskStarted
from shared.storage import StoragePolicy
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
