"""A state change and its events in one write: when the bus is away at the moment of the change (or the process dies
right after it), the events wait in the document's outbox and the relay publishes them, once."""

import asyncio
from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.clock import utcnow
from shared.events import JobStatusChanged
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import ProjectQuotas, QuotasRequest
from shared.store import OUTBOX_COUNT, DocumentStore, relay
from services.estimator.service import Estimator
from tests.factories import placed, started, submitted
from tests.memory import MemoryCollection
from tests.service.test_billing_lifetimes import deliver


class Down:
    """The bus as a process sees it when it is away: every publish fails."""

    async def publish(self, *_, **__) -> None:
        raise ConnectionError("bus away")


async def relay_once(broker, collection) -> None:
    """Let the outbox relay make one pass over the collection."""
    relaying = asyncio.create_task(relay(broker, [collection], interval_s=0.01))
    await asyncio.sleep(0.05)
    relaying.cancel()


async def test_a_budget_alert_raised_while_the_bus_is_away_is_published_by_the_relay_once(billing):  # noqa: F811
    broker, service, sent = billing
    now = utcnow()
    await service.admission.set_quotas(QuotasRequest(project_id="p", project=ProjectQuotas(budget_per_month=1.0)))
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await deliver(broker, service, started("j", at=now - timedelta(minutes=54)))  # $0.90 so far at $1/h
    service.attempts.clock.at(now)
    service.alerts.store.broker = Down()
    with pytest.raises(ConnectionError):
        await service.alerts.check_all()
    assert sent == [] and await service.alerts.store.collection.count_documents({OUTBOX_COUNT: 1}) == 1
    service.alerts.store.broker = broker
    await service.alerts.check_all()  # raised already: not raised again
    assert sent == []
    await relay_once(broker, service.alerts.store.collection)
    await relay_once(broker, service.alerts.store.collection)
    assert [m.event_id.rsplit(":", 1)[-1] for m in sent] == ["80"]
    assert await service.alerts.store.collection.count_documents({OUTBOX_COUNT: 0}) == 1


def finished(job_id: str) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:9",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=9,
        phase=Phase.FAILED,
        secondary_phase=SecondaryPhase.FAILED,
        attempt=1,
    )


async def test_a_job_that_finishes_while_the_bus_is_away_gets_its_final_estimate_from_the_relay_once():
    bus = NatsBroker()
    etas: list[dict] = []

    @bus.subscriber("tm.eta.j", stream=stream_of("tm.eta.j"))
    async def record(message: dict) -> None:
        etas.append(message)

    async with TestNatsBroker(bus) as broker:
        estimator = Estimator(
            broker=broker,
            jobs=DocumentStore(MemoryCollection("jobs"), Down()),
            points=MemoryCollection("points"),
            history=MemoryCollection("history"),
            own_runs=MemoryCollection("own_runs"),
            models=None,
        )
        await estimator.submitted(submitted(job_id="j"))
        estimator.unestimated.pop("j")  # an estimate of it went out: its end clears it
        with pytest.raises(ConnectionError):
            await estimator.status_changed(finished("j"))
        assert (await estimator.jobs.load("j"))["finished"] and etas == []
        estimator.jobs.broker = broker
        await estimator.status_changed(finished("j"))  # the redelivered status finds the job finished already
        assert etas == []
        await relay_once(broker, estimator.jobs.collection)
        await relay_once(broker, estimator.jobs.collection)
    assert [(e["event_id"], e["eta"]) for e in etas] == [("j:eta:final", None)]
