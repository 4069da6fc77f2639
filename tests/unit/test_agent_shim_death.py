"""A task's whole process tree dies with its shim (OOM killer, an operator's SIGKILL): the end is reported once,
nothing of the task keeps running, and none of its output is shipped after that end. Real processes."""

import asyncio
import os
import random
import shlex
import signal
from pathlib import Path

import psutil
import pytest

from shared.events import LogChunk, StartTask, TaskExited
from shared.jobs import Algorithm
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore
from services.agent.isolation import TaskUsers, confinement
from services.agent.preparation import Preparer
from services.agent.runner import SDK_DIR
from tests.factories import node, spec, unique

# The task: a child in its group, a grandchild that left the group (setsid), both printing; then it prints forever.
TREE = r"""
import os, subprocess, sys, time
loop = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)"
child = subprocess.Popen([sys.executable, "-c", loop])
detached = subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
print(f"PIDS {os.getpid()} {child.pid} {detached.pid}", flush=True)
while True:
    print("main", flush=True)
    time.sleep(0.05)
"""


def make_agent(tmp_path: Path, sent: list, *, confined: bool) -> Agent:
    async def publish(message) -> None:
        sent.append(message)

    data = tmp_path / "data"
    policy = StoragePolicy(storage_root=f"file://{data}/storage", checkpoint_root=f"file://{data}/checkpoints")
    rules = (
        confinement(
            users=TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=20, lock_dir=tmp_path / "uids"),
            sdk_dir=SDK_DIR,
            data_dir=data,
            storage_dirs=[data / "checkpoints"],
            shared_dirs=[],
        )
        if confined
        else None
    )
    return Agent(
        node=node(node_id="n1"),
        root=data / "agents" / "n1",
        publish=publish,
        preparer=Preparer(data / "engines", {}),
        checkpoints=CheckpointStore(policy.checkpoint_root),
        storage=policy,
        confinement=rules,
    )


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def start(agent: Agent, job: str, command: str) -> None:
    """Attempt 1 of `job` on node n1, running `command`."""
    await agent.start(
        StartTask(
            event_id=f"{job}:1:0:start",
            node_id="n1",
            job_id=job,
            attempt=1,
            project_id="p",
            user_name="alice",
            spec=spec(),
            algorithm=Algorithm(command=command),
        )
    )


async def until(check, *, timeout_s: float = 20, sent: list = ()):
    for _ in range(int(timeout_s / 0.05)):
        if value := check():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out; sent: {list(sent)[-5:]}")


@pytest.mark.parametrize(
    "confined",
    [pytest.param(True, marks=pytest.mark.skipif(os.geteuid() != 0, reason="task users need a root agent")), False],
)
async def test_killing_the_shim_kills_the_task_tree_and_reports_its_end_once(tmp_path, confined):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=confined)
    job = unique("shim")
    await start(agent, job, f"python3 -c {shlex.quote(TREE)}")

    def pids() -> list[int] | None:
        lines = [line.line for m in sent if isinstance(m, LogChunk) for line in m.lines]
        return next(([int(p) for p in line.split()[1:]] for line in lines if line.startswith("PIDS ")), None)

    await until(pids, sent=sent)
    shim = next(iter(agent.tasks.values())).pid
    # by host pid (a confined task numbers its processes in a PID namespace of its own): all below the shim
    tree = [p.pid for p in psutil.Process(shim).children(recursive=True)]
    assert len(tree) >= 3
    os.kill(shim, signal.SIGKILL)  # what the OOM killer or an operator does
    ended = await until(lambda: [m for m in sent if isinstance(m, TaskExited)], sent=sent)
    await until(lambda: all(gone(pid) for pid in tree), timeout_s=10)
    await asyncio.sleep(1)  # anything still alive would print (and be shipped) within this
    exits = [i for i, m in enumerate(sent) if isinstance(m, TaskExited)]
    assert len(exits) == 1 and ended[0].exit_code == 137 and ended[0].reason == "failed"
    assert not [m for m in sent[exits[0] :] if isinstance(m, LogChunk)], "output shipped after the end was reported"
    assert all(gone(pid) for pid in tree)


SAVER = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), print("saved on SIGTERM", flush=True), sys.exit(0)))
print("running", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    "confined",
    [pytest.param(True, marks=pytest.mark.skipif(os.geteuid() != 0, reason="task users need a root agent")), False],
)
async def test_a_stopped_task_still_saves_after_the_shell_above_it_ended(tmp_path, confined):
    from shared.events import StopTask

    sent: list = []
    agent = make_agent(tmp_path, sent, confined=confined)
    job = unique("saver")
    # a compound command: the shell forks the script, and the group's SIGTERM ends the shell (and the shim) first
    await start(agent, job, f"python3 -c {shlex.quote(SAVER)}; true")
    lines = lambda: [line.line for m in sent if isinstance(m, LogChunk) for line in m.lines]  # noqa: E731
    await until(lambda: "running" in lines(), sent=sent)
    await agent.stop(
        StopTask(event_id=f"{job}:stop", node_id="n1", job_id=job, attempt=1, reason="migrated", grace_s=10)
    )
    [ended] = await until(lambda: [m for m in sent if isinstance(m, TaskExited)], sent=sent)
    assert ended.reason == "terminated" and "saved on SIGTERM" in lines()


async def test_the_shim_starts_python_without_site_packages(tmp_path):
    """The shim is standard library only: started isolated and without `site` (a virtual environment's .pth files
    and finders cost ~40 ms of CPU a task, a third of a task's start), it still runs the task."""
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    job = unique("site")
    await start(agent, job, "echo started; sleep 30")
    await until(lambda: [line for m in sent if isinstance(m, LogChunk) for line in m.lines], sent=sent)
    shim = psutil.Process(next(iter(agent.tasks.values())).pid)
    command = shim.cmdline()
    assert command[1:3] == ["-I", "-S"] and command[3].endswith("shim.py"), command
    os.kill(shim.pid, signal.SIGKILL)
    await until(lambda: [m for m in sent if isinstance(m, TaskExited)], sent=sent)


# A shim whose set-up is interrupted by the agent's stop: the group's SIGTERM arrives while it pins itself (before
# the command exists), as when a job is terminated or moved during its task's preparation.
STOPPED_DURING_SET_UP = r"""
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import shim
shim.pin = lambda cpus: os.killpg(os.getpgrp(), signal.SIGTERM)
launch = sys.argv[2]
with open(launch, "w") as f:
    json.dump({"command": "sleep 8; echo ran-on", "cwd": os.getcwd(), "env": {"PATH": os.environ["PATH"]}}, f)
shim.main(launch, parent=os.getppid())
"""


def test_a_stop_heard_before_the_command_started_still_reaches_it(tmp_path):
    """The shim ignored SIGTERM (the command gets its own from the group signal), so a stop that came before the
    command existed reached no process: the task ran on until the agent's grace ran out and it was killed (10 s in
    the end-to-end tests, up to an hour for a job's own grace). Found by reading why delete tests took 10 s."""
    import subprocess
    import sys
    import time

    from services.agent import shim

    began = time.monotonic()
    ended = subprocess.run(
        [sys.executable, "-I", "-S", "-c", STOPPED_DURING_SET_UP, str(Path(shim.__file__).parent), str(tmp_path / "l")],
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ended.returncode == -signal.SIGTERM and "ran-on" not in ended.stdout, (ended.returncode, ended.stderr)
    assert time.monotonic() - began < 6  # the command's 8-s sleep was cut short


def test_a_stop_before_the_forked_shim_made_its_session_reaches_it():
    """The shim server answers `started <pid>` as soon as it forked, and the child makes its session after: a stop
    then found no group (ESRCH, passed over) and the task ran until the stop's grace ran out (found by review)."""
    import subprocess
    from types import SimpleNamespace

    from services.agent.runner import TaskProcess

    not_yet_a_leader = subprocess.Popen(["sleep", "30"])  # in this process's group, as the fork is before setsid
    try:
        with pytest.raises(ProcessLookupError):
            os.killpg(not_yet_a_leader.pid, signal.SIGTERM)  # what the stop did, and why it was lost
        TaskProcess._signal_group(
            SimpleNamespace(process=SimpleNamespace(pid=not_yet_a_leader.pid, returncode=None)), signal.SIGTERM
        )  # type: ignore[arg-type]
        assert not_yet_a_leader.wait(timeout=5) == -signal.SIGTERM
    finally:
        not_yet_a_leader.kill()
        not_yet_a_leader.wait()
