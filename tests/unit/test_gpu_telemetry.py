"""GPU telemetry: the agent's NVML reader (a fake pynvml), the bounds every reading is held to, which readings the
monitor and the estimator believe, and the per-GPU figures `GET /v2/nodes` shows to members and admin alike."""

import math
import os
import sys
import types
from types import SimpleNamespace

import pytest

from shared.bus import RPC_NODES
from shared.events import MAX_GPU_READINGS, GpuReading, NodeHeartbeat, TaskTelemetry
from shared.origin import Given
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.cgroups import TaskCgroup
from services.agent.checkpoints import CheckpointStore
from services.agent.hangs import HangPolicy
from services.agent.nvml import GpuProbe
from services.agent.preparation import Preparer
from services.agent.telemetry import group_pids, task_samples
from services.estimator.telemetry import believed as estimator_believes, believed_process_memory, summary, system_series
from services.monitor.nodes import declare_lost, sighted
from tests.factories import T0, node
from tests.unit.api_app import add_user, client, make_app
from tests.unit.test_agent_hangs import start

GIB = 2**30


class FakeNvml(types.ModuleType):
    """pynvml's calls the reader uses, on made-up GPUs: {index: (util %, used GiB, power mW or None, temp °C)}."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: dict[int, tuple], processes: dict[int, list[tuple[int, int | None]]] | None = None):
        super().__init__("pynvml")
        self.gpus = gpus
        self.processes = processes or {}  # {index: [(pid, used bytes or None: not reported)]}

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index not in self.gpus:
            raise self.NVMLError(f"no GPU {index}")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int):  # noqa: N802
        return SimpleNamespace(gpu=self.gpus[handle][0], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int):  # noqa: N802
        return SimpleNamespace(used=int(self.gpus[handle][1] * GIB), total=80 * GIB, free=0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        if self.gpus[handle][2] is None:
            raise self.NVMLError("Not Supported")
        return self.gpus[handle][2]

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return self.gpus[handle][3]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes.get(handle, [])]


def reading(index: int = 0, **figures) -> dict:
    return {"index": index, "util_percent": 50, "memory_used_gb": 10.0, "power_w": 300.0, "temp_c": 60.0, **figures}


def test_the_reader_gives_each_gpu_s_utilisation_memory_power_and_temperature(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: (37, 12.5, 251_000, 64), 1: (0, 0.0, None, 30)}))
    first, second = GpuProbe().read([0, 1, 7])  # GPU 7 cannot be read: left out
    assert first == GpuReading(index=0, util_percent=37, memory_used_gb=12.5, power_w=251.0, temp_c=64)
    assert second.power_w is None and second.util_percent == 0  # power not supported on that GPU


def test_the_gpu_memory_a_task_s_processes_hold_is_theirs_only_where_nvml_reports_it(monkeypatch):
    fake = FakeNvml(
        {0: (0, 0, 0, 0), 1: (0, 0, 0, 0)},
        processes={0: [(100, 2 * GIB), (999, 30 * GIB)], 1: [(101, GIB), (102, None)]},
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    probe = GpuProbe()
    assert probe.process_memory_gb([0, 1], {100, 101, 102}) == 3.0  # another's process (999) is not the task's
    assert probe.process_memory_gb([1], {102}) is None and probe.process_memory_gb([0], set()) is None


def test_without_nvml_nothing_is_read(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    probe = GpuProbe()
    assert probe.read([0]) == () and probe.busiest([0]) is None


def test_a_figure_nvml_gets_wrong_costs_that_gpu_s_reading_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: (250, 1.0, 1000, 50), 1: (10, 1.0, 1000, 50)}))
    assert [g.index for g in GpuProbe().read([0, 1])] == [1]


@pytest.mark.parametrize(
    "bad",
    [
        {"util_percent": 101},
        {"util_percent": -1},
        {"util_percent": math.nan},
        {"memory_used_gb": math.inf},
        {"memory_used_gb": 2000},
        {"memory_used_gb": -1},
        {"power_w": math.nan},
        {"power_w": 1e9},
        {"temp_c": 1e6},
        {"index": -1},
        {"index": MAX_GPU_READINGS},
        {"util_percent": "busy"},
    ],
)
def test_a_reading_out_of_bounds_is_dropped_and_the_heartbeat_kept(bad):
    beat = NodeHeartbeat.model_validate(
        {"event_id": "e", "node_id": "n1", "boot_id": "b", "gpus": [{**reading(1), **bad}, reading(2), "junk", None]}
    )
    assert [g.index for g in beat.gpus] == [2]


def test_a_heartbeat_carries_at_most_one_reading_per_gpu_and_a_bounded_number():
    beat = NodeHeartbeat(
        event_id="e",
        node_id="n1",
        boot_id="b",
        gpus=[reading(0, util_percent=1), reading(0, util_percent=99)] + [reading(i) for i in range(1, 500)],
    )
    # the first MAX_GPU_READINGS entries are read (one a second reading of GPU 0: dropped), the rest never
    assert len(beat.gpus) == MAX_GPU_READINGS - 1 and beat.gpus[0].util_percent == 1
    assert NodeHeartbeat(event_id="e", node_id="n1", boot_id="b", gpus="not a list").gpus == ()


def test_each_task_s_sample_holds_its_own_gpus_only():
    gpus = tuple(GpuReading(**reading(i)) for i in range(4))
    one, two = task_samples(
        [(start(gpus=(1, 3)), 2.5), (start(gpus=(0, 9)), None), (start(gpus=()), None)],
        gpus,
        node_id="n1",
        seq=5,
        t=1000.0,
    )
    assert [g.index for g in one.gpus] == [1, 3] and [g.index for g in two.gpus] == [0]
    assert (one.process_memory_gb, two.process_memory_gb) == (2.5, None)
    assert one.subject == "tm.telemetry.n1.j" and one.seq == 5


def heartbeating_agent(tmp_path, *, gpus: int, sent: list) -> Agent:
    """An agent of node n1 with `gpus` GPUs whose every message goes to `sent`."""

    async def publish(message) -> None:
        sent.append(message)

    return Agent(
        node=node(node_id="n1", gpus=gpus),
        root=tmp_path,
        publish=publish,
        preparer=Preparer(tmp_path / "engines", {}),
        checkpoints=CheckpointStore(f"file://{tmp_path}/c"),
        storage=StoragePolicy(storage_root=f"file://{tmp_path}/s", checkpoint_root=f"file://{tmp_path}/c"),
        hangs=HangPolicy(gpus=GpuProbe()),
    )


async def test_the_agent_s_heartbeat_carries_its_gpus_and_sends_each_task_s_sample(tmp_path, monkeypatch):
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        FakeNvml(
            {0: (90, 20.0, 300_000, 70), 1: (5, 1.0, 60_000, 40)}, processes={0: [(os.getpid(), 3 * GIB), (1, 9 * GIB)]}
        ),
    )
    sent: list = []
    agent = heartbeating_agent(tmp_path, gpus=2, sent=sent)
    agent.tasks["j:1:0"] = SimpleNamespace(  # the task, in no cgroup: its processes are this one and descendants
        start=start(gpus=(0,)), pid=os.getpid(), stop_reason=None, cgroup=None, in_cgroup=lambda: False
    )
    await agent.heartbeat()
    beat, sample = sent
    assert isinstance(beat, NodeHeartbeat) and [(g.index, g.util_percent) for g in beat.gpus] == [(0, 90), (1, 5)]
    assert isinstance(sample, TaskTelemetry) and sample.job_id == "j" and [g.index for g in sample.gpus] == [0]
    assert sample.process_memory_gb == 3.0


async def test_a_task_s_gpu_memory_is_that_of_the_processes_its_cgroup_lists(tmp_path, monkeypatch):
    # the shim joined the task's cgroup: its processes are read there (a process that left the shim's tree, a
    # daemonised data loader, still counts), not by walking every process of the host
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: (90, 20.0, 300_000, 70)}, processes={0: [(4242, 5 * GIB)]}))
    cg = tmp_path / "cg"
    (cg / "nested").mkdir(parents=True)
    (cg / "cgroup.procs").write_text("")
    (cg / "nested" / "cgroup.procs").write_text("4242\n")
    sent: list = []
    agent = heartbeating_agent(tmp_path, gpus=1, sent=sent)
    cgroup = TaskCgroup(dirs=(cg,), limits=(), oom_file=cg / "memory.events")
    agent.tasks["j:1:0"] = SimpleNamespace(  # its shim is gone (no such pid); the task's process lives on
        start=start(gpus=(0,)), pid=2**22 + 1, stop_reason=None, cgroup=cgroup, in_cgroup=lambda: True
    )
    await agent.heartbeat()
    _, sample = sent
    assert sample.process_memory_gb == 5.0
    assert group_pids(2**22 + 1, cgroup=TaskCgroup(dirs=(tmp_path / "gone",), limits=(), oom_file=cg)) == set()


def test_the_monitor_keeps_a_reading_only_for_a_recorded_gpu_within_its_memory():
    info = node(node_id="n1", gpus=2, gpu_memory_gb=24)
    claimed = tuple(
        GpuReading(**r) for r in (reading(0, memory_used_gb=23.9), reading(1, memory_used_gb=80), reading(5))
    )
    record = sighted(None, node_id="n1", boot_id="b", at=T0, info=info, running=()).node
    beat = sighted(record, node_id="n1", boot_id="b", at=T0, running=(), gpus=claimed).node
    assert [g.index for g in beat.gpus] == [0]
    assert sighted(None, node_id="n2", boot_id="b", at=T0, running=(), gpus=claimed).node.gpus == ()  # no record
    assert declare_lost(beat)[0].gpus == ()  # a silent node's last figures are not shown as now


def test_the_estimator_keeps_readings_of_the_rank_s_own_gpus_within_their_memory():
    sample = TaskTelemetry(
        event_id="e",
        job_id="j",
        attempt=1,
        node_id="n1",
        seq=1,
        t=1.0,
        gpus=[reading(0, memory_used_gb=20), reading(1, memory_used_gb=90), reading(2)],
    )
    assert [g.index for g in estimator_believes(sample, Given(gpu_indices=(0, 1), gpu_memory_gb=24))] == [0]
    assert [g.index for g in estimator_believes(sample, Given(gpu_indices=(0, 1), gpu_memory_gb=0))] == [0, 1]
    assert estimator_believes(sample, None) == ()
    held = sample.model_copy(update={"process_memory_gb": 40.0})
    assert believed_process_memory(held, Given(gpu_indices=(0, 1), gpu_memory_gb=24)) == 40.0  # two GPUs' worth
    assert believed_process_memory(held, Given(gpu_indices=(0,), gpu_memory_gb=24)) is None  # more than it has
    for bad in (math.nan, -1, math.inf, "3", True, 10**9):
        assert (
            TaskTelemetry(
                event_id="e", job_id="j", attempt=1, node_id="n1", seq=1, t=1.0, process_memory_gb=bad
            ).process_memory_gb
            is None
        )


def test_system_series_peak_counts_earlier_samples():
    gpus = (
        GpuReading(**reading(0, util_percent=20, memory_used_gb=4, power_w=100, temp_c=50)),
        GpuReading(**reading(1, util_percent=60, memory_used_gb=6, power_w=None, temp_c=70)),
    )
    assert summary(gpus, 5.5) == {
        "gpu_util": 40.0,
        "gpu_memory_gb": 6.0,
        "gpu_power_w": 100.0,
        "gpu_temp_c": 70.0,
        "gpu_process_memory_gb": 5.5,
    }
    docs = [
        {"t": 1.0, "gpu_util": 40.0, "gpu_memory_gb": 6.0, "gpu_power_w": None, "gpu_temp_c": 70.0},
        {"t": 2.0, "gpu_util": 10.0, "gpu_memory_gb": 3.0, "gpu_power_w": None, "gpu_temp_c": 60.0},
    ]
    series = {s.name: s for s in system_series(docs, peak_before=8.0)}
    assert set(series) == {"gpu_util", "gpu_memory_gb", "gpu_memory_peak_gb", "gpu_temp_c"}
    assert [p[1] for p in series["gpu_memory_peak_gb"].points] == [8.0, 8.0]
    assert all(s.system for s in series.values())


async def test_nodes_show_each_gpu_s_figures_to_a_member_and_the_admin_and_no_job():
    app, db, store = await make_app()
    info = node(node_id="n1", gpus=2).model_dump(mode="json")
    app.state.submitter.requester.broker.answers[RPC_NODES] = {
        "total": 1,
        "offset": 0,
        "items": [
            {
                "node_id": "n1",
                "state": "ready",
                "last_seen": "2026-11-23T15:00:00Z",
                "boot_id": "b",
                "info": info,
                "running": [{"job_id": "job-theirs", "attempt": 1, "rank": 0}],
                "gpus": [reading(1, util_percent=77, memory_used_gb=12.0)],
            }
        ],
    }
    await db.api_jobs.insert_one({"_id": "job-theirs", "project_id": "speech"})
    secret = await add_user(store, "ana", ["vision"])
    for token in (secret, None):
        async with client(app, secret) if token else client(app) as caller:
            [shown] = (await caller.get("/v2/nodes")).json()["items"]
        idle, busy = shown["gpus"]
        assert (busy["index"], busy["util_percent"], busy["memory_used_gb"], busy["memory_gb"]) == (1, 77, 12.0, 24)
        assert idle["util_percent"] is None and idle["memory_used_gb"] is None
        assert token is None or "job-theirs" not in str(shown)
