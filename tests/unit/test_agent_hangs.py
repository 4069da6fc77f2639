"""The agent's hang detection: signs of life, quiet spells reported once, collective-communication defaults."""

import asyncio
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shared.events import LogChunk, StartTask, TaskExited, TaskHung, TaskResumed
from shared.jobs import Algorithm
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore
from services.agent.hangs import (
    GpuProbe,
    HangPolicy,
    Quiet,
    Signs,
    judge,
    latest_sign,
    progressed,
    watch,
)
from services.agent.preparation import Preparer
from services.agent.runner import task_environment
from services.agent.taskenv import PROGRESS_FILE, collective_defaults
from tests.factories import job_body, node, spec
from tests.unit.test_job_validation import errors


def start(*, gpus: tuple[int, ...] = (), **spec_fields) -> StartTask:
    return StartTask(
        event_id="j:1:0:start",
        node_id="n1",
        job_id="j",
        attempt=1,
        project_id="p",
        user_name="a",
        algorithm=Algorithm(command="true"),
        spec=spec(**spec_fields),
        gpu_indices=gpus,
    )


@dataclass
class FakeTask:
    """What the watcher reads of a running task."""

    start: StartTask
    workdir: Path
    last_output: float = field(default_factory=time.monotonic)
    manifest: dict = field(default_factory=dict)


def test_a_quiet_spell_is_reported_once_and_its_end_once():
    quiet = Quiet(last_sign=0.0)
    quiet, verdict = judge(quiet, last_sign=0.0, now=9.9, timeout_s=10)
    assert verdict is None
    quiet, verdict = judge(quiet, last_sign=0.0, now=10.0, timeout_s=10)
    assert verdict == "hung" and quiet.spell == 1
    quiet, verdict = judge(quiet, last_sign=0.0, now=500.0, timeout_s=10)
    assert verdict is None  # still the same spell
    quiet, verdict = judge(quiet, last_sign=501.0, now=502.0, timeout_s=10)
    assert verdict == "resumed" and quiet.spell == 1
    quiet, verdict = judge(quiet, last_sign=501.0, now=511.0, timeout_s=10)
    assert verdict == "hung" and quiet.spell == 2


def test_a_task_showing_life_more_often_than_its_timeout_is_never_reported():
    quiet = Quiet(last_sign=0.0)
    for now in range(1, 1000):
        quiet, verdict = judge(quiet, last_sign=float(now - now % 9), now=float(now), timeout_s=10)
        assert verdict is None


def test_a_timeout_of_zero_is_off():
    assert judge(Quiet(last_sign=0.0), last_sign=0.0, now=1e9, timeout_s=0)[1] is None
    assert HangPolicy(timeout_s=1800).timeout_for(spec(hang_timeout_s=0)) == 0
    assert HangPolicy(timeout_s=1800).timeout_for(spec()) == 1800
    assert HangPolicy(timeout_s=1800).timeout_for(spec(hang_timeout_s=60)) == 60


def test_progress_marks_new_checkpoints_and_busy_gpus_are_signs_of_life(tmp_path):
    task = FakeTask(start=start(), workdir=tmp_path, last_output=5.0)
    signs = Signs()
    assert latest_sign(task, signs, now=100.0, busy=False) == 5.0
    (tmp_path / PROGRESS_FILE).touch()
    assert latest_sign(task, signs, now=101.0, busy=False) == 101.0
    assert latest_sign(task, signs, now=102.0, busy=False) == 5.0  # the same mark again is no news
    os.utime(tmp_path / PROGRESS_FILE, ns=(1, 10**18))
    assert latest_sign(task, signs, now=103.0, busy=False) == 103.0
    task.manifest = {"model.pt": (10, 1)}
    assert latest_sign(task, signs, now=104.0, busy=False) == 104.0
    assert latest_sign(task, signs, now=105.0, busy=False) == 5.0
    assert latest_sign(task, signs, now=106.0, busy=True) == 106.0


def test_the_progress_mark_is_read_without_following_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.touch()
    os.symlink(target, tmp_path / PROGRESS_FILE)
    task = FakeTask(start=start(), workdir=tmp_path, last_output=5.0)
    signs = Signs(mark=os.lstat(tmp_path / PROGRESS_FILE).st_mtime_ns)
    os.utime(target, ns=(1, 10**18))  # the target moving is not the task's mark moving
    assert latest_sign(task, signs, now=100.0, busy=False) == 5.0


async def test_the_watcher_reports_a_quiet_task_hung_then_resumed(tmp_path):
    task = FakeTask(start=start(hang_timeout_s=1), workdir=tmp_path, manifest={"a": (1, 1)})
    sent: list = []

    async def publish(message):
        sent.append(message)

    watcher = asyncio.create_task(watch(task, node_id="n1", policy=HangPolicy(), publish=publish))
    try:
        await asyncio.wait_for(_until(lambda: sent), timeout=10)
        (tmp_path / PROGRESS_FILE).touch()
        await asyncio.wait_for(_until(lambda: len(sent) >= 2), timeout=10)
    finally:
        watcher.cancel()
    hung, resumed = sent[:2]
    assert isinstance(hung, TaskHung) and isinstance(resumed, TaskResumed)
    assert (hung.subject, hung.event_id, hung.spell) == ("tm.job.task.n1.hung", "j:1:0:hung:1", 1)
    assert hung.idle_s >= 1 and not hung.gpus_watched and not hung.progressed
    assert (resumed.subject, resumed.event_id) == ("tm.job.task.n1.resumed", "j:1:0:resumed:1")


async def test_the_watcher_says_whether_the_attempt_moved_the_job_on(tmp_path):
    task = FakeTask(start=start(hang_timeout_s=1), workdir=tmp_path, manifest={"a": (1, 1)})
    sent: list = []

    async def publish(message):
        sent.append(message)

    watcher = asyncio.create_task(watch(task, node_id="n1", policy=HangPolicy(), publish=publish))
    try:
        await asyncio.sleep(0.05)
        task.manifest = {"a": (2, 2)}  # a checkpoint written and synced
        working_until = time.monotonic() + 1.3
        while time.monotonic() < working_until:  # output for longer than a timeout, then silence
            task.last_output = time.monotonic()
            await asyncio.sleep(0.05)
        await asyncio.wait_for(_until(lambda: sent), timeout=10)
    finally:
        watcher.cancel()
    assert sent[0].progressed


def test_progress_is_a_checkpoint_of_its_own_and_a_timeouts_worth_of_life():
    signs = Signs(restored={"a": (1, 1)})
    assert progressed(signs, {"a": (2, 2)}, worked_s=60, timeout_s=60)
    assert not progressed(signs, {"a": (2, 2)}, worked_s=59, timeout_s=60)  # hangs soon after every restart
    assert not progressed(signs, {"a": (1, 1)}, worked_s=6000, timeout_s=60)  # nothing saved since the restore


async def test_the_watcher_does_nothing_when_detection_is_off(tmp_path):
    task = FakeTask(start=start(hang_timeout_s=0), workdir=tmp_path)
    await asyncio.wait_for(watch(task, node_id="n1", policy=HangPolicy(), publish=None), timeout=1)


async def _until(condition, interval_s: float = 0.05):
    while not condition():
        await asyncio.sleep(interval_s)


class FakeNvml(types.ModuleType):
    """pynvml's calls the probe uses, on made-up GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, utilisation: dict[int, int]) -> None:
        super().__init__("pynvml")
        self.utilisation = utilisation

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index not in self.utilisation:
            raise self.NVMLError(f"no GPU {index}")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int):  # noqa: N802
        return types.SimpleNamespace(gpu=self.utilisation[handle], memory=0)


def test_gpu_utilisation_is_the_busiest_of_the_tasks_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: 0, 1: 37, 2: 90}))
    probe = GpuProbe()
    assert probe.busiest([0, 1]) == 37 and probe.busiest([0]) == 0 and probe.busiest([]) is None
    assert probe.busiest([5]) is None  # an unreadable GPU tells nothing


def test_without_nvml_gpu_utilisation_is_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert GpuProbe().busiest([0]) is None


def test_every_task_gets_collective_timeouts_unless_its_job_sets_them():
    assert collective_defaults({}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ENABLE_MONITORING": "1"}
    assert collective_defaults({"NCCL_ASYNC_ERROR_HANDLING": "0"}) == {"TORCH_NCCL_ENABLE_MONITORING": "1"}
    env = environment(environments={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    env = environment(parameters=[{"name": "TORCH_NCCL_ENABLE_MONITORING", "value": "0"}])
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "0" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert environment()["TRAINMASTER_PROGRESS_FILE"] == f"/w/attempt/{PROGRESS_FILE}"


def environment(**algorithm) -> dict[str, str]:
    command = StartTask(
        event_id="j:1:0:start",
        node_id="n1",
        job_id="j",
        attempt=1,
        project_id="p",
        user_name="a",
        algorithm=Algorithm(command="true", **algorithm),
        spec=spec(),
    )
    return task_environment(command, node(node_id="n1"), workdir=Path("/w/attempt"), base={"PATH": "/usr/bin"})


@pytest.mark.parametrize(
    "body, field_name",
    [
        ({"hang_timeout_s": -1}, "spec.hang_timeout_s"),
        ({"hang_timeout_s": "60"}, "spec.hang_timeout_s"),
        ({"hang_timeout_s": 1.5}, "spec.hang_timeout_s"),
        ({"hang_restarts": -1}, "spec.hang_restarts"),
        ({"hang_restarts": 101}, "spec.hang_restarts"),
        ({"hang_restarts": True}, "spec.hang_restarts"),
    ],
)
def test_hang_settings_are_validated_with_the_field_named(body, field_name):
    assert errors(job_body(**body)) == [field_name]


def test_hang_settings_default_to_the_cluster_timeout_and_three_restarts():
    assert (spec().hang_timeout_s, spec().hang_restarts) == (None, 3)


def make_agent(root: Path, sent: list) -> Agent:
    async def publish(message) -> None:
        sent.append(message)

    return Agent(
        node=node(node_id="n1"),
        root=root,
        publish=publish,
        preparer=Preparer(root / "engines", {}),
        checkpoints=CheckpointStore(f"file://{root}/checkpoints"),
        storage=StoragePolicy(storage_root=f"file://{root}/storage", checkpoint_root=f"file://{root}/checkpoints"),
    )


def start_task(job_id: str, command: str, *, timeout_s: int) -> StartTask:
    return StartTask(
        event_id=f"{job_id}:1:0:start",
        node_id="n1",
        job_id=job_id,
        attempt=1,
        project_id="p",
        user_name="a",
        algorithm=Algorithm(command=command),
        spec=spec(hang_timeout_s=timeout_s),
    )


async def test_an_agent_reports_its_quiet_task_and_its_return_and_never_a_quiet_one_marking_progress(tmp_path):
    sent: list = []
    agent = make_agent(tmp_path, sent)
    quiet_spell = (
        f"{sys.executable} -c 'import time; print(1, flush=True); time.sleep(2); print(2, flush=True); time.sleep(0.6)'"
    )
    marking = (
        f"{sys.executable} -c 'import time, trainmaster_task as tm\nfor _ in range(16): tm.progress(); "
        "time.sleep(0.2)'"
    )  # prints nothing for 3 s, a progress mark five times a second
    await agent.start(start_task("quiet", quiet_spell, timeout_s=1))
    await agent.start(start_task("marking", marking, timeout_s=2))
    await asyncio.wait_for(_until(lambda: sum(isinstance(m, TaskExited) for m in sent) == 2), timeout=30)
    told = {
        job: [m.type for m in sent if m.job_id == job and not isinstance(m, LogChunk)] for job in ("quiet", "marking")
    }
    assert told["marking"] == ["TaskStarted", "TaskExited"]
    assert told["quiet"][0] == "TaskStarted" and told["quiet"][-2:] == ["TaskResumed", "TaskExited"]
    assert "TaskHung" in told["quiet"]
    assert {m.reason for m in sent if isinstance(m, TaskExited)} == {"completed"}
