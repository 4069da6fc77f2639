"""The monitor takes an agent's word on a task only from the node the task's attempt was placed on."""

from datetime import UTC, datetime, timedelta

from shared.bus import RPC_NODES, publish
from shared.events import NodeProvisioned, NodeRegistered, TaskPreparing
from shared.noderecords import limits_from_entry
from services.monitor import state
from services.monitor.records import NodeRecords
from tests.factories import T0, exited, node, placed, started, submitted
from tests.memory import MemoryCollection
from tests.service.test_monitor import versions


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
    for report in [
        exited("j"),
        exited("j", code=1, reason="failed"),
        exited("j", code=None, reason="oom"),
        exited("j", code=None, reason="terminated"),
    ]:
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
    assert await monitor.jobs.load("ghost") is None and seen["tm.job.status.*.*"] == []


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
    """The placed node says its task completed before ever saying it started: the job does not complete (once the
    exit has waited out a start that could still be redelivered: tests/service/test_monitor.py)."""
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), placed("j", nodes=("n1",))]:
        await publish(broker, event)
    await publish(broker, exited("j", node_id="n1"))
    await monitor.expire_due(datetime.now(UTC) + timedelta(seconds=state.START_WAIT_S + 1))
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


async def test_a_registration_is_stored_as_its_record_allows_and_the_admin_sees_what_was_refused(monitor_broker):
    """Row 5 in the monitor: a static node claiming 8 x A100-80GB, local and free; a rented node doing the same;
    a node no record names. GET /v2/nodes (the monitor's RPC) shows each as its record allows, and the claims."""
    broker, monitor, _ = monitor_broker
    ws = {
        "id": "ws-1",
        "kind": "reserved",
        "price_per_hour": 1.6,
        "cpu_count": 16,
        "memory_gb": 64,
        "gpus": [{"model": "A100-40GB", "memory_gb": 40, "tflops": 312, "count": 1}],
    }
    monitor.records = NodeRecords(static={"ws-1": limits_from_entry(ws)}, rented=MemoryCollection("rented"))
    rented = {
        "id": "od-1",
        "kind": "on_demand",
        "price_per_hour": 1.01,
        "cpu_count": 8,
        "memory_gb": 32,
        "labels": {"instance_type": "a10g.1x", "provisioned_by": "trainmaster"},
        "gpus": [{"model": "A10G", "memory_gb": 24, "tflops": 125, "count": 1}],
    }
    await publish(
        broker,
        NodeProvisioned(
            event_id="od-1:provisioned",
            node_id="od-1",
            instance_type="a10g.1x",
            provider="x",
            price_per_hour=1.01,
            gpu_count=1,
            provisioned_at=T0,
            limits=limits_from_entry(rented),
        ),
    )
    for node_id in ("ws-1", "od-1", "stranger"):
        await publish(
            broker,
            NodeRegistered(
                event_id=f"{node_id}:boot",
                boot_id="b",
                node=node(node_id=node_id, kind="local", gpus=8, gpu_memory_gb=80, tflops=312, price=0.0),
            ),
        )
    answer = await (await broker.request({"offset": 0, "limit": 10}, RPC_NODES)).decode()
    nodes = {n["node_id"]: n for n in answer["items"]}
    offered = {
        k: (n["info"] or {}).get("kind") and (n["info"]["kind"], len(n["info"]["gpus"]), n["info"]["price_per_hour"])
        for k, n in nodes.items()
    }
    assert offered == {"ws-1": ("reserved", 1, 1.6), "od-1": ("on_demand", 1, 1.01), "stranger": None}
    assert nodes["ws-1"]["claims_refused"]["gpus"] == "claimed 8, record 1"
    assert nodes["od-1"]["claims_refused"]["kind"] == "claimed local, record on_demand"
    assert nodes["stranger"]["claims_refused"] == {"node": "no record of this node"}


def test_an_earlier_attempts_node_speaks_only_for_the_rank_placed_on_it():
    job, _ = state.submitted(submitted(job_id="j", node_count=2), now=T0)
    job, _ = state.placed(job, placed("j", nodes=("n1", "n2")), now=T0)
    job, _ = state.requeue(job, cause="node_lost", detail="n2 silent", now=T0)
    job, _ = state.placed(job, placed("j", attempt=2, nodes=("n3", "n4")), now=T0)
    assert state.from_placed_node(job, exited("j", attempt=1, rank=1, node_id="n2"))
    assert not state.from_placed_node(job, exited("j", attempt=1, rank=0, node_id="n2"))  # n2 held rank 1 only
    assert not state.from_placed_node(job, exited("j", attempt=1, rank=5, node_id="n1"))
