"""The agent's host-memory watch: the limit a task gets, and a task killed for going over it says how much it used
and what it was given."""

import asyncio
import re
import sys

from services.agent.runner import TaskProcess, memory_limit_gb
from tests.factories import node
from tests.unit.test_agent_hangs import start

HOG = "import time; block = bytearray(64 * 2**20); block[::4096] = b'x' * len(block[::4096]); time.sleep(60)"


def test_a_task_launched_with_host_memory_gets_it_else_its_gpus_share_of_the_node():
    box = node(gpus=4, memory_gb=64)
    assert memory_limit_gb(start(gpus=(0, 1), resource={"gpu_count": 2, "memory_gb": 3}), box) == 3
    assert memory_limit_gb(start(gpus=(0, 1), resource={"gpu_count": 2}), box) == 32
    assert memory_limit_gb(start(), box) == 1


async def test_a_task_over_its_host_memory_is_killed_saying_what_it_used_and_what_it_was_given(tmp_path):
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG, start_new_session=True)
    task = TaskProcess(start=start(), process=process, workdir=tmp_path)
    try:
        await asyncio.wait_for(task.enforce_memory(0.03), timeout=30)
        assert await asyncio.wait_for(process.wait(), timeout=30) < 0
    finally:
        if process.returncode is None:
            process.kill()
    used = re.fullmatch(
        r"killed by trainmaster: out of memory: the task used ([0-9.]+) GB of host memory, more "
        r"than the 0.03 GB it was given \(spec.resource.memory_gb\)",
        task.tail[-1],
    )
    assert task.oom == "host" and used and float(used.group(1)) > 0.03
