"""Billing charges an attempt by the placement it stored first: a second placement of the same attempt (placement
sends one attempt once; a copy of another content is a fault or a forgery) changes neither what is charged nor
whose report is believed, in this process or after a restart."""

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from services.billing.handlers import router
from tests.billing_twin import in_memory
from tests.factories import T0, exited, placed, started, submitted
from tests.service.test_billing_lifetimes import deliver
from tests.service.test_billing_trust import HOURS_2, forged


@pytest.fixture
async def billing():
    broker = NatsBroker()
    broker.include_router(router)
    async with TestNatsBroker(broker) as test_broker:
        service = in_memory(test_broker)
        test_broker.context.set_global("billing", service)
        yield test_broker, service


async def test_a_second_placement_of_an_attempt_neither_vouches_for_its_node_nor_sets_its_price(billing):
    """The second placement's insert is refused; billing remembered that delivery's document all the same, so the
    node it named was charged at its price until a restart read the stored one."""
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", nodes=("n1",), price=1.0))
    await publish(broker, forged(placed("j", nodes=("n9",), price=500.0)))
    await deliver(broker, service, started("j", node_id="n9", at=T0), exited("j", node_id="n9", at=HOURS_2))
    assert service.attempts.ledger.docs == {} and service.attempts.running == {}
    await deliver(broker, service, started("j", node_id="n1", at=T0), exited("j", node_id="n1", at=HOURS_2))
    [line] = service.attempts.ledger.docs.values()
    assert (line["node_id"], line["cost"]) == ("n1", 2.0)
