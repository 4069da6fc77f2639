"""Billing charges only attempts placement made, as reported by an agent of the node each rank was placed on."""

import time
from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from shared.events import NodeRegistered
from shared.noderecords import limits_from_entry
from shared.rpc import UsageQuery
from services.billing import placements as placements_module
from services.billing.handlers import router
from tests.billing_twin import in_memory
from tests.factories import T0, exited, node, placed, provisioned, started, submitted
from tests.service.conftest import billing_on_bus
from tests.service.test_billing_lifetimes import deliver

HOURS_2 = T0 + timedelta(hours=2)


@pytest.fixture
async def billing():
    broker = NatsBroker()
    broker.include_router(router)
    async with TestNatsBroker(broker) as test_broker:
        service = in_memory(test_broker)
        test_broker.context.set_global("billing", service)
        yield test_broker, service


@pytest.fixture
async def lifetimes_billing():
    """The tier's billing with node lifetimes and notifications (the fixture above is the attempt ledger alone)."""
    async with billing_on_bus() as bus:
        yield bus


def forged(event, **update):
    return event.model_copy(update={"event_id": f"{event.event_id}:forged", **update})


async def test_a_forged_pair_for_a_job_that_never_existed_charges_nothing(billing):
    broker, service = billing
    big = forged(started("ghost", at=T0), price_per_hour=5000.0, node_id="n1")
    await publish(broker, big)
    await publish(broker, forged(exited("ghost", at=HOURS_2)))
    assert service.attempts.ledger.docs == {} and service.attempts.running == {}
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.total.cost, report.open_attempts) == (0, 0.0, 0)


async def test_a_forged_pair_from_a_node_the_attempt_was_not_placed_on_charges_nothing(billing):
    broker, service = billing
    for event in [
        submitted(job_id="j"),
        placed("j", nodes=("n1",)),
        forged(started("j", node_id="n9", at=T0)),
        forged(exited("j", node_id="n9", at=HOURS_2)),
        forged(started("j", rank=1, node_id="n1", at=T0)),
    ]:  # a rank placement never made
        await publish(broker, event)
    attempts = service.attempts
    assert attempts.ledger.docs == {} and attempts.running == {} and attempts.placements.parked.docs == {}


async def test_the_legitimate_flow_is_billed_to_the_submitting_project_and_user(billing):
    broker, service = billing
    claimed = started("j", node_id="n1", at=T0).model_copy(update={"project_id": "other", "user_name": "mallory"})
    await deliver(
        broker,
        service,
        submitted(job_id="j"),
        placed("j", nodes=("n1",)),
        claimed,
        exited("j", node_id="n1", at=HOURS_2),
    )
    [line] = service.attempts.ledger.docs.values()
    assert (line["project_id"], line["user_name"], line["node_id"], line["cost"]) == ("p", "alice", "n1", 2.0)


async def test_task_events_that_come_before_their_placement_wait_for_it(billing):
    broker, service = billing
    await deliver(
        broker, service, submitted(job_id="j"), started("j", node_id="n1", at=T0), exited("j", node_id="n1", at=HOURS_2)
    )
    assert service.attempts.ledger.docs == {} and len(service.attempts.placements.parked.docs) == 2
    await deliver(broker, service, placed("j", nodes=("n1",)))  # later still: each waited from when it was seen
    [line] = service.attempts.ledger.docs.values()
    assert (line["_id"], line["cost"]) == ("j:1:0", 2.0)
    assert service.attempts.running == {} and service.attempts.placements.parked.docs == {}


async def test_waiting_is_bounded_in_number_and_age(billing, monkeypatch):
    broker, service = billing
    monkeypatch.setattr(placements_module, "PARK_MAX", 3)
    for n in range(5):
        await publish(broker, started(f"ghost-{n}", at=T0))
    parked = service.attempts.placements.parked.docs
    assert sorted(d["attempt_key"] for d in parked.values()) == ["ghost-0:1", "ghost-1:1", "ghost-2:1"]
    for doc in parked.values():  # an hour and more without a placement: never placed
        doc["parked_at"] = time.time() - placements_module.PARK_TTL_S - 1
    await publish(broker, started("ghost-9", at=T0))
    assert [d["attempt_key"] for d in parked.values()] == ["ghost-9:1"]
    await publish(broker, placed("ghost-0"))  # too late: what it would have vouched for is gone
    assert service.attempts.ledger.docs == {} and service.attempts.running == {}


async def test_a_placement_is_read_once_and_remembered_for_its_tasks_start_and_end(billing):
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", nodes=("n1",)))
    attempts = service.attempts.placements.attempts
    reads = []
    read = attempts.find_one
    attempts.find_one = lambda query, projection=None: reads.append(query) or read(query, projection)
    await deliver(broker, service, started("j", node_id="n1", at=T0), exited("j", node_id="n1", at=HOURS_2))
    assert len(service.attempts.ledger.docs) == 1 and reads == []  # both checked against the placement as written
    service.attempts.placements.known.clear()  # a restarted billing: read from the database, then remembered
    await publish(broker, started("j", node_id="n9", at=HOURS_2))
    await publish(broker, started("j", node_id="n9", at=HOURS_2 + timedelta(seconds=1)))
    assert len(reads) == 1 and service.attempts.running == {}  # and a node it was not placed on is still refused


async def test_the_placed_nodes_own_times_price_and_gpus_are_not_what_it_is_charged(billing):
    """Row 1: the agent of the very node the job was placed on reports a start in 2000 and an end in 2100, at
    $5,000 an hour on 8 GPUs; billing charges the hour it saw pass, at the price placement recorded."""
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", nodes=("n1",), price=2.0, node_gpus=4))
    service.attempts.clock.at(T0 + timedelta(minutes=5))
    await publish(
        broker,
        forged(
            started("j", node_id="n1", at=T0.replace(year=2000)),
            price_per_hour=5000.0,
            gpu_count=8,
            node_gpu_count=1,
            node_kind="on_demand",
        ),
    )
    service.attempts.clock.at(T0 + timedelta(minutes=65))
    await publish(broker, forged(exited("j", node_id="n1", at=T0.replace(year=2100))))
    [line] = service.attempts.ledger.docs.values()
    assert (line["started_at"], line["ended_at"]) == (T0 + timedelta(minutes=5), T0 + timedelta(minutes=65))
    assert (line["seconds"], line["gpu_count"], line["node_kind"], line["cost"]) == (3600, 1, "local", 0.5)
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.total.cost == 0.5


async def test_a_start_reported_before_the_attempt_was_placed_is_not_charged(billing):
    """A report the bus stored before the placement existed is dropped when the placement comes (it once opened a
    line charged from the placement on); the real start after the placement is charged from its own time."""
    broker, service = billing
    service.attempts.clock.at(T0 - timedelta(days=30))
    await publish(broker, submitted(job_id="j"))
    await publish(broker, forged(started("j", node_id="n1", at=T0 - timedelta(days=30))))
    service.attempts.clock.at(T0)
    await publish(broker, placed("j", nodes=("n1",)))
    assert service.attempts.placements.parked.docs == {} and service.attempts.running == {}
    await deliver(broker, service, started("j", node_id="n1", at=T0 + timedelta(minutes=30)))
    await deliver(broker, service, exited("j", node_id="n1", at=T0 + timedelta(hours=1)))
    [line] = service.attempts.ledger.docs.values()
    assert (line["started_at"], line["cost"]) == (T0 + timedelta(minutes=30), 0.5)


async def test_an_end_parked_before_the_next_attempt_is_placed_does_not_make_that_attempt_free(billing):
    """The agent running attempt 1 reported attempt 2's end before attempt 2 existed: parked, then replayed when
    attempt 2 was placed on its node, it closed attempt 2's line at its start, and the real 3-hour run's start and
    end were ignored: billed $0 and never seen by a budget (found by review)."""
    broker, service = billing
    hour = timedelta(hours=1)
    await deliver(
        broker,
        service,
        submitted(job_id="j"),
        placed("j", nodes=("n1",)),
        started("j", at=T0),
        exited("j", at=T0 + hour, reason="failed", code=1),
    )
    await deliver(broker, service, forged(exited("j", attempt=2, at=T0 + hour)))
    assert len(service.attempts.placements.parked.docs) == 1
    service.attempts.clock.at(T0 + 2 * hour)
    await publish(broker, placed("j", attempt=2, nodes=("n1",)).model_copy(update={"occurred_at": T0 + 2 * hour}))
    await deliver(broker, service, started("j", attempt=2, at=T0 + 2 * hour), exited("j", attempt=2, at=T0 + 5 * hour))
    lines = {k: (d["seconds"], d["cost"]) for k, d in service.attempts.ledger.docs.items()}
    assert lines == {"j:1:0": (3600.0, 1.0), "j:2:0": (3 * 3600.0, 3.0)}
    assert service.attempts.placements.parked.docs == {}


async def test_a_registration_is_charged_as_its_record_says_not_as_it_claims(lifetimes_billing):
    """Row 5 in billing: a static node claiming 8 GPUs at $0, a stranger, and a rented node claiming to be local
    and free: billing keeps the cluster file's figures, ignores the stranger and keeps what it rented."""
    broker, service, _ = lifetimes_billing
    ws = limits_from_entry(
        {
            "id": "ws",
            "kind": "reserved",
            "price_per_hour": 1.5,
            "gpus": [{"model": "A100-40GB", "memory_gb": 40, "tflops": 312, "count": 2}],
        }
    )
    service.lifetimes.records.static = {"ws": ws}
    await publish(
        broker,
        provisioned(),
    )
    for node_id in ("ws", "stranger", "od"):
        await publish(
            broker,
            NodeRegistered(
                event_id=f"{node_id}:boot",
                occurred_at=T0,
                boot_id="b",
                node=node(node_id=node_id, kind="local", gpus=8, gpu_memory_gb=80, price=0.0),
            ),
        )
    infos = {
        d["_id"]: (d["kind"], d["gpu_count"], d["price_per_hour"])
        for d in service.lifetimes.records.node_info.docs.values()
    }
    assert infos == {"ws": ("reserved", 2, 1.5), "od": ("on_demand", 2, 4.0)}
    assert sorted(service.lifetimes.nodes_open.docs) == ["od", "ws"]


async def test_a_second_placement_of_an_attempt_neither_vouches_for_its_node_nor_sets_its_price(billing):
    """Billing charges an attempt by the placement it stored first: a second placement of the same attempt (placement
    sends one attempt once; a copy of another content is a fault or a forgery) changes neither what is charged nor
    whose report is believed. Its insert is refused; billing had remembered that delivery's document all the same,
    so the node it named was charged at its price until a restart read the stored one."""
    broker, service = billing
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", nodes=("n1",), price=1.0))
    await publish(broker, forged(placed("j", nodes=("n9",), price=500.0)))
    await deliver(broker, service, started("j", node_id="n9", at=T0), exited("j", node_id="n9", at=HOURS_2))
    assert service.attempts.ledger.docs == {} and service.attempts.running == {}
    await deliver(broker, service, started("j", node_id="n1", at=T0), exited("j", node_id="n1", at=HOURS_2))
    [line] = service.attempts.ledger.docs.values()
    assert (line["node_id"], line["cost"]) == ("n1", 2.0)


async def test_one_nodes_reports_of_attempts_never_placed_crowd_out_no_other_nodes(billing, monkeypatch):
    broker, service = billing
    monkeypatch.setattr(placements_module, "PARK_PER_NODE", 2)
    for n in range(4):
        await publish(broker, forged(started(f"ghost-{n}", node_id="n9", at=T0)))
    await publish(broker, started("j", node_id="n1", at=T0))  # an honest early report of another node
    parked = service.attempts.placements.parked.docs
    assert sorted(d["attempt_key"] for d in parked.values()) == ["ghost-0:1", "ghost-1:1", "j:1"]


async def test_attempts_whose_events_expired_wait_no_more(billing):
    """Their keys stayed among the attempts waiting for a placement for good: memory that only grew."""
    broker, service = billing
    placements = service.attempts.placements
    await publish(broker, started("ghost", at=T0))
    assert "ghost:1" in await placements._waiting_for()
    for doc in placements.parked.docs.values():
        doc["parked_at"] = time.time() - placements_module.PARK_TTL_S - 1
    await publish(broker, started("other", at=T0))
    assert await placements._waiting_for() == {"other:1"}


async def test_a_placement_stored_by_an_older_version_without_its_time_still_replays_what_waited(billing):
    """Placement records from before the placement's time was kept have none: the check of parked events against
    it raised, and the job's events stopped behind it on every redelivery (found by review)."""
    broker, service = billing
    placements = service.attempts.placements
    await deliver(broker, service, submitted(job_id="j"), started("j", node_id="n1", at=T0))
    old = placements_module.placement_doc(placed("j", nodes=("n1",)), None)
    old.pop("placed_t")
    await placements.attempts.insert_one(old)
    await deliver(broker, service, placed("j", nodes=("n1",)), exited("j", node_id="n1", at=HOURS_2))
    [line] = service.attempts.ledger.docs.values()
    assert line["_id"] == "j:1:0" and placements.parked.docs == {}
