"""Billing and placement handlers under TestNatsBroker, with their collections in memory."""
from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.events import NodeRegistered, NodeStateChanged
from shared.rpc import UsageQuery
from shared.store import DocumentStore
from services.billing.handlers import router as billing_router
from services.billing.service import Billing
from services.placement.handlers import router as placement_router
from services.placement.service import Placement
from tests.factories import T0, exited, node, started, submitted
from tests.memory import MemoryCollection


@pytest.fixture
async def billing():
    broker = NatsBroker()
    broker.include_router(billing_router)
    async with TestNatsBroker(broker) as test_broker:
        service = Billing(ledger=MemoryCollection("ledger"), open=MemoryCollection("open"))
        test_broker.context.set_global("billing", service)
        yield test_broker, service


async def test_an_attempt_seen_twice_is_charged_once(billing):
    broker, service = billing
    for event in [started("j", at=T0), started("j", at=T0), exited("j", at=T0 + timedelta(hours=2)),
                  exited("j", at=T0 + timedelta(hours=2)), started("j", at=T0)]:
        await publish(broker, event)
    report = await service.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.total.cost, report.open_attempts) == (1, 2.0, 0)


async def test_a_lost_node_closes_its_attempts_at_the_last_heartbeat(billing):
    broker, service = billing
    await publish(broker, started("j", node_id="n1", at=T0))
    await publish(broker, NodeStateChanged(event_id="n1:lost", node_id="n1", state="lost",
                                           last_seen=T0 + timedelta(minutes=30)))
    report = await service.usage(UsageQuery(project_id="p"))
    assert (report.total.seconds, report.by_node_kind[0].key) == (1800, "local")


@pytest.fixture
async def placement():
    broker = NatsBroker()
    broker.include_router(placement_router)
    starts: list[dict] = []

    async def record(command: dict) -> None:
        starts.append(command)

    broker.subscriber("tm.node.cmd.gpu-box.start", stream=stream_of("tm.node.cmd.x"))(record)
    async with TestNatsBroker(broker) as test_broker:
        service = Placement(jobs=DocumentStore(MemoryCollection("jobs"), test_broker),
                            nodes=DocumentStore(MemoryCollection("nodes"), test_broker))
        test_broker.context.set_global("placement", service)
        yield test_broker, service, starts


async def test_a_job_is_started_on_a_node_that_fits_once_it_registers(placement):
    broker, service, starts = placement
    await publish(broker, submitted(job_id="j", gpu_count=1, min_gpu_memory_gb=40))
    assert await service.schedule_once() == 0
    small = node(node_id="small-box", gpus=4, gpu_memory_gb=16)
    await publish(broker, NodeRegistered(event_id="s", node=small, boot_id="b"))
    assert await service.schedule_once() == 0
    await publish(broker, NodeRegistered(event_id="g", node=node(node_id="gpu-box", gpu_memory_gb=80), boot_id="b"))
    assert await service.schedule_once() == 1
    assert [(s["job_id"], s["attempt"], s["gpu_indices"]) for s in starts] == [("j", 1, [0])]
    assert await service.schedule_once() == 0  # placed once
