"""Hung jobs in the monitor: suspected, back to life, restarted from the checkpoint, failed after the streak."""

from datetime import timedelta

from shared.events import TaskHung, TaskResumed
from services.monitor import state
from services.monitor.hangs import restart_hung, task_hung, task_resumed
from tests.factories import T0, exited, placed, started, submitted

GRACE = 60


def hung(
    job_id: str = "j",
    *,
    attempt: int = 1,
    rank: int = 0,
    node_id: str = "n1",
    spell: int = 1,
    progressed: bool = False,
    gpus: bool = False,
) -> TaskHung:
    return TaskHung(
        event_id=f"{job_id}:{attempt}:{rank}:hung:{spell}",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        spell=spell,
        idle_s=30,
        gpus_watched=gpus,
        progressed=progressed,
    )


def resumed(job_id: str = "j", *, attempt: int = 1, rank: int = 0, node_id: str = "n1", spell: int = 1) -> TaskResumed:
    return TaskResumed(
        event_id=f"{job_id}:{attempt}:{rank}:resumed:{spell}",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        spell=spell,
        idle_s=42,
    )


def running(*, nodes: tuple[str, ...] = ("n1",), attempt: int = 1, job=None, **spec) -> state.JobState:
    if job is None:
        job, _ = state.submitted(submitted(job_id="j", **spec), now=T0)
    job, _ = state.placed(job, placed("j", attempt=attempt, nodes=nodes), now=T0)
    for rank, node_id in enumerate(nodes):
        job, _ = state.task_started(job, started("j", attempt=attempt, rank=rank, node_id=node_id), now=T0)
    assert job.phase == "Running"
    return job


def restarted(job: state.JobState, *, progressed: bool = False) -> tuple[state.JobState, list]:
    """Hung, grace over, snapshot taken (the task exits on SIGTERM), back in the queue."""
    job, _ = task_hung(job, hung(attempt=job.attempt, progressed=progressed), now=T0)
    job, stops = restart_hung(job, grace_s=GRACE, now=T0 + timedelta(seconds=GRACE))
    if job.phase == "Failed":
        return job, stops
    job, _ = state.task_exited(job, exited("j", attempt=job.attempt, code=143, reason="terminated"), now=T0)
    return job, stops


def test_a_quiet_job_is_suspected_hung_and_its_owner_told():
    job, messages = task_hung(running(), hung(gpus=True), now=T0)
    assert (job.phase, job.secondary_phase) == ("Running", "Hanging")
    assert "no output, metric point or progress mark for 30s and its GPUs stayed idle" in job.reason
    status, notice = messages
    assert status.secondary_phase == "Hanging" and notice.kind == "hung" and notice.project_id == "p"
    assert task_hung(job, hung(gpus=True), now=T0) == (job, [])  # the same report again


def test_it_comes_back_to_running_when_it_shows_life_within_the_grace():
    job, _ = task_hung(running(), hung(), now=T0)
    job, messages = task_resumed(job, resumed(), now=T0 + timedelta(seconds=10))
    assert (job.phase, job.secondary_phase, job.hung_since) == ("Running", "Running", None)
    assert "signs of life again after 42s" in job.reason and len(messages) == 1
    assert restart_hung(job, grace_s=GRACE, now=T0 + timedelta(seconds=GRACE * 2)) == (job, [])


def test_after_the_grace_it_is_snapshotted_and_requeued_with_cause_hung():
    job, _ = task_hung(running(), hung(), now=T0)
    assert restart_hung(job, grace_s=GRACE, now=T0 + timedelta(seconds=GRACE - 1)) == (job, [])
    job, messages = restart_hung(job, grace_s=GRACE, now=T0 + timedelta(seconds=GRACE))
    stop = messages[-1]
    assert (stop.type, stop.reason, stop.node_id, stop.grace_s) == ("StopTask", "hung", "n1", 10)
    assert job.stop_cause == "hung" and "restart 1 of at most 3" in job.reason
    job, messages = state.task_exited(job, exited("j", code=143, reason="terminated"), now=T0)
    assert (job.phase, job.secondary_phase, job.requeue_cause) == ("Pending", "Queuing", "hung")
    assert messages[-1].requeue_cause == "hung"
    job = running(job=job, attempt=2)
    assert [(a.reason, a.outcome) for a in job.attempts] == [("started", "hung"), ("hung", "")]


def test_it_fails_after_its_restarts_in_a_row_without_progress():
    job = running(hang_restarts=2)
    for attempt in (2, 3):
        job, _ = restarted(job)
        job = running(job=job, attempt=attempt)
    job, messages = restarted(job)
    assert (job.phase, job.secondary_phase) == ("Failed", "Failed")
    assert job.reason.startswith("hung: no output") and "after 2 restarts" in job.reason
    assert [a.outcome for a in job.attempts] == ["hung", "hung", "hung"]
    assert [m.kind for m in messages if m.type == "Notification"] == ["hung_failed"]
    assert [m.reason for m in messages if m.type == "StopTask"] == ["hung"]


def test_an_attempt_that_saved_a_checkpoint_resets_the_streak():
    job = running(hang_restarts=1)
    job, _ = restarted(job)
    job = running(job=job, attempt=2)
    job, _ = restarted(job, progressed=True)  # it moved on before hanging again: restarted, not failed
    assert (job.phase, job.hung_streak) == ("Pending", 1)
    job = running(job=job, attempt=3)
    job, _ = restarted(job)
    assert job.phase == "Failed"


def test_no_restarts_allowed_fails_at_the_first_hang():
    job, _ = restarted(running(hang_restarts=0))
    assert job.phase == "Failed" and "after 0 restarts" in job.reason


def test_a_distributed_job_is_suspected_only_when_every_rank_is_quiet():
    job = running(nodes=("n1", "n2"))
    job, messages = task_hung(job, hung(rank=1, node_id="n2"), now=T0)
    assert job.secondary_phase == "Running" and messages == [] and job.hung_ranks == (1,)
    job, messages = task_resumed(job, resumed(rank=1), now=T0)
    assert job.hung_ranks == () and messages == []
    job, _ = task_hung(job, hung(rank=1, node_id="n2", spell=2), now=T0)
    job, messages = task_hung(job, hung(rank=0), now=T0)
    assert job.secondary_phase == "Hanging" and len(messages) == 2


def test_reports_of_another_attempt_or_a_job_not_running_change_nothing():
    job = running()
    assert task_hung(job, hung(attempt=2), now=T0) == (job, [])
    assert task_resumed(job, resumed(), now=T0) == (job, [])  # never reported hung
    pending, _ = state.submitted(submitted(job_id="j"), now=T0)
    assert task_hung(pending, hung(), now=T0) == (pending, [])
    migrating, _ = state.migrate(job, cause="migrated", attempt=None, now=T0)
    suspected, _ = task_hung(migrating, hung(), now=T0)
    assert suspected.secondary_phase == "Running"  # already being moved: no hang on top
    terminating, _ = state.terminate(job, requested_by="alice", now=T0)
    assert task_hung(terminating, hung(), now=T0) == (terminating, [])


def test_a_user_migration_during_the_grace_wins_over_the_restart():
    job, _ = task_hung(running(), hung(), now=T0)
    job, _ = state.migrate(job, cause="migrated", attempt=None, now=T0)
    assert restart_hung(job, grace_s=0, now=T0 + timedelta(hours=1)) == (job, [])
    job, _ = state.task_exited(job, exited("j", code=143, reason="terminated"), now=T0)
    assert job.requeue_cause == "migrated" and job.attempts[0].outcome == "migrated"


def test_only_the_placed_node_speaks_for_a_hang():
    job = running()
    assert state.from_placed_node(job, hung())
    assert not state.from_placed_node(job, hung(node_id="n9"))
    assert state.foreign_task(job, hung(node_id="n9"), now=T0) == (job, [])
