"""Whether a task still shows signs of life; a task quiet past its hang timeout is reported hung.

Signs of life: an output line (metric points and the SDK's `report()` are output lines), a progress mark (the
file TRAINMASTER_PROGRESS_FILE touched, as the SDK's `progress()` does), a new checkpoint, and, where the node
reads its GPUs through NVML (`nvidia-ml-py`, optional), one of the task's GPUs busy. The decisions are pure
functions of the times seen; `watch` is the loop that gathers them for one task.
"""

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from shared.events import Message, StartTask, TaskHung, TaskResumed
from shared.jobs import Spec
from services.agent.nvml import GpuProbe
from services.agent.taskenv import PROGRESS_FILE

if TYPE_CHECKING:
    from services.agent.runner import TaskProcess

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0


@dataclass
class HangPolicy:
    """The cluster's default timeout, and how GPU utilisation counts."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    busy_percent: float = 5.0
    gpus: GpuProbe | None = None

    def timeout_for(self, spec: Spec) -> float:
        """The job's own timeout, else the cluster's; 0 is off."""
        return float(self.timeout_s if spec.hang_timeout_s is None else spec.hang_timeout_s)


def check_interval(timeout_s: float) -> float:
    """How often to look: often enough that a hang is reported within a sixth of its timeout (5 s at most)."""
    return min(5.0, max(0.2, timeout_s / 6))


@dataclass(frozen=True)
class Quiet:
    """One task's last sign of life and whether its current quiet spell was reported."""

    last_sign: float
    spell: int = 0
    reported: bool = False
    reported_sign: float = 0.0


Verdict = Literal["hung", "resumed"] | None


def judge(quiet: Quiet, *, last_sign: float, now: float, timeout_s: float) -> tuple[Quiet, Verdict]:
    """Report a spell once when the task has been quiet for its timeout, and its end when it shows life again."""
    quiet = replace(quiet, last_sign=max(quiet.last_sign, last_sign))
    if quiet.reported:
        if quiet.last_sign > quiet.reported_sign:
            return replace(quiet, reported=False), "resumed"
        return quiet, None
    if timeout_s > 0 and now - quiet.last_sign >= timeout_s:
        return replace(quiet, spell=quiet.spell + 1, reported=True, reported_sign=quiet.last_sign), "hung"
    return quiet, None


@dataclass
class Signs:
    """What was last seen of a task's progress mark and checkpoint, to tell when they change."""

    restored: dict = field(default_factory=dict)
    checkpoint: dict = field(default_factory=dict)
    mark: int | None = None


def latest_sign(task: "TaskProcess", signs: Signs, *, now: float, busy: bool) -> float:
    """The monotonic time of the task's latest sign of life seen so far (updating `signs`)."""
    latest = task.last_output
    mark = progress_mark(task.workdir)
    if mark is not None and mark != signs.mark:
        signs.mark, latest = mark, now
    if task.manifest != signs.checkpoint:
        signs.checkpoint, latest = task.manifest, now
    return now if busy else latest


def progressed(signs: Signs, manifest: dict, *, worked_s: float, timeout_s: float) -> bool:
    """Whether the attempt moved the job on before it went quiet: it saved a checkpoint of its own and showed life
    for at least a timeout's length (an attempt that hangs soon after every restart, even after saving, has not)."""
    return manifest != signs.restored and worked_s >= timeout_s


def progress_mark(workdir: Path) -> int | None:
    """The progress file's modification time (of the link itself, should the task make it one)."""
    try:
        return os.lstat(workdir / PROGRESS_FILE).st_mtime_ns
    except OSError:
        return None


async def watch(
    task: "TaskProcess", *, node_id: str, policy: HangPolicy, publish: Callable[[Message], Awaitable[None]]
) -> None:
    """Follow one task until cancelled (when it ends), reporting each quiet spell and its end."""
    start = task.start
    timeout_s = policy.timeout_for(start.spec)
    if timeout_s <= 0:
        return
    signs = Signs(restored=task.manifest, checkpoint=task.manifest, mark=progress_mark(task.workdir))
    began = task.last_output
    quiet = Quiet(last_sign=began)
    while True:
        await asyncio.sleep(check_interval(timeout_s))
        busy = await gpus_busy(policy, start.gpu_indices)
        now = time.monotonic()
        quiet, verdict = judge(
            quiet, last_sign=latest_sign(task, signs, now=now, busy=bool(busy)), now=now, timeout_s=timeout_s
        )
        if verdict == "hung":
            report = hung(
                start,
                node_id=node_id,
                quiet=quiet,
                now=now,
                gpus_watched=busy is not None,
                progressed=progressed(signs, task.manifest, worked_s=quiet.last_sign - began, timeout_s=timeout_s),
            )
            log.warning(
                "task %s quiet for %.1fs (timeout %gs): reported hung", report.event_id, report.idle_s, timeout_s
            )
            await publish(report)
        elif verdict == "resumed":
            log.info("task %s:%d:%d shows life again", start.job_id, start.attempt, start.rank)
            await publish(resumed(start, node_id=node_id, quiet=quiet))


async def gpus_busy(policy: HangPolicy, indices: Sequence[int]) -> bool | None:
    """Whether one of the task's GPUs is busy; None where utilisation cannot be read."""
    if policy.gpus is None or not indices:
        return None
    busiest = await asyncio.to_thread(policy.gpus.busiest, indices)
    return None if busiest is None else busiest >= policy.busy_percent


def hung(start: StartTask, *, node_id: str, quiet: Quiet, now: float, gpus_watched: bool, progressed: bool) -> TaskHung:
    return TaskHung(
        event_id=f"{start.job_id}:{start.attempt}:{start.rank}:hung:{quiet.spell}",
        job_id=start.job_id,
        attempt=start.attempt,
        rank=start.rank,
        node_id=node_id,
        spell=quiet.spell,
        idle_s=round(now - quiet.last_sign, 3),
        gpus_watched=gpus_watched,
        progressed=progressed,
    )


def resumed(start: StartTask, *, node_id: str, quiet: Quiet) -> TaskResumed:
    return TaskResumed(
        event_id=f"{start.job_id}:{start.attempt}:{start.rank}:resumed:{quiet.spell}",
        job_id=start.job_id,
        attempt=start.attempt,
        rank=start.rank,
        node_id=node_id,
        spell=quiet.spell,
        idle_s=round(quiet.last_sign - quiet.reported_sign, 3),
    )
