"""Billing and placement handlers under TestNatsBroker, with their collections in memory."""

from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.events import Eta, EtaEstimated, JobDeleted, JobStatusChanged, NodeRegistered, NodeStateChanged
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import UsageQuery
from services.billing.handlers import router as billing_router
from services.placement.handlers import router as placement_router
from tests.billing_twin import in_memory
from tests.factories import T0, exited, node, placed, started, status_changed, submitted
from tests.memory import ReadCounting
from tests.service.conftest import placement_service, recorder
from tests.service.test_billing_lifetimes import deliver


@pytest.fixture
async def billing():
    broker = NatsBroker()
    broker.include_router(billing_router)
    async with TestNatsBroker(broker) as test_broker:
        service = in_memory(test_broker)
        test_broker.context.set_global("billing", service)
        yield test_broker, service


async def test_an_attempt_seen_twice_is_charged_once(billing):
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await deliver(
        broker,
        service,
        placed("j"),
        started("j", at=T0),
        started("j", at=T0),
        exited("j", at=T0 + timedelta(hours=2)),
        exited("j", at=T0 + timedelta(hours=2)),
        started("j", at=T0),
    )
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.total.cost, report.open_attempts) == (1, 2.0, 0)


async def test_a_lost_node_closes_its_attempts_at_the_last_heartbeat(billing):
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await deliver(broker, service, placed("j", nodes=("n1",)), started("j", node_id="n1", at=T0))
    await publish(
        broker, NodeStateChanged(event_id="n1:lost", node_id="n1", state="lost", last_seen=T0 + timedelta(minutes=30))
    )
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.seconds, report.by_node_kind[0].key) == (1800, "local")


async def test_a_job_is_placed_on_a_node_that_fits_once_it_registers(placement):
    broker, service, placements = placement
    await publish(broker, submitted(job_id="j", gpu_count=1, min_gpu_memory_gb=40))
    assert await service.schedule_once() == 0
    small = node(node_id="small-box", gpus=4, gpu_memory_gb=16)
    await publish(broker, NodeRegistered(event_id="s", node=small, boot_id="b"))
    assert await service.schedule_once() == 0
    await publish(broker, NodeRegistered(event_id="g", node=node(node_id="gpu-box", gpu_memory_gb=80), boot_id="b"))
    assert await service.schedule_once() == 1
    assert [
        (p["job_id"], p["attempt"], [(a["node_id"], a["gpu_indices"]) for a in p["assignments"]]) for p in placements
    ] == [("j", 1, [("gpu-box", [0])])]
    assert await service.schedule_once() == 0  # placed once


def running(job_id: str, *, attempt: int = 1, at=T0) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:3",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=3,
        phase=Phase.RUNNING,
        secondary_phase=SecondaryPhase.RUNNING,
        attempt=attempt,
        node_ids=("slow-box",),
        start_time=at,
    )


def estimate(job_id: str, *, remaining_s: float, at) -> EtaEstimated:
    return EtaEstimated(
        event_id=f"{job_id}:eta:{remaining_s}",
        occurred_at=at,
        job_id=job_id,
        eta=Eta(remaining_s=remaining_s, finish_time=at, low_s=remaining_s, high_s=remaining_s, method="rate"),
    )


@pytest.fixture
async def slow_job():
    broker = NatsBroker()
    broker.include_router(placement_router)
    seen: dict[str, list[dict]] = {"tm.job.migrate": [], "tm.notify.p": []}
    for subject, into in seen.items():
        broker.subscriber(subject, stream=stream_of(subject))(recorder(into))
    async with TestNatsBroker(broker) as test_broker:
        service = placement_service(test_broker, slow_factor=1.5)
        test_broker.context.set_global("placement", service)
        await publish(test_broker, submitted(job_id="j", gpu_count=1, expected_duration_s=100))
        await publish(test_broker, NodeRegistered(event_id="s", boot_id="b", node=node(node_id="slow-box", tflops=10)))
        assert await service.schedule_once() == 1
        await publish(test_broker, running("j"))
        yield test_broker, service, seen


async def test_a_job_far_slower_than_expected_moves_to_a_faster_free_node(slow_job):
    broker, service, seen = slow_job
    await publish(broker, NodeRegistered(event_id="f", boot_id="b", node=node(node_id="fast-box", tflops=300)))
    await publish(broker, estimate("j", remaining_s=60, at=T0 + timedelta(seconds=50)))  # 110 s: within 1.5x
    assert seen["tm.job.migrate"] == []
    await publish(broker, estimate("j", remaining_s=200, at=T0 + timedelta(seconds=60)))  # 260 s: too slow
    assert [(m["cause"], m["attempt"]) for m in seen["tm.job.migrate"]] == [("slow", 1)]
    await publish(broker, estimate("j", remaining_s=300, at=T0 + timedelta(seconds=70)))
    assert len(seen["tm.job.migrate"]) == 1  # once per attempt


async def test_a_slow_job_with_nowhere_faster_to_go_notifies_its_owner(slow_job):
    broker, _, seen = slow_job
    await publish(broker, estimate("j", remaining_s=500, at=T0 + timedelta(seconds=60)))
    assert seen["tm.job.migrate"] == []
    assert [n["kind"] for n in seen["tm.notify.p"]] == ["slow_no_faster_option"]


async def test_a_deletion_of_a_job_placement_still_runs_is_ignored(placement):
    broker, service, _ = placement
    await publish(broker, submitted(job_id="j", gpu_count=1))
    await publish(broker, JobDeleted(event_id="j:deleted", job_id="j"))
    assert service.queue["j"].state == "queued" and "j" in service.queued
    await service.status_changed(
        JobStatusChanged(
            event_id="j:status:9",
            job_id="j",
            project_id="p",
            user_name="alice",
            version=9,
            phase=Phase.TERMINATED,
            secondary_phase=SecondaryPhase.TERMINATED,
        )
    )
    await publish(broker, JobDeleted(event_id="j:deleted:2", job_id="j"))
    assert "j" not in service.queue
    assert set(await service.jobs.load("j") or {}) == {"_id", "state", "deleted_t"}  # its id alone, for a while


async def test_an_attempt_reads_neither_its_nodes_record_nor_its_open_line_that_billing_wrote():
    """Billing alone writes both: a task's start finds the node's price, its end the line opened, in memory; what
    it charges is what a read would have given."""
    broker = NatsBroker()
    broker.include_router(billing_router)
    async with TestNatsBroker(broker) as test_broker:
        service = in_memory(test_broker, ledger=ReadCounting("ledger"), node_info=ReadCounting("node_info"))
        test_broker.context.set_global("billing", service)
        await publish(
            test_broker,
            NodeRegistered(event_id="n1:reg", node=node(node_id="n1", price=3.0), occurred_at=T0, boot_id="b"),
        )
        service.lifetimes.records.node_info.reads = 0
        await publish(test_broker, submitted(job_id="j"))
        await deliver(
            test_broker,
            service,
            placed("j", nodes=("n1",)),
            started("j", node_id="n1", at=T0),
            exited("j", node_id="n1", at=T0 + timedelta(hours=2)),
        )
        assert (service.lifetimes.records.node_info.reads, service.attempts.ledger.reads) == (0, 0)
        report = await service.reports.usage(UsageQuery(project_id="p"))
        assert (report.total.attempts, report.open_attempts) == (1, 0) and report.total.cost > 0


async def test_a_submission_is_one_insert_and_a_redelivered_one_of_a_job_done_queues_nothing(placement):
    broker, service, placements = placement
    jobs = ReadCounting("placement_jobs")
    service.jobs.collection = jobs  # the store the queue writes through
    await publish(broker, submitted(job_id="j"))
    assert jobs.reads == 0 and "j" in service.queue
    await publish(broker, NodeRegistered(event_id="g", node=node(node_id="box"), boot_id="b"))
    assert await service.schedule_once() == 1
    await service.store.forget("j", now=T0)  # done and forgotten in memory, its record kept
    await publish(broker, submitted(job_id="j"))
    assert "j" not in service.queue and await service.schedule_once() == 0
    assert [p["job_id"] for p in placements] == ["j"]


async def test_placements_read_no_owner_and_look_for_waiting_events_once_then_only_when_one_was_parked():
    broker = NatsBroker()
    broker.include_router(billing_router)
    async with TestNatsBroker(broker) as test_broker:
        jobs, parked = ReadCounting("jobs"), ReadCounting("parked")
        service = in_memory(test_broker, jobs=jobs, parked=parked)
        test_broker.context.set_global("billing", service)
        for job_id in ("a", "b"):
            await publish(test_broker, submitted(job_id=job_id))
            await deliver(test_broker, service, placed(job_id), started(job_id, at=T0))
        assert (jobs.reads, parked.reads) == (0, 1)
        await publish(test_broker, submitted(job_id="c"))
        await deliver(test_broker, service, started("c", at=T0))  # before its placement: it waits
        await deliver(test_broker, service, placed("c"), exited("c", at=T0 + timedelta(hours=1)))
        report = await service.reports.usage(UsageQuery(project_id="p"))
        assert (report.total.attempts, report.open_attempts) == (3, 2)  # c's start waited, then was charged
        assert not parked.docs


async def test_a_start_reads_no_ledger_where_this_billing_stored_the_placement_and_a_start_sent_again_opens_nothing():
    """No line of an attempt opens before its placement is stored, and this process closes every line of one it
    stored first: whether a line was closed is known without a read. A start sent again after the end (a node's
    word, any number of times) opens nothing; for a billing that did not store the placement, the ledger refuses it
    (the attempt's line has its id: one document per attempt and rank, open or closed)."""
    broker = NatsBroker()
    broker.include_router(billing_router)
    async with TestNatsBroker(broker) as test_broker:
        ledger = ReadCounting("ledger")
        service = in_memory(test_broker, ledger=ledger)
        test_broker.context.set_global("billing", service)
        await publish(test_broker, submitted(job_id="j"))
        await deliver(test_broker, service, placed("j"), started("j", at=T0), exited("j", at=T0 + timedelta(hours=2)))
        again = started("j", at=T0 + timedelta(hours=3)).model_copy(update={"event_id": "j:1:0:started-again"})
        await deliver(test_broker, service, again)
        await deliver(test_broker, service, placed("j"), started("j", at=T0 + timedelta(hours=3)))  # redelivered
        assert ledger.reads == 0
        report = await service.reports.usage(UsageQuery(project_id="p"))
        assert (report.total.attempts, report.total.cost, report.open_attempts) == (1, 2.0, 0)

        ledger.reads = 0  # the report's own
        restarted = in_memory(test_broker, ledger=ledger, attempts=service.attempts.placements.attempts)
        test_broker.context.set_global("billing", restarted)
        await deliver(test_broker, restarted, placed("j"), again)  # its placement was stored before
        assert ledger.reads == 0 and restarted.attempts.running == {}
        report = await restarted.reports.usage(UsageQuery(project_id="p"))
        assert (report.total.attempts, report.open_attempts) == (1, 0)


async def test_a_jobs_planned_end_goes_with_its_attempt_and_its_end(slow_job):
    """The end the estimator gave was kept for good (memory that only grew), and outlived a requeue, planning the
    next attempt by the last one's end (found by review)."""
    broker, service, _ = slow_job
    await publish(broker, estimate("j", remaining_s=60, at=T0 + timedelta(seconds=50)))
    assert "j" in service.inputs.expected_end
    done = status_changed("j", Phase.COMPLETED, SecondaryPhase.COMPLETED, version=4, attempt=1)
    await publish(broker, done)
    assert "j" not in service.inputs.expected_end
