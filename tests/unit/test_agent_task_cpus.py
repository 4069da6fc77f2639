"""A task is held to its `cpu_count`: pinned to that many of the host's CPUs (least loaded first), so OpenMP and
PyTorch size their threads to its share, and, in a task cgroup, its CPU time capped at that many CPUs. The
allotment's rules, then real tasks."""

import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from shared.jobs import task_cpus
from services.agent import supervision
from services.agent.cgroups import Cgroups, Layout, remove
from services.agent.cpus import CpuAllotment, preferred_order
from tests.factories import unique
from tests.unit.test_agent_isolation import ended, make_agent, root_only, start
from tests.unit.test_agent_task_processes import cgroups_here, with_cgroups

AFFINITY = "import json, os; print('CPUS ' + json.dumps(sorted(os.sched_getaffinity(0))), flush=True)"


def test_a_task_gets_the_cpus_the_fewest_tasks_hold():
    cpus = CpuAllotment(range(4))
    first = cpus.take("a", 2)
    second = cpus.take("b", 2)
    assert len(first) == len(second) == 2 and not set(first) & set(second)  # four CPUs, no overlap
    third = cpus.take("c", 1)
    assert cpus.load()[third[0]] == 2 and sum(cpus.load().values()) == 5
    cpus.give_back("a")
    assert set(cpus.take("d", 2)) == set(first)  # the two CPUs a gave back are the least loaded again
    cpus.give_back("nobody")  # a task that never took any: nothing happens
    assert sum(cpus.load().values()) == 5
    with pytest.raises(ValueError, match="holds CPUs already"):  # its give-back would free the first take's
        cpus.take("d", 1)


def test_a_fraction_takes_a_whole_cpu_and_more_than_the_host_takes_them_all():
    cpus = CpuAllotment([3, 5, 9])
    assert len(cpus.take("half", 0.5)) == 1
    assert cpus.take("big", 64) == (3, 5, 9)
    assert sum(cpus.load().values()) == 4 and set(cpus.load()) == {3, 5, 9}
    with pytest.raises(ValueError):
        CpuAllotment([])


def test_a_gpu_task_gets_at_least_its_gpus_share_of_the_nodes_cpus():
    assert task_cpus(1, gpus=1, node_cpus=128, node_gpus=8) == 16  # the default one CPU would starve its loaders
    assert task_cpus(32, gpus=1, node_cpus=128, node_gpus=8) == 32  # asked for more: more
    assert task_cpus(2, gpus=0, node_cpus=128, node_gpus=8) == 2  # a CPU job: what it asked for
    assert task_cpus(1, gpus=4, node_cpus=16, node_gpus=2) == 16  # more GPUs than the node: all of it
    assert task_cpus(1.5, gpus=0, node_cpus=4, node_gpus=0) == 1.5


def test_nodes_on_one_host_start_at_different_cpus():
    starts = {preferred_order(range(8), f"node-{i}")[0] for i in range(40)}
    assert len(starts) > 4  # a test stack's agents do not all pile their first task onto CPU 0
    assert sorted(preferred_order(range(8), "x")) == list(range(8))
    assert preferred_order([7], "anything") == (7,)


def test_a_cpu_controller_the_host_refuses_leaves_memory_limited(tmp_path, caplog, monkeypatch):
    memory = tmp_path / "memory" / "trainmaster-tasks"
    memory.parent.mkdir()
    refused = tmp_path / "no-such-hierarchy" / "trainmaster-tasks"  # v1: its parent is missing, mkdir fails
    cgroups = Cgroups(Layout(version=1, memory=memory, pids=None, cpu=refused), pids_max=8)
    assert cgroups.layout.cpu is None and not cgroups.layout.limits_cpu and memory.is_dir()
    assert "task CPU time cannot be capped here" in caplog.text
    # v2: "+cpu" refused (a real-time process in the subtree): memory and pids enabled all the same
    top = tmp_path / "v2"
    top.mkdir()
    real_write = Path.write_text

    def refusing(self: Path, text: str, *args, **kwargs):
        if self.name == "cgroup.subtree_control" and "+cpu" in text.split():
            raise OSError(16, "Device or resource busy", str(self))
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refusing)
    layout = Layout(version=2, memory=top / "trainmaster-tasks", pids=None, enable="+memory +pids +cpu")
    v2 = Cgroups(layout, pids_max=8)
    assert v2.layout.enable == "+memory +pids" and not v2.layout.limits_cpu
    assert (top / "trainmaster-tasks" / "cgroup.subtree_control").read_text() == "+memory +pids"


def cpus_seen(output: str) -> list[int]:
    return json.loads(next(line for line in output.splitlines() if line.startswith("CPUS "))[5:])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
async def test_two_one_cpu_tasks_run_on_different_cpus_and_a_big_one_on_all(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    hold = f'{sys.executable} -c "{AFFINITY}; import time; time.sleep(1.5)"'
    one, two = unique("cpu"), unique("cpu")
    await agent.start(start(one, hold, cpu_count=1))
    await agent.start(start(two, hold, cpu_count=1))
    (first, out1), (second, out2) = await asyncio.gather(ended(one, sent), ended(two, sent))
    assert first.reason == second.reason == "completed", (out1, out2)
    assert len(cpus_seen(out1)) == len(cpus_seen(out2)) == 1 and cpus_seen(out1) != cpus_seen(out2)
    big = unique("cpu")
    await agent.start(start(big, f'{sys.executable} -c "{AFFINITY}"', cpu_count=1024))
    done, out = await ended(big, sent)
    assert done.reason == "completed" and set(cpus_seen(out)) == os.sched_getaffinity(0), out
    assert not agent.supervisor.cpus.held  # given back once each task's processes were gone


async def test_a_node_shares_out_only_the_cpus_its_agent_may_use(tmp_path):
    own = os.sched_getaffinity(0)
    one = min(own)
    os.sched_setaffinity(0, {one})  # as an agent started under `taskset` or in a cpuset
    try:
        sent: list = []
        agent = make_agent(tmp_path, sent, confined=False)
    finally:
        os.sched_setaffinity(0, own)
    big = unique("cpu")
    await agent.start(start(big, f'{sys.executable} -c "{AFFINITY}"', cpu_count=64))
    done, out = await ended(big, sent)
    assert done.reason == "completed" and cpus_seen(out) == [one], out


async def test_a_task_that_cannot_start_gives_its_cpus_back(tmp_path, monkeypatch):
    async def failing(*args, **kwargs):
        raise OSError("no shim for you")

    monkeypatch.setattr(supervision, "spawn", failing)
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    job_id = unique("cpu")
    await agent.start(start(job_id, "true", cpu_count=1))
    done, _ = await ended(job_id, sent)
    assert done.reason == "start_failed" and "no shim for you" in done.message
    for _ in range(100):  # the launch's own end, just after the report
        if not agent.supervisor.cpus.held:
            break
        await asyncio.sleep(0.02)
    assert not agent.supervisor.cpus.held


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
    await agent.start(start(job_id, f"{sys.executable} -c '{SPIN}'", cpu_count=0.1))
    for _ in range(200):
        running = next((t for t in agent.tasks.values() if t.start.job_id == job_id), None)
        if running is not None and running.cgroup is not None:
            break
        await asyncio.sleep(0.05)
    assert running is not None and running.cgroup is not None
    layout = agent.supervisor.confinement.cgroups.layout
    if not layout.limits_cpu:
        pytest.skip("this host hands down no cpu controller")
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


@root_only
@with_cgroups
def test_a_cap_the_kernel_refuses_leaves_the_tasks_memory_and_pids_limited(tmp_path):
    """v1 refuses a task's CPU quota above its parent's (an agent in a CPU-limited cgroup, a job asking for more): the
    task keeps its memory and process limits, and only its CPU cap is left out."""
    here = cgroups_here()
    assert here is not None
    if here.layout.version != 1 or here.layout.cpu is None:
        pytest.skip("a v1 cpu hierarchy is needed to give a parent a quota")
    parent = here.layout.cpu.parent / f"tm-test-{unique()}"
    parent.mkdir()
    try:
        (parent / "cpu.cfs_quota_us").write_text("50000")  # half a CPU for everything below
        limited = Cgroups(replace(here.layout, cpu=parent / "trainmaster-tasks"), pids_max=64)
        cg = limited.create(name=f"cap-{unique()}", memory_gb=0.25, cpu_count=2)
        try:
            assert cg is not None and all(d.is_dir() for d in cg.dirs)
            assert not any(parent in d.parents for d in cg.dirs)  # no cpu cgroup, the rest made
            assert (cg.dirs[0] / "memory.limit_in_bytes").read_text().strip() == str(2**28)
            if here.layout.pids is not None:
                assert (here.layout.pids / cg.dirs[0].name / "pids.max").read_text().strip() == "64"
        finally:
            if cg is not None:
                remove(cg)
    finally:
        for leftover in (parent / "trainmaster-tasks", parent):
            if leftover.exists():
                leftover.rmdir()


THREADS = "import json, os; print('THREADS ' + json.dumps(os.environ.get('OMP_NUM_THREADS')), flush=True)"


async def test_an_unpinned_task_is_told_its_thread_count_and_a_pinned_one_counts_its_cpus(tmp_path):
    """Agents sharing a host do not pin: OpenMP would size a task's threads by every CPU of the host and its cgroup's
    cap would throttle them, so the task is told how many CPUs it has (unless its job says)."""
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=False)
    probe = f'{sys.executable} -c "{AFFINITY}; {THREADS}"'
    pinned = unique("cpu")
    await agent.start(start(pinned, probe, cpu_count=1))
    done, out = await ended(pinned, sent)
    assert done.reason == "completed" and "THREADS null" in out and len(cpus_seen(out)) == 1, out
    agent.supervisor.pin_cpus = False
    free = unique("cpu")
    await agent.start(start(free, probe, cpu_count=1.5))
    done, out = await ended(free, sent)
    assert done.reason == "completed" and f'THREADS "{min(2, len(os.sched_getaffinity(0)))}"' in out, out
    assert set(cpus_seen(out)) == os.sched_getaffinity(0)  # where it runs is the kernel's choice
    own = unique("cpu")
    await agent.start(start(own, probe, cpu_count=1, environments={"OMP_NUM_THREADS": "7"}))
    done, out = await ended(own, sent)
    assert done.reason == "completed" and 'THREADS "7"' in out, out
