"""The monitor's job state machine: each event's effect, fencing, and refusals."""

from datetime import timedelta

import pytest

from shared.events import JobStatusChanged, StartTask, StopTask
from shared.jobs import IllegalTransition, Phase, SecondaryPhase, check_transition
from services.monitor import state
from tests.factories import T0, exited, placed, started, submitted


def statuses(events):
    return [(e.phase, e.secondary_phase) for e in events if isinstance(e, JobStatusChanged)]


def stops(events):
    return [e for e in events if isinstance(e, StopTask)]


def starts(events):
    return [e for e in events if isinstance(e, StartTask)]


def running_job(*, nodes=("n1",)):
    job, _ = state.submitted(submitted(job_id="j", node_count=len(nodes)), now=T0)
    job, _ = state.placed(job, placed("j", nodes=nodes), now=T0)
    for rank, node in enumerate(nodes):
        job, _ = state.task_started(job, started("j", rank=rank, node_id=node), now=T0)
    return job


def test_a_submitted_job_is_queued_with_version_one():
    job, events = state.submitted(submitted(job_id="j"), now=T0)
    assert (job.phase, job.version) == (Phase.PENDING, 1)
    assert statuses(events) == [(Phase.PENDING, SecondaryPhase.QUEUING)]
    assert events[0].event_id == "j:status:1"


def test_pending_running_completed():
    job = running_job()
    assert job.phase == Phase.RUNNING and job.start_time == T0
    job, events = state.task_exited(job, exited("j", at=T0 + timedelta(seconds=5)), now=T0)
    assert statuses(events) == [(Phase.COMPLETED, SecondaryPhase.COMPLETED)]
    assert job.end_time == T0 and job.attempts[0].outcome == "completed"


def test_exit_code_is_kept_in_task_statuses_of_a_failed_job():
    job, events = state.task_exited(running_job(), exited("j", code=3, reason="failed"), now=T0)
    assert job.phase == Phase.FAILED
    assert events[0].task_statuses[0].exit_code == 3


def test_the_same_event_twice_changes_nothing_the_second_time():
    job = running_job()
    again, events = state.task_started(job, started("j"), now=T0)
    assert again == job and events == []
    done, _ = state.task_exited(job, exited("j"), now=T0)
    assert state.task_exited(done, exited("j"), now=T0) == (done, [])


def test_a_multi_node_job_runs_only_when_every_rank_started():
    job, _ = state.submitted(submitted(job_id="j", node_count=2), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("a", "b")), now=T0)
    job, events = state.task_started(job, started("j", rank=0, node_id="a"), now=T0)
    assert job.phase == Phase.PENDING and events == []
    job, events = state.task_started(job, started("j", rank=1, node_id="b"), now=T0)
    assert job.phase == Phase.RUNNING


def test_a_failed_rank_fails_the_job_and_stops_the_others():
    job = running_job(nodes=("a", "b"))
    job, events = state.task_exited(job, exited("j", rank=1, node_id="b", code=1, reason="failed"), now=T0)
    assert job.phase == Phase.FAILED
    assert [(s.node_id, s.rank) for s in stops(events)] == [("a", 0)]


def test_terminate_a_running_job_goes_through_terminating():
    job, events = state.terminate(running_job(), requested_by="bob", now=T0)
    assert statuses(events) == [(Phase.TERMINATING, SecondaryPhase.TERMINATING)]
    assert [s.node_id for s in stops(events)] == ["n1"]
    job, events = state.task_exited(job, exited("j", code=None, reason="terminated"), now=T0)
    assert statuses(events) == [(Phase.TERMINATED, SecondaryPhase.TERMINATED)]
    assert "bob" in job.reason


def test_terminate_a_queued_job_ends_it_at_once():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, events = state.terminate(job, requested_by="bob", now=T0)
    assert job.phase == Phase.TERMINATED and stops(events) == []


def test_terminate_a_finished_job_is_a_no_op():
    done, _ = state.task_exited(running_job(), exited("j"), now=T0)
    assert state.terminate(done, requested_by="bob", now=T0) == (done, [])


def test_an_accepted_placement_starts_every_rank_in_the_same_change():
    job, _ = state.submitted(submitted(job_id="j", node_count=2), now=T0)
    job, events = state.placed(job, placed("j", nodes=("a", "b"), command="python train.py"), now=T0)
    assert statuses(events) == [(Phase.PENDING, SecondaryPhase.SCHEDULED)]
    commands = starts(events)
    assert [(c.node_id, c.rank, c.world_size, c.attempt, c.event_id) for c in commands] == [
        ("a", 0, 2, 1, "j:1:0:start"),
        ("b", 1, 2, 1, "j:1:1:start"),
    ]
    assert {c.algorithm.command for c in commands} == {"python train.py"}
    assert {(c.project_id, c.user_name) for c in commands} == {("p", "alice")}  # the job's own, as submitted


def test_a_placement_arriving_after_termination_starts_nothing():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.terminate(job, requested_by="bob", now=T0)
    same, events = state.placed(job, placed("j", nodes=("n7",)), now=T0)
    assert same == job and events == []


def test_a_second_placement_of_a_placed_job_starts_nothing():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1",)), now=T0)
    same, events = state.placed(job, placed("j", attempt=2, nodes=("n2",)), now=T0)
    assert same == job and events == []


def test_a_lost_node_makes_the_job_abnormal_then_requeues_it():
    job, events = state.node_lost(running_job(), "n1", now=T0, cause="node n1 lost")
    assert statuses(events) == [(Phase.ABNORMAL, SecondaryPhase.LOST), (Phase.PENDING, SecondaryPhase.QUEUING)]
    assert job.assignments == () and job.tasks == {} and job.attempt == 1
    assert job.attempts[0].outcome == "node_lost"


def test_a_lost_node_of_a_multi_node_attempt_is_named_while_abnormal_and_forgotten_once_queued():
    """Placement avoids the node found gone, not the attempt's others, which were alive."""
    job, events = state.node_lost(running_job(nodes=("n1", "n2")), "n2", now=T0, cause="node n2 lost")
    abnormal, queued = [e for e in events if isinstance(e, JobStatusChanged)]
    assert (abnormal.phase, abnormal.lost_node_ids) == (Phase.ABNORMAL, ("n2",))
    assert (queued.phase, queued.lost_node_ids) == (Phase.PENDING, ())
    assert "lost_node_ids" not in job.model_dump()  # the job keeps no such field: its Abnormal status names them
    fresh, _ = state.submitted(submitted(job_id="j", node_count=2), now=T0)
    _, events = state.placed(fresh, placed("j", nodes=("n1", "n2")), now=T0, gone={"n1"})  # lost before it started
    abnormal = next(e for e in events if isinstance(e, JobStatusChanged) and e.phase == Phase.ABNORMAL)
    assert abnormal.lost_node_ids == ("n1",)


def test_a_task_of_an_old_attempt_is_fenced():
    job, _ = state.node_lost(running_job(), "n1", now=T0, cause="lost")
    job, _ = state.placed(job, placed("j", attempt=2, nodes=("n2",)), now=T0)
    same, events = state.task_started(job, started("j", attempt=1, node_id="n1"), now=T0)
    assert same == job
    assert [(s.attempt, s.node_id, s.reason) for s in stops(events)] == [(1, "n1", "fenced")]
    assert state.task_exited(job, exited("j", attempt=1, node_id="n1"), now=T0) == (job, [])


def test_an_old_attempt_that_starts_after_the_job_finished_is_fenced_and_shown():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1",)), now=T0)
    job, _ = state.node_lost(job, "n1", now=T0, cause="lost")  # before attempt 1 started there
    job, _ = state.placed(job, placed("j", attempt=2, nodes=("n2",)), now=T0)
    job, _ = state.task_started(job, started("j", attempt=2, node_id="n2"), now=T0)
    job, _ = state.task_exited(job, exited("j", attempt=2, node_id="n2"), now=T0)
    assert job.phase == Phase.COMPLETED
    late = T0 + timedelta(seconds=5)
    noted, events = state.task_started(job, started("j", attempt=1, node_id="n1", at=late), now=late)
    assert [(s.attempt, s.node_id, s.reason) for s in stops(events)] == [(1, "n1", "fenced")]
    [status] = [e for e in events if isinstance(e, JobStatusChanged)]  # it ran, and was billed: the API shows it
    assert (status.phase, status.version) == (Phase.COMPLETED, job.version + 1)
    assert status.attempts[0].started_at == late and noted.end_time == job.end_time
    assert state.task_started(noted, started("j", attempt=1, node_id="n1", at=late), now=late)[0] == noted


def test_losing_an_unrelated_node_changes_nothing():
    job = running_job()
    assert state.node_lost(job, "other", now=T0, cause="x") == (job, [])


@pytest.mark.parametrize(
    "current,target",
    [
        (Phase.COMPLETED, Phase.RUNNING),
        (Phase.PENDING, Phase.COMPLETED),
        (Phase.TERMINATED, Phase.PENDING),
        (Phase.CREATING, Phase.RUNNING),
    ],
)
def test_illegal_transitions_are_refused(current, target):
    with pytest.raises(IllegalTransition):
        check_transition(current, target)


def test_switch_refuses_an_illegal_change():
    done, _ = state.task_exited(running_job(), exited("j"), now=T0)
    with pytest.raises(IllegalTransition):
        state.switch(done, Phase.RUNNING, SecondaryPhase.RUNNING, reason="x", now=T0)


def test_a_job_past_its_max_duration_is_terminated_with_the_reason():
    job, _ = state.submitted(submitted(job_id="j", max_duration_s=60), now=T0)
    job, _ = state.placed(job, placed("j"), now=T0)
    job, _ = state.task_started(job, started("j", at=T0), now=T0)
    assert state.expire(job, now=T0 + timedelta(seconds=59)) == (job, [])
    job, events = state.expire(job, now=T0 + timedelta(seconds=61))
    assert job.phase == Phase.TERMINATING and "max_duration_s (60s)" in job.reason
    assert [s.reason for s in stops(events)] == ["terminated"]
    job, _ = state.task_exited(job, exited("j", code=None, reason="terminated"), now=T0)
    assert job.phase == Phase.TERMINATED and "max_duration_s" in job.reason


def test_a_termination_asked_once_every_task_said_it_completed_leaves_the_job_to_end_completed():
    """A task's "completed" exit was kept for its late start, and a termination asked meanwhile stopped the task once
    its start was heard and made the kept exit end the job Terminated, though it had completed before anyone asked
    (the outcome hung on which of the termination and the start was read first). A job whose every task said it
    completed has nothing left to stop: the termination changes nothing and the job ends Completed with its start,
    in either order, or Failed at exit_due without it; a requeue drops what was kept with the attempt."""
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j"), now=T0)
    kept, events = state.task_exited(job, exited("j"), now=T0)
    assert events == [] and kept.exits_due == T0 + timedelta(seconds=state.START_WAIT_S)
    assert state.terminate(kept, requested_by="alice", now=T0) == (kept, [])
    job, events = state.task_started(kept, started("j"), now=T0 + timedelta(seconds=3))
    assert stops(events) == [] and statuses(events)[-1] == (Phase.COMPLETED, SecondaryPhase.COMPLETED)
    assert state.terminate(job, requested_by="alice", now=T0) == (job, []) and job.exits_due is None

    job, events = state.exits_unstarted(kept, now=T0 + timedelta(seconds=state.START_WAIT_S))
    assert statuses(events) == [(Phase.FAILED, SecondaryPhase.FAILED)] and "without having started" in job.reason


def test_a_termination_stops_the_tasks_still_running_and_no_task_whose_exit_waits_for_its_late_start():
    """Rank 1 said it completed before its start was heard; rank 0 runs: the termination stops the job, rank 1's
    late start brings no stop (its node said it is gone) and its kept exit, and the job ends Terminated."""
    job, _ = state.submitted(submitted(job_id="j", node_count=2), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1", "n2")), now=T0)
    job, _ = state.task_started(job, started("j"), now=T0)
    job, _ = state.task_exited(job, exited("j", rank=1, node_id="n2"), now=T0)
    job, events = state.terminate(job, requested_by="alice", now=T0)
    assert statuses(events) == [(Phase.TERMINATING, SecondaryPhase.TERMINATING)]
    job, events = state.task_started(job, started("j", rank=1, node_id="n2"), now=T0 + timedelta(seconds=3))
    assert events == [] and job.tasks["1"].state == "exited" and job.exits_due is None
    job, events = state.task_exited(job, exited("j", code=None, reason="terminated"), now=T0 + timedelta(seconds=4))
    assert statuses(events) == [(Phase.TERMINATED, SecondaryPhase.TERMINATED)]


def test_an_exit_kept_for_its_start_leaves_with_a_requeue():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j"), now=T0)
    job, _ = state.task_exited(job, exited("j"), now=T0)
    job, _ = state.requeue(job, cause="stopped", detail="test", now=T0)
    assert job.exits_due is None and state.exits_unstarted(job, now=T0 + timedelta(hours=1)) == (job, [])


def test_a_stop_no_exit_answers_ends_the_job_terminated_at_its_due():
    """A node that keeps heartbeating and never reports the exit of a task asked to stop: the job is Terminated
    its grace and STOP_WAIT_S after the stop (before, it stayed Terminating, and billed, for good)."""
    job, _ = state.terminate(running_job(nodes=("n1", "n2")), requested_by="bob", now=T0)
    due = T0 + timedelta(seconds=job.grace_s + state.STOP_WAIT_S)
    assert job.stop_due == due
    job, events = state.task_exited(job, exited("j", rank=1, node_id="n2", code=None, reason="terminated"), now=T0)
    assert job.phase == Phase.TERMINATING and job.stop_due == due  # one rank answered, the other never does
    assert state.stops_unheard(job, now=due - timedelta(seconds=1)) == (job, [])
    ended, events = state.stops_unheard(job, now=due)
    assert statuses(events) == [(Phase.TERMINATED, SecondaryPhase.TERMINATED)] and ended.stop_due is None
    assert "no exit reported by n1" in ended.tasks["0"].message and ended.attempts[-1].outcome == "terminated"
    late, events = state.task_exited(ended, exited("j", code=None, reason="terminated"), now=due)
    assert (late, events) == (ended, [])  # the node's exit, when it comes: nothing more


def test_a_move_no_exit_answers_is_placed_again_as_the_move_meant():
    job, _ = state.migrate(running_job(), cause="reclaimed", attempt=1, now=T0)
    assert job.stop_due == T0 + timedelta(seconds=job.grace_s + state.STOP_WAIT_S)
    requeued, events = state.stops_unheard(job, now=job.stop_due)
    assert statuses(events) == [(Phase.PENDING, SecondaryPhase.QUEUING)]
    assert (requeued.requeue_cause, requeued.stop_due, requeued.tasks) == ("reclaimed", None, {})


def test_no_stop_pending_is_never_due():
    job = running_job()
    assert job.stop_due is None and state.stops_unheard(job, now=T0 + timedelta(days=1)) == (job, [])
    done, _ = state.task_exited(job, exited("j"), now=T0)
    assert done.phase == Phase.COMPLETED and done.stop_due is None
