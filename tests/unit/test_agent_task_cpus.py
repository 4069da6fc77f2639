"""A task is held to its `cpu_count`: pinned to that many of the host's CPUs (least loaded first), so OpenMP and
PyTorch size their threads to its share, and, in a task cgroup, its CPU time capped at that many CPUs. The
allotment's rules, then real tasks."""

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from shared.events import StartTask
from services.agent.cgroups import Cgroups, Layout
from services.agent.cpus import CpuAllotment, host_cpus, preferred_order
from tests.factories import algorithm, spec, unique
from tests.unit.test_agent_isolation import ended, make_agent, root_only
from tests.unit.test_agent_task_processes import with_cgroups

AFFINITY = "import json, os; print('CPUS ' + json.dumps(sorted(os.sched_getaffinity(0))), flush=True)"


def test_a_task_gets_the_cpus_the_fewest_tasks_hold():
    cpus = CpuAllotment(range(4))
    first = cpus.take("a", 2)
    second = cpus.take("b", 2)
    assert len(first) == len(second) == 2 and not set(first) & set(second)  # four CPUs, no overlap
    third = cpus.take("c", 1)
    assert cpus.load[third[0]] == 2 and sum(cpus.load.values()) == 5
    cpus.give_back("a")
    assert set(cpus.take("d", 2)) == set(first)  # the two CPUs a gave back are the least loaded again
    cpus.give_back("nobody")  # a task that never took any: nothing happens
    assert sum(cpus.load.values()) == 5


def test_a_fraction_takes_a_whole_cpu_and_more_than_the_host_takes_them_all():
    cpus = CpuAllotment([3, 5, 9])
    assert len(cpus.take("half", 0.5)) == 1
    assert cpus.take("big", 64) == (3, 5, 9)
    assert cpus.take("half", 2.5) != () and len(cpus.held["half"]) == 3  # taken again: its earlier CPU given back
    assert sum(cpus.load.values()) == 6
    with pytest.raises(ValueError):
        CpuAllotment([])


def test_nodes_on_one_host_start_at_different_cpus():
    starts = {preferred_order(range(8), f"node-{i}")[0] for i in range(40)}
    assert len(starts) > 4  # a test stack's agents do not all pile their first task onto CPU 0
    assert sorted(preferred_order(range(8), "x")) == list(range(8))
    assert preferred_order([7], "anything") == (7,)


def test_the_agents_own_affinity_bounds_the_cpus():
    assert set(host_cpus()) == os.sched_getaffinity(0)


def test_a_cpu_controller_the_host_refuses_leaves_memory_and_pids_limited(tmp_path, caplog):
    memory = tmp_path / "memory" / "trainmaster-tasks"
    memory.parent.mkdir()
    refused = tmp_path / "no-such-hierarchy" / "trainmaster-tasks"  # its parent is missing: mkdir fails
    cgroups = Cgroups(Layout(version=1, memory=memory, pids=None, cpu=refused), pids_max=8)
    assert cgroups.layout.cpu is None and memory.is_dir()
    assert "task CPU time cannot be capped here" in caplog.text


def task(job_id: str, command: str, *, cpu_count: float) -> StartTask:
    return StartTask(
        event_id=f"{job_id}:1:0:start",
        node_id="n1",
        job_id=job_id,
        attempt=1,
        project_id="p",
        user_name="alice",
        algorithm=algorithm(command),
        spec=spec(resource={"memory_gb": 1, "cpu_count": cpu_count}),
    )


def cpus_seen(output: str) -> list[int]:
    return json.loads(next(line for line in output.splitlines() if line.startswith("CPUS "))[5:])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
async def test_two_one_cpu_tasks_run_on_different_cpus_and_a_big_one_on_all(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    hold = f'{sys.executable} -c "{AFFINITY}; import time; time.sleep(1.5)"'
    one, two = unique("cpu"), unique("cpu")
    await agent.start(task(one, hold, cpu_count=1))
    await agent.start(task(two, hold, cpu_count=1))
    (first, out1), (second, out2) = await asyncio.gather(ended(one, sent), ended(two, sent))
    assert first.reason == second.reason == "completed", (out1, out2)
    assert len(cpus_seen(out1)) == len(cpus_seen(out2)) == 1 and cpus_seen(out1) != cpus_seen(out2)
    big = unique("cpu")
    await agent.start(task(big, f'{sys.executable} -c "{AFFINITY}"', cpu_count=1024))
    done, out = await ended(big, sent)
    assert done.reason == "completed" and set(cpus_seen(out)) == os.sched_getaffinity(0), out
    await asyncio.sleep(0.1)  # the launch's own end, just after the report
    assert not agent.supervisor.cpus.held and not any(agent.supervisor.cpus.load.values())


# Two processes that first widen their affinity to every CPU of the host, then spin: only the cgroup's quota can
# hold them to a tenth of a CPU, and its throttle count says it did.
SPIN = r"""
import os, time
os.sched_setaffinity(0, range(os.cpu_count()))
os.fork()
end = time.monotonic() + 1.5
while time.monotonic() < end:
    pass
"""


@root_only
@with_cgroups
async def test_a_task_that_widens_its_affinity_is_held_to_its_cpu_count_by_its_cgroup(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)
    job_id = unique("quota")
    await agent.start(task(job_id, f"{sys.executable} -c '{SPIN}'", cpu_count=0.1))
    for _ in range(200):
        running = next((t for t in agent.tasks.values() if t.start.job_id == job_id), None)
        if running is not None and running.cgroup is not None:
            break
        await asyncio.sleep(0.05)
    assert running is not None and running.cgroup is not None
    layout = agent.supervisor.confinement.cgroups.layout
    assert layout.limits_cpu, layout  # this host hands down the cpu controller (v1 here, as root)
    cpu = (layout.cpu if layout.cpu is not None else layout.memory) / running.cgroup.dirs[0].name
    for _ in range(200):  # the shim joins its cgroups once forked
        if str(running.pid) in (cpu / "cgroup.procs").read_text().split():
            break
        await asyncio.sleep(0.02)
    assert str(running.pid) in (cpu / "cgroup.procs").read_text().split()  # the shim joined it, and so its task
    if layout.version == 1:
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "10000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    else:
        assert (cpu / "cpu.max").read_text().split() == ["10000", "100000"]
    await asyncio.sleep(1.0)  # while it spins
    stat = dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())
    done, output = await ended(job_id, sent)
    assert done.reason == "completed", output
    assert int(stat["nr_throttled"]) > 0, stat
    assert not Path(cpu).exists()  # removed with the task's other cgroups
