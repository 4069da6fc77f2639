"""A status's subject names its phase, and each reader's consumer is delivered only the statuses it acts on:
checked against the monitor's own state machine, driven through random histories, and each reader's handler."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from faststream.exceptions import RejectMessage
from hypothesis import given, settings, strategies as st

from shared.bus import checked_event, subjects_overlap
from shared.events import (
    ALL_STATUSES,
    ATTEMPT_END_STATUSES,
    FINISHED_STATUSES,
    PLACEMENT_STATUSES,
    JobStatusChanged,
)
from shared.jobs import Phase, SecondaryPhase
from services.billing.placements import SUBMITTED_SAYS, nothing_new, status_said
from services.monitor import hangs, state
from services.placement.service import acts_on
from tests.factories import T0, exited, placed, preparing, started, submitted
from tests.unit.test_monitor_hangs import hung, resumed

NODES = ("a", "b")


def delivered(event: JobStatusChanged, filters: tuple[str, ...]) -> bool:
    return any(subjects_overlap(event.subject, f) for f in filters)


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "place",
                "place_lost",
                "preparing",
                "start",
                "start_stale",
                "complete",
                "fail",
                "oom_gpu",
                "oom_host",
                "stopped",
                "terminate",
                "node_lost",
                "migrate",
                "unplaceable",
                "hung",
                "resumed",
                "restart_hung",
                "expire",
                "exits_unstarted",
            ]
        ),
        st.integers(0, 1),
    ),
    max_size=40,
)


def step(job: state.JobState, action: str, rank: int, now) -> state.Outcome:
    """One event of a job's history, as the monitor applies it."""
    j, attempt = job.job_id, job.attempt
    node = job.tasks[str(rank)].node_id if str(rank) in job.tasks else NODES[rank]
    ref = {"attempt": attempt, "rank": rank, "node_id": node}
    if action in ("place", "place_lost"):
        gone = (NODES[0],) if action == "place_lost" else ()
        return state.placed(job, placed(j, attempt=attempt + 1, nodes=NODES[: job_nodes(job)]), now=now, gone=gone)
    if action == "preparing":
        return state.task_preparing(job, preparing(j, **ref), now=now)
    if action == "start":
        return state.task_started(job, started(j, at=now, **ref), now=now)
    if action == "start_stale":
        return state.task_started(job, started(j, at=now, **{**ref, "attempt": max(1, attempt - 1)}), now=now)
    if action in ("complete", "fail", "stopped", "oom_gpu", "oom_host"):
        reason = {"complete": "completed", "fail": "failed", "stopped": "terminated"}.get(action, "oom")
        event = exited(j, code=0 if action == "complete" else 1, reason=reason, at=now, **ref)
        if reason == "oom":
            event = event.model_copy(update={"oom": action.removeprefix("oom_")})
        return state.task_exited(job, event, now=now)
    if action == "terminate":
        return state.terminate(job, requested_by="bob", now=now)
    if action == "node_lost":
        return state.node_lost(job, node, now=now, cause="silent")
    if action == "migrate":
        return state.migrate(job, cause="migrated", attempt=None, now=now)
    if action == "unplaceable":
        return state.unplaceable(job, reason="no node", now=now)
    if action == "hung":
        return hangs.task_hung(job, hung(j, **ref), now=now)
    if action == "resumed":
        return hangs.task_resumed(job, resumed(j, **ref), now=now)
    if action == "restart_hung":
        return hangs.restart_hung(job, grace_s=0, now=now)
    if action == "expire":
        return state.expire(job, now=now + timedelta(days=30))
    return state.exits_unstarted(job, now=now + timedelta(days=30))


def job_nodes(job: state.JobState) -> int:
    return 2 if job.job_id.endswith("2") else 1


def history(actions: list[tuple[str, int]], *, ranks: int) -> list[JobStatusChanged]:
    """Every status the monitor emits over a job's history, in its order."""
    job, events = state.submitted(submitted(job_id=f"j{ranks}", node_count=ranks, max_duration_s=60), now=T0)
    emitted = list(events)
    for i, (action, rank) in enumerate(actions):
        job, events = step(job, action, min(rank, ranks - 1), T0 + timedelta(seconds=i + 1))
        emitted += events
    return [e for e in emitted if isinstance(e, JobStatusChanged)]


@settings(max_examples=400, deadline=None)
@given(actions=ACTIONS, ranks=st.integers(1, 2))
def test_each_reader_is_delivered_every_status_it_acts_on(actions, ranks):
    """Billing writes a status only when it says something new of how the job's attempts ended (`nothing_new`);
    placement acts on a finished job, a start (Running), a held one (Abnormal) and a requeue (Pending without
    nodes); the estimator on a finished job. Each such status is delivered to that reader's consumer."""
    said = SUBMITTED_SAYS
    for status in history(actions, ranks=ranks):
        assert status.subject == f"tm.job.status.{status.phase}.{status.secondary_phase}"
        assert delivered(status, ALL_STATUSES)
        assert delivered(status, FINISHED_STATUSES) == status.phase.is_finished()
        if acts_on(status):
            assert delivered(status, PLACEMENT_STATUSES), status
        now_said = status_said(status)
        if not nothing_new(now_said, said):
            assert delivered(status, ATTEMPT_END_STATUSES), (status.phase, status.secondary_phase, now_said, said)
        said = now_said


def test_the_statuses_each_reader_is_spared():
    """What the filters save a plain job (queued, scheduled, running, completed): the estimator is delivered one
    status of four, billing two, placement three; the API all."""
    plain = history([("place", 0), ("start", 0), ("complete", 0)], ranks=1)
    assert [(s.phase, s.secondary_phase) for s in plain] == [
        (Phase.PENDING, SecondaryPhase.QUEUING),
        (Phase.PENDING, SecondaryPhase.SCHEDULED),
        (Phase.RUNNING, SecondaryPhase.RUNNING),
        (Phase.COMPLETED, SecondaryPhase.COMPLETED),
    ]
    counts = [
        sum(delivered(s, f) for s in plain)
        for f in (ALL_STATUSES, PLACEMENT_STATUSES, ATTEMPT_END_STATUSES, FINISHED_STATUSES)
    ]
    assert counts == [4, 3, 2, 1]


def test_a_status_an_earlier_monitor_published_is_still_read_and_accepted_where_it_was():
    legacy = JobStatusChanged.legacy_subject
    assert legacy == "tm.job.status"
    for filters in (ALL_STATUSES, PLACEMENT_STATUSES, ATTEMPT_END_STATUSES, FINISHED_STATUSES):
        assert legacy in filters
        # a consumer's filters may not overlap (the server refuses them)
        assert not any(subjects_overlap(a, b) for i, a in enumerate(filters) for b in filters[i + 1 :])


def test_a_status_is_accepted_on_its_own_subject_or_the_legacy_one_and_nowhere_else():
    """A receiver checks an event against the subject its payload implies (`checked_event`): a status of one phase
    on another phase's subject is dropped; the legacy subject is accepted for a status only."""
    done = history([("place", 0), ("start", 0), ("complete", 0)], ranks=1)[-1]

    def on(subject: str, payload: dict):
        return SimpleNamespace(raw_message=SimpleNamespace(subject=subject))

    payload = done.model_dump(mode="json")
    assert checked_event(on("tm.job.status.Completed.Completed", payload), payload) == done
    assert checked_event(on("tm.job.status", payload), payload) == done
    with pytest.raises(RejectMessage):
        checked_event(on("tm.job.status.Running.Running", payload), payload)
    task = exited("j").model_dump(mode="json")
    with pytest.raises(RejectMessage):
        checked_event(on("tm.job.status", task), task)
