"""Fixtures of the service tier: each service's handlers on a TestNatsBroker, its collections in memory."""

from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import stream_of
from shared.events import Notification
from shared.origin import Origins
from shared.store import DocumentStore
from services.billing.handlers import router as billing_router
from services.estimator.handlers import router as estimator_router
from services.estimator.service import Estimator
from services.monitor.handlers import router as monitor_router
from services.monitor.service import Monitor
from services.placement.fleet import Fleet
from services.placement.handlers import router as placement_router
from services.placement.service import Placement
from tests.billing_twin import in_memory
from tests.memory import MemoryCollection

WATCHED = ("tm.job.status.*.*", "tm.node.cmd.n9.stop", "tm.node.cmd.n1.start")


def recorder(into: list):
    async def record(event: dict) -> None:
        into.append(event)

    return record


@asynccontextmanager
async def monitor_on_bus(watched: tuple[str, ...]):
    """The monitor's router on a test broker, and what it publishes on the watched subjects."""
    broker = NatsBroker()
    broker.include_router(monitor_router)
    seen: dict[str, list[dict]] = {subject: [] for subject in watched}
    for subject in watched:
        broker.subscriber(subject, stream=stream_of(subject))(recorder(seen[subject]))

    async with TestNatsBroker(broker) as test_broker:
        monitor = Monitor(
            jobs=DocumentStore(MemoryCollection("jobs"), test_broker),
            nodes=DocumentStore(MemoryCollection("nodes"), test_broker),
            node_timeout_s=10,
            started_at=datetime.now(UTC),
        )
        test_broker.context.set_global("monitor", monitor)
        yield test_broker, monitor, seen


@pytest.fixture
async def monitor_broker():
    async with monitor_on_bus(WATCHED) as bus:
        yield bus


@asynccontextmanager
async def billing_on_bus():
    """Billing on a test broker, and the notifications it publishes for project p."""
    broker = NatsBroker()
    broker.include_router(billing_router)
    sent: list[Notification] = []

    @broker.subscriber("tm.notify.p", stream=stream_of("tm.notify.p"))
    async def record(message: Notification) -> None:
        sent.append(message)

    async with TestNatsBroker(broker) as test_broker:
        service = in_memory(test_broker)
        test_broker.context.set_global("billing", service)
        yield test_broker, service, sent


@pytest.fixture
async def billing():
    async with billing_on_bus() as bus:
        yield bus


class FakeProvider:
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def provision(self, node_id, instance):
        self.calls.append(("provision", node_id))
        return 1

    async def release(self, node_id, handle):
        self.calls.append(("release", node_id))


def placement_service(broker, **kw) -> Placement:
    fleet = Fleet(store=DocumentStore(MemoryCollection("nodes"), broker), provider=FakeProvider())
    return Placement(jobs=DocumentStore(MemoryCollection("jobs"), broker), fleet=fleet, **kw)


@pytest.fixture
async def placement():
    broker = NatsBroker()
    broker.include_router(placement_router)
    placements: list[dict] = []

    async def record(event: dict) -> None:
        placements.append(event)

    broker.subscriber("tm.job.placed", stream=stream_of("tm.job.placed"))(record)
    async with TestNatsBroker(broker) as test_broker:
        service = placement_service(test_broker)
        test_broker.context.set_global("placement", service)
        yield test_broker, service, placements


class Bus:
    def __init__(self) -> None:
        self.published: list = []

    async def publish(self, message, *_, **__) -> None:
        self.published.append(message)


def origins(*, all_read: bool = True) -> Origins:
    async def read() -> bool:
        return all_read

    return Origins(placements=MemoryCollection("placements"), all_read=read)


@pytest.fixture
async def estimator():
    broker = NatsBroker()
    broker.include_router(estimator_router)
    async with TestNatsBroker(broker) as test_broker:
        bus = Bus()
        models = SimpleNamespace(predictor=None, version=None, status=lambda: {})
        service = Estimator(
            broker=bus,
            jobs=DocumentStore(MemoryCollection("jobs"), bus),
            points=MemoryCollection("points"),
            history=MemoryCollection("history"),
            own_runs=MemoryCollection("own_runs"),
            models=models,
            origins=origins(),
        )
        test_broker.context.set_global("estimator", service)
        yield test_broker, service, bus
