"""Hung jobs as pure functions: suspected when every running rank is reported quiet, restarted from the
checkpoint after a grace period, failed after `spec.hang_restarts` restarts in a row without progress.

    Running[Running] ──(every running rank quiet)──► Running[Hanging] ──(a rank shows life)──► Running[Running]
                                                            │ (grace over)
                                                            ├──► snapshot (SIGTERM) ──► Pending[Queuing] (cause hung)
                                                            └──► Failed (restarts in a row used up)
"""

from datetime import datetime
from typing import TYPE_CHECKING

from shared.events import TaskHung, TaskResumed
from shared.jobs import Phase, SecondaryPhase
from services.monitor.state import JobState, Outcome, _end_attempt, notify, stop_all, switch

if TYPE_CHECKING:
    from services.monitor.service import Monitor


def task_hung(job: JobState, event: TaskHung, *, now: datetime) -> Outcome:
    """A rank went quiet; once every running rank of the attempt is, the job is suspected hung and its owner told."""
    task = job.tasks.get(str(event.rank))
    if (
        event.attempt != job.attempt
        or task is None
        or task.state != "running"
        or job.phase != Phase.RUNNING
        or event.rank in job.hung_ranks
    ):
        return job, []
    job = job.model_copy(
        update={
            "hung_ranks": tuple(sorted({*job.hung_ranks, event.rank})),
            "hung_idle_s": max(job.hung_idle_s, event.idle_s),
            "hung_progressed": job.hung_progressed or event.progressed,
        }
    )
    running = {int(rank) for rank, t in job.tasks.items() if t.state == "running"}
    if not running <= set(job.hung_ranks) or job.secondary_phase == SecondaryPhase.HANGING or job.stop_cause:
        return job, []
    gpus = " and its GPUs stayed idle" if event.gpus_watched else ""
    reason = f"suspected hung: no output, metric point or progress mark for {job.hung_idle_s:.0f}s{gpus}"
    job, events = switch(
        job.model_copy(update={"hung_since": now}), Phase.RUNNING, SecondaryPhase.HANGING, reason=reason, now=now
    )
    message = (
        f"{reason} (attempt {job.attempt}); unless it shows signs of life it will be snapshotted and "
        "restarted from its checkpoint"
    )
    return job, events + [notify(job, "hung", message, now=now)]


def task_resumed(job: JobState, event: TaskResumed, *, now: datetime) -> Outcome:
    """A quiet rank showed life again: a suspected job is running again, unless its restart has begun."""
    if event.attempt != job.attempt or event.rank not in job.hung_ranks:
        return job, []
    job = job.model_copy(update={"hung_ranks": tuple(r for r in job.hung_ranks if r != event.rank)})
    if job.phase != Phase.RUNNING or job.secondary_phase != SecondaryPhase.HANGING or job.stop_cause:
        return job, []
    job = job.model_copy(update={"hung_since": None, "hung_idle_s": 0.0, "hung_progressed": False})
    return switch(
        job,
        Phase.RUNNING,
        SecondaryPhase.RUNNING,
        reason=f"shows signs of life again after {event.idle_s:.0f}s quiet",
        now=now,
    )


def restart_hung(job: JobState, *, grace_s: float, now: datetime) -> Outcome:
    """After the grace period a job still suspected hung is snapshotted and re-placed (its streak of restarts
    without progress counted), or fails once that streak reached its spec.hang_restarts."""
    if (
        job.phase != Phase.RUNNING
        or job.secondary_phase != SecondaryPhase.HANGING
        or job.stop_cause
        or job.hung_since is None
        or (now - job.hung_since).total_seconds() < grace_s
    ):
        return job, []
    streak = 0 if job.hung_progressed else job.hung_streak
    quiet = f"no output, metric point or progress mark for {job.hung_idle_s:.0f}s"
    if streak >= job.hang_restarts:
        reason = (
            f"hung: {quiet}, after {streak} restart{'s' * (streak != 1)} from its checkpoint in a row without progress"
        )
        job, events = switch(
            _end_attempt(job, "hung", now), Phase.FAILED, SecondaryPhase.FAILED, reason=reason, now=now
        )
        return job, events + stop_all(job, reason="hung", now=now) + [notify(job, "hung_failed", reason, now=now)]
    job = job.model_copy(update={"stop_cause": "hung", "stop_asked_at": now, "hung_streak": streak + 1})
    job, events = switch(
        job,
        Phase.RUNNING,
        SecondaryPhase.HANGING,
        now=now,
        reason=f"hung ({quiet}): taking a snapshot to restart it from its checkpoint "
        f"(restart {streak + 1} of at most {job.hang_restarts} in a row)",
    )
    return job, events + stop_all(job, reason="hung", now=now)


async def restart_overdue(monitor: "Monitor", *, grace_s: float, now: datetime) -> None:
    """Restart (or fail) every job whose hang grace period is over; no read while no job may be hanging, but for
    one a minute (`Monitor.dues`)."""
    if not monitor.dues.hang_due(now):
        return
    monitor.dues.hang_sweep_begins(now)
    suspected = [
        d["_id"]
        async for d in monitor.jobs.collection.find(
            {"phase": Phase.RUNNING.value, "secondary_phase": SecondaryPhase.HANGING.value}, {"_id": 1}
        )
    ]
    for job_id in suspected:
        await monitor.apply(job_id, lambda job: None if job is None else restart_hung(job, grace_s=grace_s, now=now))
    monitor.dues.hang_swept(bool(suspected))
