"""The job status projection as pure functions: an event in, the new state and the messages it causes out.

Every phase change goes through `switch`, which checks the state machine and builds the JobStatusChanged.
Fencing: a task of an attempt that is not the job's current one is told to stop and otherwise ignored.
"""

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from shared.bus import ACK_WAIT_S
from shared.events import (
    Assignment,
    Attempt,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    Message,
    Notification,
    RequeueCause,
    StartTask,
    StopTask,
    TaskExited,
    TaskHung,
    TaskPreparing,
    TaskResumed,
    TaskStarted,
    TaskStatus,
)
from shared.jobs import Phase, SecondaryPhase, check_transition
from shared.keyed import PATIENCE_S, REDELIVERY_MARGIN_S

# What an agent says of one of its tasks.
TaskEvent = TaskPreparing | TaskStarted | TaskExited | TaskHung | TaskResumed
ATTEMPT_ACTIVE = frozenset({Phase.PENDING, Phase.RUNNING, Phase.TERMINATING})
# Why an attempt begins, by why the one before it went back to the queue.
ATTEMPT_REASON = {
    "node_lost": "node_lost",
    "oom_gpu": "oom",
    "oom_host": "oom",
    "migrated": "migrated",
    "slow": "slow",
    "reclaimed": "reclaimed",
    "stopped": "restarted",
    "hung": "hung",
}
REPEATED_FAILURES = 3
# A start delivered to the monitor and lost with a bus server comes again after the ack wait: a "completed" exit
# heard before its task's start is kept that long for it, then counts as a task that completed without starting.
START_WAIT_S = ACK_WAIT_S + 2 * REDELIVERY_MARGIN_S + PATIENCE_S
# A task asked to stop (terminated, moved, restarted after a hang) exits within its grace (the agent then kills it)
# and says so once it has mirrored its last checkpoint and outputs: a node that never does (a compromised agent, one
# half-broken but heartbeating) would leave the job Terminating, or Running with its stop pending, and billed, for
# good. Past its grace and this long, each task not heard from counts as stopped (`stops_unheard`): long enough for
# an honest node's last upload of a large checkpoint (one still uploading then is cut: its next attempt restores
# what had arrived).
STOP_WAIT_S = 1800.0


class TaskRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    node_id: str
    state: Literal["assigned", "running", "exited"] = "assigned"
    boot_id: str = ""  # the agent run that started it (TaskStarted), when it said
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    early_exit: TaskExited | None = None  # a "completed" exit heard before the start, applied when it comes
    exit_due: datetime | None = None  # when that exit counts without its start (START_WAIT_S after it was heard)


class JobState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    job_id: str
    project_id: str
    user_name: str
    grace_s: float = 10
    max_duration_s: int | None = None
    phase: Phase = Phase.CREATING
    secondary_phase: SecondaryPhase = SecondaryPhase.CREATING
    version: int = 0
    reason: str = ""
    attempt: int = 0
    assignments: tuple[Assignment, ...] = ()
    tasks: dict[str, TaskRecord] = Field(default_factory=dict)
    attempts: tuple[Attempt, ...] = ()
    start_time: datetime | None = None
    end_time: datetime | None = None
    requeue_cause: RequeueCause | None = None
    stop_cause: RequeueCause | None = Field(None, description="Why the current attempt is being stopped.")
    stop_asked_at: datetime | None = Field(None, description="When the current attempt's tasks were asked to stop.")
    # hang detection (services/monitor/hangs.py): the job's limit, the current attempt's quiet ranks, the streak
    hang_restarts: int = 3
    hung_ranks: tuple[int, ...] = ()
    hung_since: datetime | None = None
    hung_idle_s: float = 0.0
    hung_progressed: bool = False
    hung_streak: int = Field(0, description="Restarts after a hang in a row, none of them having made progress.")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(a.node_id for a in self.assignments)

    @computed_field  # type: ignore[prop-decorator]  # stored with the job: the overdue sweep reads only what is due
    @property
    def deadline(self) -> datetime | None:
        """When the job has run its max_duration_s since it first started; None without either."""
        if not self.max_duration_s or self.start_time is None:
            return None
        return self.start_time + timedelta(seconds=self.max_duration_s)

    @computed_field  # type: ignore[prop-decorator]  # stored with the job: the sweep reads only jobs with one due
    @property
    def exits_due(self) -> datetime | None:
        """When the first exit kept for a start not yet heard counts without it; None without one."""
        due = [t.exit_due for t in self.tasks.values() if t.exit_due]
        return None if not due or self.phase.is_finished() else min(due)

    @computed_field  # type: ignore[prop-decorator]  # stored with the job: the sweep reads only jobs with one due
    @property
    def stop_due(self) -> datetime | None:
        """When the tasks asked to stop that have not exited count as stopped (`stops_unheard`): the stop's grace
        and STOP_WAIT_S after it was asked; None while no stop is pending."""
        pending = self.phase == Phase.TERMINATING or (self.phase == Phase.RUNNING and self.stop_cause is not None)
        if self.stop_asked_at is None or not pending:
            return None
        return self.stop_asked_at + timedelta(seconds=self.grace_s + STOP_WAIT_S)


Outcome = tuple[JobState, list[Message]]


def switch(job: JobState, phase: Phase, secondary: SecondaryPhase, *, reason: str, now: datetime) -> Outcome:
    """The one way a job's status changes: validate the transition, then emit the event."""
    if phase != job.phase:
        check_transition(job.phase, phase)
    end_time = now if phase.is_finished() else job.end_time
    new = job.model_copy(
        update={
            "phase": phase,
            "secondary_phase": secondary,
            "reason": reason,
            "version": job.version + 1,
            "end_time": end_time,
        }
    )
    return new, [snapshot(new, now=now, previous=job.phase)]


def snapshot(job: JobState, *, now: datetime, previous: Phase | None = None) -> JobStatusChanged:
    """The status event of the job's current version."""
    return JobStatusChanged(
        event_id=f"{job.job_id}:status:{job.version}",
        occurred_at=now,
        job_id=job.job_id,
        project_id=job.project_id,
        user_name=job.user_name,
        version=job.version,
        phase=job.phase,
        secondary_phase=job.secondary_phase,
        previous_phase=previous,
        reason=job.reason,
        attempt=job.attempt,
        node_ids=job.node_ids,
        start_time=job.start_time,
        end_time=job.end_time,
        task_statuses=task_statuses(job),
        attempts=job.attempts,
        requeue_cause=job.requeue_cause if job.phase == Phase.PENDING else None,
    )


def task_statuses(job: JobState) -> tuple[TaskStatus, ...]:
    return tuple(
        TaskStatus(task=f"worker-{rank}", exit_code=t.exit_code, message=t.message)
        for rank, t in sorted(job.tasks.items(), key=lambda kv: int(kv[0]))
    )


def stop_all(job: JobState, *, reason: str, now: datetime, only_running: bool = False) -> list[Message]:
    """StopTask for every rank of the current attempt (that may still be alive)."""
    return [
        stop(job.job_id, job.attempt, t.node_id, rank=int(rank), reason=reason, grace_s=job.grace_s, now=now)
        for rank, t in job.tasks.items()
        if t.state != "exited" and not (only_running and t.state != "running")
    ]


def stop(
    job_id: str, attempt: int, node_id: str, *, rank: int = 0, reason: str, grace_s: float, now: datetime
) -> StopTask:
    return StopTask(
        event_id=f"{job_id}:{attempt}:{rank}:stop:{reason}",
        occurred_at=now,
        node_id=node_id,
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        reason=reason,
        grace_s=grace_s,
    )


def submitted(event: JobSubmitted, *, now: datetime) -> Outcome:
    job = JobState(
        job_id=event.job_id,
        project_id=event.project_id,
        user_name=event.user_name,
        grace_s=event.spec.termination_grace_s,
        max_duration_s=event.spec.max_duration_s,
        hang_restarts=event.spec.hang_restarts,
    )
    return switch(job, Phase.PENDING, SecondaryPhase.QUEUING, reason="queued", now=now)


def placed(
    job: JobState,
    event: JobPlaced,
    *,
    now: datetime,
    gone: Collection[str] = (),
    silences: Mapping[str, int] | None = None,
) -> Outcome:
    """Accept a placement and start its ranks, in the same write; a job no longer waiting for one (terminated,
    or already placed) starts nothing. A placement on a node the monitor has already lost or released (`gone`:
    placement had not heard yet) sends that node nothing and goes back to the queue at once: a start queued for a
    lost node would run when its agent came back, whatever the job had become meanwhile. Each start carries its
    node's `silences` as last reported: one delivered after a later silence (and perhaps the node's loss) is
    refused by its agent."""
    if event.attempt <= job.attempt or job.phase != Phase.PENDING or job.assignments:
        return job, []
    job = job.model_copy(
        update={
            "attempt": event.attempt,
            "assignments": event.assignments,
            "tasks": {str(a.rank): TaskRecord(node_id=a.node_id) for a in event.assignments},
            "attempts": job.attempts
            + (
                Attempt(
                    attempt=event.attempt,
                    node_ids=tuple(  # rank order: node_ids[rank]
                        a.node_id for a in sorted(event.assignments, key=lambda a: a.rank)
                    ),
                    placed_at=now,
                    reason=ATTEMPT_REASON.get(job.requeue_cause or "", "started"),
                ),
            ),
            "stop_cause": None,
            "stop_asked_at": None,
            "hung_ranks": (),
            "hung_since": None,
            "hung_idle_s": 0.0,
            "hung_progressed": False,
        }
    )
    nodes = ", ".join(job.node_ids)
    job, events = switch(job, Phase.PENDING, SecondaryPhase.SCHEDULED, reason=f"placed on {nodes}", now=now)
    away = sorted({a.node_id for a in event.assignments} & set(gone))
    if away:
        detail = f"placed on {', '.join(away)}, lost before the attempt started"
        job, requeued = requeue(job, cause="node_lost", detail=detail, now=now, lost=tuple(away))
        return job, events + requeued
    return job, events + starts(job, event, now=now, silences=silences or {})


def starts(job: JobState, event: JobPlaced, *, now: datetime, silences: Mapping[str, int]) -> list[StartTask]:
    """One StartTask per rank of the placed attempt, as the job's own project and user."""
    launch = event.launch
    return [
        StartTask(
            event_id=f"{event.job_id}:{event.attempt}:{a.rank}:start",
            occurred_at=now,
            node_id=a.node_id,
            job_id=event.job_id,
            attempt=event.attempt,
            rank=a.rank,
            world_size=len(event.assignments),
            master_addr=launch.master_addr,
            master_port=launch.master_port,
            gpu_indices=a.gpu_indices,
            project_id=job.project_id,
            user_name=job.user_name,
            algorithm=launch.algorithm,
            spec=launch.spec,
            silences=silences.get(a.node_id, 0),
        )
        for a in event.assignments
    ]


def from_placed_node(job: JobState, event: TaskEvent) -> bool:
    """Whether the event's node is where its attempt placed its rank (for an earlier attempt too): the only node
    whose agent may speak for that task. Anything else is forged or misrouted."""
    if event.attempt == job.attempt and job.tasks:
        task = job.tasks.get(str(event.rank))
        return task is not None and task.node_id == event.node_id
    return any(
        a.attempt == event.attempt and 0 <= event.rank < len(a.node_ids) and a.node_ids[event.rank] == event.node_id
        for a in job.attempts
    )


def foreign_task(job: JobState, event: TaskEvent, *, now: datetime) -> Outcome:
    """An event from a node its attempt was not placed on changes nothing; a start there is told to stop (fencing
    an attempt this monitor never accepted), which stops nothing anywhere else."""
    if not isinstance(event, TaskStarted):
        return job, []
    return job, [stop(job.job_id, event.attempt, event.node_id, rank=event.rank, reason="fenced", grace_s=0, now=now)]


def task_preparing(job: JobState, event: TaskPreparing, *, now: datetime) -> Outcome:
    task = job.tasks.get(str(event.rank))
    if (
        event.attempt != job.attempt
        or task is None
        or task.node_id != event.node_id
        or task.state != "assigned"
        or job.phase != Phase.PENDING
        or job.secondary_phase == SecondaryPhase.PREPARING
    ):
        return job, []
    return switch(
        job,
        Phase.PENDING,
        SecondaryPhase.PREPARING,
        reason=f"preparing its environment, code and inputs on {event.node_id}",
        now=now,
    )


def task_started(job: JobState, event: TaskStarted, *, now: datetime) -> Outcome:
    task = job.tasks.get(str(event.rank))
    current = event.attempt == job.attempt and task is not None and task.node_id == event.node_id
    if task is None or not current or job.phase not in ATTEMPT_ACTIVE:
        fence: list[Message] = [
            stop(job.job_id, event.attempt, event.node_id, rank=event.rank, reason="fenced", grace_s=0, now=now)
        ]
        noted = _note_start(job, event.attempt, now)
        if noted != job and job.phase.is_finished():  # no later status would carry it to the API: one more does
            noted = noted.model_copy(update={"version": job.version + 1})
            return noted, fence + [snapshot(noted, now=now, previous=job.phase)]
        return noted, fence
    if task.state != "assigned":
        return job, []
    # When the monitor heard of the start, not when the agent says it was: a node's clock is only its claim.
    running = task.model_copy(
        update={"state": "running", "started_at": now, "boot_id": event.boot_id, "early_exit": None, "exit_due": None}
    )
    job = _with_task(job, event.rank, running)
    if task.early_exit is None:
        return _started(job, event, now=now)
    # the exit heard first, applied in its order now; a task gone is not told to stop by a termination
    job, events = (job, []) if job.phase == Phase.TERMINATING else _started(job, event, now=now)
    job, ended = _exited(job, task.early_exit, now=now)
    return job, events + ended


def _started(job: JobState, event: TaskStarted, *, now: datetime) -> Outcome:
    """What the start of a task of the current attempt (now running) changes for its job."""
    if job.phase == Phase.TERMINATING:
        return job, [
            stop(
                job.job_id,
                job.attempt,
                event.node_id,
                rank=event.rank,
                reason="terminated",
                grace_s=job.grace_s,
                now=now,
            )
        ]
    if job.phase == Phase.PENDING and all(t.started_at for t in job.tasks.values()):
        attempts = tuple(
            a.model_copy(update={"started_at": now}) if a.attempt == job.attempt else a for a in job.attempts
        )
        job = job.model_copy(update={"start_time": job.start_time or now, "attempts": attempts})
        return switch(job, Phase.RUNNING, SecondaryPhase.RUNNING, reason="all tasks started", now=now)
    return job, []


def task_exited(job: JobState, event: TaskExited, *, now: datetime) -> Outcome:
    """A task of the current attempt ended, as its placed node says (`from_placed_node`), timed when the monitor
    heard it. A "completed" exit heard before the task's start is kept on the task until the start comes (it may be
    on its way: a delivery lost with a bus server is redelivered after the ack wait), then applied after it
    (`task_started`), or at `exit_due` without it (`exits_unstarted`). Only a task that started can complete, and
    only with exit code 0: a "completed" exit of a task never started, or one with another code, is that task
    failing (the node contradicts itself)."""
    task = job.tasks.get(str(event.rank))
    if event.attempt != job.attempt or task is None or task.node_id != event.node_id or task.state == "exited":
        return job, []
    if event.reason == "completed" and task.state == "assigned":
        if task.early_exit is not None:  # the same exit again, or a second one: the first is kept
            return job, []
        due = now + timedelta(seconds=START_WAIT_S)
        return _with_task(job, event.rank, task.model_copy(update={"early_exit": event, "exit_due": due})), []
    return _exited(job, event, now=now)


def exits_unstarted(job: JobState, *, now: datetime) -> Outcome:
    """Apply the exits kept for starts that did not come by their `exit_due`: each task completed without having
    started (a failure)."""
    events: list[Message] = []
    for rank in sorted(job.tasks, key=int):
        if job.phase.is_finished():  # ended by an exit applied before
            break
        task = job.tasks[rank]  # as the exits applied before left it
        if task.early_exit and task.exit_due and task.exit_due <= now:
            job, more = _exited(job, task.early_exit, now=now)
            events += more
    return job, events


def stops_unheard(job: JobState, *, now: datetime) -> Outcome:
    """Past `stop_due`, each task asked to stop that reported no exit counts as stopped by it, as if its node had
    said so: the job ends Terminated, or is placed again as its stop meant (a move, a restart after a hang), and
    billing closes the attempt there. A node's late exit is then one for an attempt already over: nothing."""
    due = job.stop_due
    if due is None or now < due:
        return job, []
    events: list[Message] = []
    for rank in sorted(job.tasks, key=int):
        task = job.tasks.get(rank)
        if job.stop_due is None or task is None:  # ended or placed again by an exit applied before
            break
        if task.state == "exited":
            continue
        waited = int(job.grace_s + STOP_WAIT_S)
        unheard = TaskExited(
            event_id=f"{job.job_id}:{job.attempt}:{rank}:exit:unheard",
            job_id=job.job_id,
            attempt=job.attempt,
            rank=int(rank),
            node_id=task.node_id,
            reason="terminated",
            message=f"worker-{rank}: no exit reported by {task.node_id} {waited} s after it was asked to stop",
            ended_at=now,
        )
        job, more = _exited(job, unheard, now=now)
        events += more
    return job, events


def _exited(job: JobState, event: TaskExited, *, now: datetime) -> Outcome:
    """The exit of a task of the current attempt, placed on its node and not exited yet (`task_exited`)."""
    task = job.tasks[str(event.rank)]
    if event.reason == "completed" and (task.state != "running" or event.exit_code != 0):
        detail = "without having started" if task.state != "running" else f"with exit code {event.exit_code}"
        event = event.model_copy(
            update={
                "reason": "failed",
                "message": f"worker-{event.rank} reported completing {detail}; taken as a failure",
            }
        )
    job = _with_task(
        job,
        event.rank,
        task.model_copy(
            update={
                "state": "exited",
                "ended_at": now,
                "exit_code": event.exit_code,
                "reason": event.reason,
                "message": event.message,
                "early_exit": None,
                "exit_due": None,
            }
        ),
    )
    all_exited = all(t.state == "exited" for t in job.tasks.values())
    if job.phase == Phase.TERMINATING:
        if not all_exited:
            return job, []
        return switch(
            _end_attempt(job, "terminated", now),
            Phase.TERMINATED,
            SecondaryPhase.TERMINATED,
            reason=job.reason,
            now=now,
        )
    if job.phase not in ATTEMPT_ACTIVE:
        return job, []
    if event.reason == "completed":
        if all_exited and all(
            t.reason == "completed" and t.exit_code == 0 and t.started_at for t in job.tasks.values()
        ):
            return switch(
                _end_attempt(job, "completed", now),
                Phase.COMPLETED,
                SecondaryPhase.COMPLETED,
                reason="all tasks exited 0",
                now=now,
            )
        return job, []
    if event.reason == "oom":
        cause: RequeueCause = "oom_gpu" if event.oom == "gpu" else "oom_host"
        return requeue(job, cause=cause, detail=f"out of {event.oom} memory on {event.node_id}", now=now)
    if event.reason == "terminated":
        if job.stop_cause:
            return requeue(job, cause=job.stop_cause, detail=f"snapshot taken on {event.node_id}", now=now)
        return requeue(job, cause="stopped", detail=f"task on {event.node_id} was stopped by its agent", now=now)
    message = event.message or f"worker-{event.rank} exited with code {event.exit_code}"
    job = _end_attempt(job, "failed", now)
    stops = stop_all(job, reason="peer failed", now=now)
    secondary = SecondaryPhase.CREATE_FAILED if event.reason == "start_failed" else SecondaryPhase.FAILED
    job, events = switch(job, Phase.FAILED, secondary, reason=message, now=now)
    return job, events + stops


def expire(job: JobState, *, now: datetime) -> Outcome:
    """A job running longer than its max_duration_s is terminated (BML's max_duration)."""
    if job.phase != Phase.RUNNING or job.deadline is None or now <= job.deadline:
        return job, []
    return terminate(
        job,
        requested_by=f"trainmaster: max_duration_s of {job.max_duration_s}s exceeded",
        now=now,
        reason=f"ran past its max_duration_s ({job.max_duration_s}s)",
    )


def terminate(job: JobState, *, requested_by: str, now: datetime, reason: str | None = None) -> Outcome:
    """Stop the current attempt's tasks, the job Terminated once they have. A job whose every task already said
    it completed (`completing`) has nothing left to stop: it ends as they said, Completed once their starts are
    heard (or Failed at `exit_due` without them), whichever of the termination and a late start is read first."""
    if job.phase.is_finished() or job.phase == Phase.TERMINATING or completing(job):
        return job, []
    reason = reason or f"terminated by {requested_by}"
    if job.phase in (Phase.CREATING, Phase.ABNORMAL) or not job.assignments:
        return switch(job, Phase.TERMINATED, SecondaryPhase.TERMINATED, reason=reason, now=now)
    job, events = switch(job, Phase.TERMINATING, SecondaryPhase.TERMINATING, reason=reason, now=now)
    job = job.model_copy(update={"stop_asked_at": now})
    return job, events + stop_all(job, reason="terminated", now=now)


def completing(job: JobState) -> bool:
    """Whether every task of the current attempt said it completed: its exit applied, or kept for its start."""
    return bool(job.tasks) and all(
        t.early_exit is not None or (t.state == "exited" and t.reason == "completed") for t in job.tasks.values()
    )


def node_lost(job: JobState, node_id: str, *, now: datetime, cause: str) -> Outcome:
    """A node carrying this job's current attempt is gone (silent, or its agent restarted)."""
    if node_id not in job.node_ids or job.phase not in ATTEMPT_ACTIVE:
        return job, []
    if job.phase == Phase.TERMINATING:
        return switch(
            _end_attempt(job, "terminated", now),
            Phase.TERMINATED,
            SecondaryPhase.TERMINATED,
            reason=f"{job.reason}; {cause}",
            now=now,
        )
    return requeue(job, cause="node_lost", detail=cause, now=now, lost=(node_id,))


def requeue(job: JobState, *, cause: RequeueCause, detail: str, now: datetime, lost: tuple[str, ...] = ()) -> Outcome:
    """Stop the surviving ranks and put the job back in the queue for a new attempt (via Abnormal[Lost] when
    its node is gone, naming the nodes `lost`: placement avoids those, not the attempt's others); the next attempt
    resumes from the last checkpoint."""
    stops = stop_all(job, reason="requeued", now=now)
    job = _end_attempt(job, "oom" if cause.startswith("oom") else cause, now)
    events: list[Message] = []
    if cause == "node_lost":  # its status names the nodes found gone (the job keeps no such field: it moves on)
        job, events = switch(job, Phase.ABNORMAL, SecondaryPhase.LOST, reason=detail, now=now)
        events = [
            e.model_copy(update={"lost_node_ids": lost}) if isinstance(e, JobStatusChanged) else e for e in events
        ]
    job = job.model_copy(
        update={
            "assignments": (),
            "tasks": {},
            "requeue_cause": cause,
            "stop_cause": None,
            "stop_asked_at": None,
        }
    )
    job, queued = switch(job, Phase.PENDING, SecondaryPhase.QUEUING, reason=f"requeued: {detail}", now=now)
    requeues = sum(1 for a in job.attempts if a.outcome in ("node_lost", "stopped"))
    if requeues == REPEATED_FAILURES and cause in ("node_lost", "stopped"):  # out-of-memory escalates instead
        queued.append(
            notify(
                job,
                "repeated_failures",
                f"attempt {job.attempt} ended abnormally ({detail}); {requeues} attempts have now failed",
                now=now,
            )
        )
    return job, events + stops + queued


def migrate(job: JobState, *, cause: RequeueCause, attempt: int | None, now: datetime) -> Outcome:
    """Ask every rank to save and exit (SIGTERM); the job is re-placed when they have."""
    if job.phase != Phase.RUNNING or job.stop_cause or (attempt is not None and attempt != job.attempt):
        return job, []
    job = job.model_copy(update={"stop_cause": cause, "stop_asked_at": now})
    job, events = switch(
        job, Phase.RUNNING, SecondaryPhase.RUNNING, reason=f"taking a snapshot to move ({cause})", now=now
    )
    return job, events + stop_all(job, reason=cause, now=now)


def unplaceable(job: JobState, *, reason: str, now: datetime) -> Outcome:
    """Placement found no node that could ever host the job: it fails, and its owner hears why."""
    if job.phase != Phase.PENDING:
        return job, []
    job, events = switch(job, Phase.FAILED, SecondaryPhase.FAILED, reason=reason, now=now)
    kind = "oom_unplaceable" if (job.requeue_cause or "").startswith("oom") else "repeated_failures"
    return job, events + [notify(job, kind, reason, now=now)]


def notify(job: JobState, kind: str, message: str, *, now: datetime) -> Notification:
    return Notification(
        event_id=f"{job.job_id}:notify:{kind}:{job.version}",
        occurred_at=now,
        project_id=job.project_id,
        job_id=job.job_id,
        user_name=job.user_name,
        kind=kind,
        message=message,
    )


def _note_start(job: JobState, attempt: int, started_at: datetime) -> JobState:
    """A superseded attempt that started anyway is on record (it ran, and was billed) until it is stopped."""
    attempts = tuple(
        a.model_copy(update={"started_at": started_at}) if a.attempt == attempt and not a.started_at else a
        for a in job.attempts
    )
    return job.model_copy(update={"attempts": attempts})


def _with_task(job: JobState, rank: int, task: TaskRecord) -> JobState:
    return job.model_copy(update={"tasks": {**job.tasks, str(rank): task}})


def _end_attempt(job: JobState, outcome: str, now: datetime) -> JobState:
    attempts = tuple(
        a.model_copy(update={"ended_at": now, "outcome": outcome}) if a.attempt == job.attempt and not a.ended_at else a
        for a in job.attempts
    )
    return job.model_copy(update={"attempts": attempts})
