"""The monitor's handlers under TestNatsBroker, with its collections in memory."""

from datetime import UTC, datetime, timedelta

from shared.bus import publish
from shared.events import JobTerminateRequested, NodeTasksLost
from services.monitor import state
from tests.factories import exited, placed, started, submitted


def versions(seen):
    return [(e["version"], e["phase"]) for e in seen["tm.job.status.*.*"]]


async def test_lifecycle_events_drive_the_status_and_each_change_is_published_once(monitor_broker):
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), placed("j"), started("j"), exited("j")]:
        await publish(broker, event)
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Running"), (4, "Completed")]
    doc = await monitor.jobs.load("j")
    assert doc["phase"] == "Completed" and doc["_outbox"] == []


async def test_a_redelivered_event_changes_nothing(monitor_broker):
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), submitted(job_id="j"), placed("j"), placed("j")]:
        await publish(broker, event)
    assert [v for v, _ in versions(seen)] == [1, 2]
    assert (await monitor.jobs.load("j"))["version"] == 2
    assert [s["event_id"] for s in seen["tm.node.cmd.n1.start"]] == ["j:1:0:start"]


async def test_the_monitor_starts_the_ranks_of_a_placement_it_accepts(monitor_broker):
    broker, _, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", command="python train.py"))
    [start] = seen["tm.node.cmd.n1.start"]
    assert (start["job_id"], start["attempt"], start["rank"], start["algorithm"]["command"]) == (
        "j",
        1,
        0,
        "python train.py",
    )


async def test_a_job_terminated_before_its_placement_arrives_is_never_started(monitor_broker):
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await monitor.apply("j", lambda job: state.terminate(job, requested_by="bob", now=datetime.now(UTC)))
    await publish(broker, placed("j"))
    assert seen["tm.node.cmd.n1.start"] == [] and seen["tm.node.cmd.n9.stop"] == []
    assert (await monitor.jobs.load("j"))["phase"] == "Terminated"


async def test_a_task_of_an_unknown_attempt_is_told_to_stop(monitor_broker):
    broker, _, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, started("j", node_id="n9"))
    assert [(s["attempt"], s["reason"]) for s in seen["tm.node.cmd.n9.stop"]] == [(1, "fenced")]


def _restarted(node_id: str, boot_id: str) -> NodeTasksLost:
    return NodeTasksLost(
        event_id=f"{node_id}:{boot_id}:tasks_lost",
        node_id=node_id,
        cause=f"agent on {node_id} restarted",
        started_only=True,
        boot_id=boot_id,
    )


async def test_an_agent_restart_loses_the_tasks_its_earlier_run_started_not_those_it_started_itself(monitor_broker):
    """The restarted agent takes the start commands waiting for it at once: a start it made may be read before the
    monitor's word that the agent restarted, and that task is running (requeueing it ran two attempts at once)."""
    broker, monitor, _ = monitor_broker
    for job_id, boot in (("new", "b2"), ("old", "b1")):
        await publish(broker, submitted(job_id=job_id))
        await publish(broker, placed(job_id))
        await publish(broker, started(job_id).model_copy(update={"boot_id": boot}))

    await publish(broker, _restarted("n1", "b2"))

    new, old = await monitor.jobs.load("new"), await monitor.jobs.load("old")
    assert new["phase"] == "Running" and [a["outcome"] for a in new["attempts"]] == [""]
    assert old["phase"] == "Pending" and old["attempts"][-1]["outcome"] == "node_lost"


async def test_an_exit_heard_before_its_start_is_applied_after_it_in_order_once(monitor_broker):
    """A start delivered to the monitor and lost with a bus server comes again after the ack wait; its exit, read
    first, was sent back to the stream, where a later event of the job overtook it: a termination asked after the
    task completed turned the job Terminated (and an in-memory broker lost the exit). The exit is now kept on its
    task and applied when the start comes, before anything after it; the same exit heard again changes nothing."""
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await publish(broker, exited("j"))  # its start is still on its way
    await publish(broker, exited("j"))  # heard again
    kept = await monitor.jobs.load("j")
    assert kept["phase"] == "Pending" and kept["tasks"]["0"]["state"] == "assigned"
    assert kept["tasks"]["0"]["early_exit"]["reason"] == "completed" and kept["exits_due"] is not None

    await publish(broker, started("j"))  # the start, redelivered
    await publish(broker, JobTerminateRequested(event_id="j:terminate", job_id="j", requested_by="alice"))
    await publish(broker, exited("j"))  # the exit once more, as the stream would redeliver it

    done = await monitor.jobs.load("j")
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Running"), (4, "Completed")]
    assert done["tasks"]["0"]["state"] == "exited" and done["tasks"]["0"]["reason"] == "completed"
    assert done["tasks"]["0"]["early_exit"] is None and done["exits_due"] is None
    assert seen["tm.node.cmd.n1.start"] and not [s for s in seen["tm.job.status.*.*"] if s["phase"] == "Terminating"]


async def test_a_termination_read_before_the_late_start_of_a_task_that_said_it_completed_leaves_it_completed(
    monitor_broker,
):
    """The termination asked while the exit waited for its start stopped the task once it was heard starting, and the
    kept exit then ended the job Terminated: the outcome hung on which of the two was read first. Every task having
    said it completed, nothing is left to stop: the job ends Completed whichever comes first."""
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await publish(broker, exited("j"))  # its start is still on its way
    await publish(broker, JobTerminateRequested(event_id="j:terminate", job_id="j", requested_by="alice"))
    await publish(broker, started("j"))  # the start, redelivered
    done = await monitor.jobs.load("j")
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Running"), (4, "Completed")]
    assert done["tasks"]["0"]["reason"] == "completed" and done["exits_due"] is None


async def test_an_exit_whose_start_never_comes_fails_the_job_once_the_start_could_no_longer_come(monitor_broker):
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="never"))
    await publish(broker, placed("never"))
    await publish(broker, exited("never"))
    heard = datetime.now(UTC)
    await monitor.expire_due(heard + timedelta(seconds=state.START_WAIT_S - 1))
    assert (await monitor.jobs.load("never"))["phase"] == "Pending"

    await monitor.expire_due(heard + timedelta(seconds=state.START_WAIT_S + 1))
    await monitor.expire_due(heard + timedelta(seconds=state.START_WAIT_S + 2))  # nothing more due
    never = await monitor.jobs.load("never")
    assert never["phase"] == "Failed" and "without having started" in never["reason"]
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Failed")] and never["exits_due"] is None


async def test_a_termination_whose_node_never_reports_the_exit_ends_once_its_stop_is_due(monitor_broker):
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="silent"))
    await publish(broker, placed("silent"))
    await publish(broker, started("silent"))
    await publish(broker, JobTerminateRequested(event_id="silent:terminate", job_id="silent", requested_by="alice"))
    asked = datetime.now(UTC)
    due = asked + timedelta(seconds=10 + state.STOP_WAIT_S)  # the job's grace and the wait for its exit
    await monitor.expire_due(due - timedelta(seconds=2))
    assert (await monitor.jobs.load("silent"))["phase"] == "Terminating"
    await monitor.expire_due(due + timedelta(seconds=1))
    await monitor.expire_due(due + timedelta(seconds=2))  # nothing more due
    ended = await monitor.jobs.load("silent")
    assert ended["phase"] == "Terminated" and ended["stop_due"] is None
    assert [v for _, v in versions(seen)][-2:] == ["Terminating", "Terminated"]


async def test_a_termination_asked_before_the_submission_was_read_terminates_the_job_when_it_comes(monitor_broker):
    """The API stores a job, then announces it; a terminate asked in between found no job here, was dropped, and
    the job ran, billed, after the API answered 202 (found by review). Kept, it ends the job at its submission,
    also after a restart of the monitor."""
    from tests.memory import MemoryCollection

    broker, monitor, seen = monitor_broker
    monitor.early = MemoryCollection("early")
    ask = JobTerminateRequested(event_id="j:terminate:1", job_id="j", requested_by="bob")
    await publish(broker, ask)  # before its submission
    assert monitor.early_terminates == {"j": "bob"} and list(monitor.early.docs) == ["j"]
    monitor.early_terminates.clear()
    await monitor.load_early()  # a restarted monitor reads what was kept
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    assert (await monitor.jobs.load("j"))["phase"] == "Terminated"
    assert seen["tm.node.cmd.n1.start"] == [] and monitor.early_terminates == {} and monitor.early.docs == {}
