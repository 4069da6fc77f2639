"""The monitor takes an agent's word on a task only from the node the task's attempt was placed on."""
from datetime import timedelta

from shared.bus import publish
from shared.events import TaskPreparing
from services.monitor import state
from tests.factories import T0, exited, placed, started, submitted
from tests.service.test_monitor import monitor_broker, versions  # noqa: F401 (the fixture)


def forged(event, node_id: str = "n9"):
    """The same report claimed by another node (its own event id, as a publisher of its own would use)."""
    return event.model_copy(update={"node_id": node_id, "event_id": f"{event.event_id}:{node_id}"})


async def running(broker, job_id: str = "j") -> None:
    for event in [submitted(job_id=job_id), placed(job_id, nodes=("n1",)), started(job_id, node_id="n1")]:
        await publish(broker, event)


async def test_a_forged_exit_from_another_node_leaves_the_job_unchanged(monitor_broker):
    broker, monitor, seen = monitor_broker
    await running(broker)
    before = await monitor.jobs.load("j")
    for report in [exited("j"), exited("j", code=1, reason="failed"), exited("j", code=None, reason="oom"),
                   exited("j", code=None, reason="terminated")]:
        await publish(broker, forged(report))
    after = await monitor.jobs.load("j")
    assert (after["phase"], after["version"], after["tasks"]) == ("Running", before["version"], before["tasks"])
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Running")]
    await publish(broker, exited("j", node_id="n1", at=T0 + timedelta(seconds=5)))  # the placed node is heard
    assert (await monitor.jobs.load("j"))["phase"] == "Completed"


async def test_a_forged_start_or_preparation_from_another_node_changes_nothing_and_is_fenced(monitor_broker):
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), placed("j", nodes=("n1",))]:
        await publish(broker, event)
    before = await monitor.jobs.load("j")
    await publish(broker, TaskPreparing(event_id="j:1:0:preparing:n9", job_id="j", attempt=1, node_id="n9"))
    await publish(broker, forged(started("j")))
    after = await monitor.jobs.load("j")
    assert (after["phase"], after["secondary_phase"], after["version"]) == ("Pending", "Scheduled", before["version"])
    assert after["attempts"][0]["started_at"] is None and after["tasks"]["0"]["state"] == "assigned"
    assert [(s["job_id"], s["attempt"], s["reason"]) for s in seen["tm.node.cmd.n9.stop"]] == [("j", 1, "fenced")]


async def test_task_events_for_a_job_that_does_not_exist_create_nothing(monitor_broker):
    broker, monitor, seen = monitor_broker
    await publish(broker, started("ghost", node_id="n9"))
    await publish(broker, exited("ghost", node_id="n9"))
    assert await monitor.jobs.load("ghost") is None and seen["tm.job.status"] == []


def test_an_earlier_attempts_nodes_still_speak_for_it_and_no_other():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1",)), now=T0)
    job, _ = state.task_started(job, started("j", node_id="n1"), now=T0)
    job, _ = state.requeue(job, cause="node_lost", detail="n1 silent", now=T0)
    job, _ = state.placed(job, placed("j", attempt=2, nodes=("n2",)), now=T0)
    assert state.from_placed_node(job, exited("j", attempt=1, node_id="n1"))
    assert state.from_placed_node(job, started("j", attempt=2, node_id="n2"))
    assert not state.from_placed_node(job, exited("j", attempt=1, node_id="n2"))
    assert not state.from_placed_node(job, exited("j", attempt=2, node_id="n1"))
    assert not state.from_placed_node(job, started("j", attempt=2, rank=1, node_id="n2"))  # no such rank
    assert not state.from_placed_node(job, started("j", attempt=3, node_id="n2"))  # never placed


async def test_a_completed_exit_of_a_task_that_never_started_does_not_complete_the_job(monitor_broker):
    """The placed node says its task completed before ever saying it started: the job does not complete."""
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), placed("j", nodes=("n1",)), exited("j", node_id="n1")]:
        await publish(broker, event)
    job = await monitor.jobs.load("j")
    assert job["phase"] == "Failed" and "without having started" in job["reason"]
    assert "Completed" not in [phase for _, phase in versions(seen)]


def test_the_exit_times_and_codes_a_node_reports_do_not_decide_the_status():
    """A node's year-2100 exit is timed when the monitor heard it; a "completed" exit with code 1 is a failure;
    a two-rank job completes only when both ranks started and exited 0."""
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1", "n2")), now=T0)
    job, _ = state.task_started(job, started("j", node_id="n1", at=T0.replace(year=2000)), now=T0)
    job, _ = state.task_started(job, started("j", rank=1, node_id="n2"), now=T0)
    assert job.phase == "Running" and job.start_time == T0
    later = T0 + timedelta(minutes=5)
    done, _ = state.task_exited(job, exited("j", node_id="n1", at=T0.replace(year=2100)), now=later)
    assert done.phase == "Running" and done.tasks["0"].ended_at == later
    failed, _ = state.task_exited(done, exited("j", rank=1, node_id="n2", code=1), now=later)
    assert failed.phase == "Failed" and "exit code 1" in failed.reason
    completed, _ = state.task_exited(done, exited("j", rank=1, node_id="n2"), now=later)
    assert completed.phase == "Completed" and completed.end_time == later


def test_a_task_that_fails_to_start_still_fails_its_job():
    job, _ = state.submitted(submitted(job_id="j"), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1",)), now=T0)
    job, _ = state.task_exited(job, exited("j", node_id="n1", code=None, reason="start_failed"), now=T0)
    assert (job.phase, job.secondary_phase) == ("Failed", "CreateFailed")
