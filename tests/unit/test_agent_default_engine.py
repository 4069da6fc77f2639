"""The cluster `make run` starts has a default engine, the agent's own environment (PyTorch included): a job that
names none runs `python3` there, and the examples shipped beside the task helper run as the docs say, as the task's
own user in its private view of the host. Real processes."""

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest

from shared.cluster import read_cluster
from shared.events import LogChunk, StartTask, TaskExited
from shared.jobs import Algorithm, Engine
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore
from services.agent.isolation import TaskUsers, confinement
from services.agent.preparation import PrepareError, Preparer
from services.agent.runner import SDK_DIR
from tests.factories import node, spec, unique

CLUSTER_FILE = Path(__file__).resolve().parents[2] / "cluster.toml"


def start(command: str, **algorithm) -> StartTask:
    job = unique("engine")
    return StartTask(
        event_id=f"{job}:1:0:start",
        node_id="n1",
        job_id=job,
        attempt=1,
        project_id="p",
        user_name="alice",
        algorithm=Algorithm(command=command, **algorithm),
        spec=spec(),
    )


async def test_a_job_without_an_engine_gets_the_default_one_of_the_cluster_file(tmp_path):
    preparer = Preparer(tmp_path / "engines", read_cluster(CLUSTER_FILE).engines_by_name())
    assert preparer.default == "pytorch"
    job = start("python3 -c 'import torch'")
    assert not preparer.needs_work(job)  # an existing environment: nothing to build
    env = {"PATH": "/usr/bin"}
    await preparer.prepare(job, tmp_path / "w", env, note=lambda _: None)
    assert env["VIRTUAL_ENV"] == sys.prefix and env["PATH"] == f"{sys.prefix}/bin:/usr/bin"
    with pytest.raises(PrepareError, match="nothing can be installed"):
        await preparer.prepare(
            start("true", engine=Engine(name="pytorch", packages=["six==1.16.0"])),
            tmp_path / "w2",
            {},
            note=lambda _: None,
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="task users need a root agent")
async def test_the_default_engine_and_the_examples_are_in_reach_of_the_tasks_own_user(tmp_path):
    sent: list = []

    async def publish(message) -> None:
        sent.append(message)

    data = tmp_path / "data"
    policy = StoragePolicy(storage_root=f"file://{data}/storage", checkpoint_root=f"file://{data}/checkpoints")
    rules = confinement(
        users=TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=20, lock_dir=tmp_path / "uids"),
        sdk_dir=SDK_DIR,
        data_dir=data,
        storage_dirs=[data / "checkpoints"],
        shared_dirs=[],
    )
    agent = Agent(
        node=node(node_id="n1"),
        root=data / "agents" / "n1",
        publish=publish,
        preparer=Preparer(data / "engines", read_cluster(CLUSTER_FILE).engines_by_name()),
        checkpoints=CheckpointStore(policy.checkpoint_root),
        storage=policy,
        confinement=rules,
    )
    job = start("python3 -c 'import sys, trainmaster_examples; print(sys.prefix)'; id -u")
    await agent.start(job)
    for _ in range(1200):
        if ended := [m for m in sent if isinstance(m, TaskExited)]:
            break
        await asyncio.sleep(0.05)
    lines = [line.line for m in sent if isinstance(m, LogChunk) for line in m.lines]
    assert ended and ended[0].reason == "completed", (ended, lines[-20:])
    assert lines[-2:] == [sys.prefix, lines[-1]]  # the agent's environment, examples found
    assert int(lines[-1]) >= 300_000  # the task's own uid, not the agent's
