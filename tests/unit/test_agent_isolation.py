"""A task run by a root agent is a user of its own: the agent's /proc, its data and other projects' storage are out
of reach, while its working directory, the SDK, Python and its checkpoints still work. Real processes."""
import asyncio
import json
import os
import random
import sys
from pathlib import Path

import pytest

from shared.events import LogChunk, StartTask, TaskExited
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore, Mirror
from services.agent.isolation import TaskUsers, confinement
from services.agent.preparation import Preparer
from services.agent.runner import SDK_DIR
from shared.jobs import Algorithm
from tests.factories import node, spec, unique

NODE = node(node_id="n1")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="tasks get users of their own only when the agent is root")

PROBE = r'''
import json, os, sys
data, other = sys.argv[1], sys.argv[2]
result = {"uid": os.getuid(), "home": oct(os.stat(os.environ["HOME"]).st_mode & 0o777)}
def attempt(name, read):
    try:
        read()
        result[name] = "read"
    except OSError as exc:
        result[name] = type(exc).__name__
attempt("agent_environ", lambda: open(f"/proc/{sys.argv[3]}/environ", "rb").read())
attempt("admin_token", lambda: open(os.path.join(data, "admin-token")).read())
result["data_listing"] = sorted(os.listdir(data))
attempt("other_checkpoint", lambda: open(other).read())
import trainmaster_task
result["sdk"] = str(trainmaster_task.checkpoint_dir()) == os.environ["TRAINMASTER_CHECKPOINT_DIR"]
ckpt = os.environ["TRAINMASTER_CHECKPOINT_DIR"]
open(os.path.join(ckpt, "state.txt"), "w").write("saved")
os.symlink(os.path.join(data, "admin-token"), os.path.join(ckpt, "leak"))
print("RESULT " + json.dumps(result), flush=True)
'''


def make_agent(tmp_path: Path, sent: list, *, confined: bool) -> Agent:
    async def publish(message) -> None:
        sent.append(message)

    data = tmp_path / "data"
    policy = StoragePolicy(storage_root=f"file://{data}/storage", checkpoint_root=f"file://{data}/checkpoints")
    first = random.randrange(300_000, 900_000, 100)  # apart from any other test run on this host
    rules = confinement(users=TaskUsers(first_uid=first, count=20, lock_dir=tmp_path / "uids"), sdk_dir=SDK_DIR,
                        data_dir=data, storage_dirs=[data / "checkpoints"], shared_dirs=[]) if confined else None
    return Agent(node=NODE, root=data / "agents" / "n1", publish=publish, preparer=Preparer(data / "engines", {}),
                 checkpoints=CheckpointStore(policy.checkpoint_root), storage=policy, confinement=rules,
                 checkpoint_sync_s=0.2)


def start(job_id: str, command: str, *, project: str = "p", **fields) -> StartTask:
    return StartTask(event_id=f"{job_id}:1:0:start", node_id="n1", job_id=job_id, attempt=1, project_id=project,
                     user_name="alice", algorithm=Algorithm(command=command, **fields), spec=spec())


async def ended(job_id: str, sent: list) -> tuple[TaskExited, str]:
    """The task's end and its output, once the agent reported it."""
    for _ in range(600):
        exits = [m for m in sent if isinstance(m, TaskExited) and m.job_id == job_id]
        if exits:
            lines = [line.line for m in sent if isinstance(m, LogChunk) and m.job_id == job_id for line in m.lines]
            return exits[0], "\n".join(lines)
        await asyncio.sleep(0.05)
    raise AssertionError(f"the task did not end; sent: {sent}")


async def run(agent: Agent, command: StartTask, sent: list) -> tuple[TaskExited, str]:
    await agent.start(command)
    return await ended(command.job_id, sent)


@root_only
async def test_a_task_cannot_read_the_agent_its_data_or_another_projects_checkpoint(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "admin-token").write_text("the-admin-token")
    (data / "admin-token").chmod(0o644)  # even world-readable, it is not in the task's view
    other = data / "checkpoints" / "other-project" / "their-job" / "model.pt"
    other.parent.mkdir(parents=True)
    other.write_text("their weights")
    other.chmod(0o644)
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)
    job_id = unique("iso")
    command = f"{sys.executable} -c '{PROBE}' {data} {other} {os.getpid()}"
    ended, output = await run(agent, start(job_id, command), sent)
    assert ended.reason == "completed", output
    result = json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])
    assert result["uid"] >= 300_000 and result["home"] == "0o700"
    assert result["sdk"] is True
    for probe in ("agent_environ", "admin_token", "other_checkpoint"):
        assert result[probe] != "read", (probe, result)
    assert result["data_listing"] == ["agents"]  # only the way to its own directory
    saved = data / "checkpoints" / "p" / job_id
    assert (saved / "state.txt").read_text() == "saved"
    assert not (saved / "leak").exists()  # a link the task planted is not followed by the agent's upload
    workdir = data / "agents" / "n1" / "jobs" / job_id / "attempt-1-rank-0"
    assert workdir.stat().st_uid == os.geteuid() and (workdir / "checkpoint" / "state.txt").stat().st_uid == 0


@root_only
async def test_two_running_tasks_get_different_users_and_a_user_is_reused_only_after_its_task_ended(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)
    first, second = unique("a"), unique("b")
    await agent.start(start(first, "id -u; sleep 1"))
    await agent.start(start(second, "id -u; sleep 1"))
    outputs = [(await ended(job_id, sent))[1] for job_id in (first, second)]
    uids = {int(output.splitlines()[0]) for output in outputs}
    assert len(uids) == 2 and min(uids) >= 300_000
    _, third = await run(agent, start(unique("c"), "id -u"), sent)
    assert int(third.splitlines()[0]) in uids  # given back when its task ended


async def test_the_agent_refuses_a_url_outside_the_projects_storage_even_when_the_submitter_let_it_through(
        tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    job_id = unique("url")
    ended, output = await run(agent, start(job_id, "cat $TRAINMASTER_INPUT_SECRETS/passwd",
                                            inputs=[{"name": "secrets", "url": "file:///etc/passwd"}]), sent)
    assert ended.reason == "start_failed"
    assert "algorithm.inputs.0.url" in ended.message and "/etc/passwd" in ended.message
    assert "root:" not in output


def test_uploads_follow_no_link_the_task_planted(tmp_path):
    secret = tmp_path / "agent-only"
    (secret / "model").mkdir(parents=True)
    (secret / "model" / "token").write_text("the agent's secret")
    work = tmp_path / "attempt"
    (work / "checkpoint").mkdir(parents=True)
    (work / "checkpoint" / "weights.pt").write_text("mine")
    os.symlink(secret / "model" / "token", work / "checkpoint" / "token")  # a file link
    os.symlink(secret, work / "outputs")  # a directory on the way swapped for a link
    remote = tmp_path / "remote"
    Mirror(f"file://{remote}/ckpt").sync(work / "checkpoint", {}, anchor=work)
    Mirror(f"file://{remote}/out").sync(work / "outputs" / "model", {}, anchor=work, delete=False)
    assert sorted(p.name for p in remote.rglob("*") if p.is_file()) == ["weights.pt"]
