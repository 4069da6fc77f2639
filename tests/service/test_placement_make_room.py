"""Placement under TestNatsBroker: a long job that could rent, on the only owned GPU, is moved to a node rented for
it once jobs that may only run on owned capacity queue behind it (policy/makeroom.py)."""

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.events import NodeRegistered
from shared.rpc import AdmitReply
from services.placement.handlers import router as placement_router
from services.placement.policy import InstanceType
from tests.factories import node, submitted
from tests.service.conftest import placement_service

HOUR = 3600
RENTAL = InstanceType("gpu.1x", 1, "GPU", 24.0, 100.0, 8.0, 32.0, 0.5, 120.0)


@pytest.fixture
async def service():
    broker = NatsBroker()
    broker.include_router(placement_router)
    moves: list[dict] = []

    async def record(event: dict) -> None:
        moves.append(event)

    broker.subscriber("tm.job.migrate", stream=stream_of("tm.job.migrate"))(record)
    async with TestNatsBroker(broker) as test_broker:
        placement = placement_service(test_broker)
        test_broker.context.set_global("placement", placement)
        yield test_broker, placement, moves


async def _long_job_on_the_only_owned_gpu(broker, placement, *, billing_allows: bool) -> None:
    async def admit(query):
        return AdmitReply(allowed=billing_allows, reason="" if billing_allows else "over budget")

    placement.fleet.catalogue = (RENTAL,)
    placement.fleet._admit = admit
    info = node(node_id="owned", gpus=1, tflops=100, price=0.35)
    await publish(broker, NodeRegistered(event_id="owned:r", node=info, boot_id="b"))
    await publish(
        broker,
        submitted(
            job_id="long", gpu_count=1, allowed="any", expected_duration_s=1000 * HOUR, checkpoint_interval_s=1800
        ),
    )
    assert await placement.schedule_once() == 1  # nobody waits for the owned GPU: it takes it
    for i in range(20):
        await publish(
            broker,
            submitted(job_id=f"local-{i}", gpu_count=1, allowed="local", priority="cost", expected_duration_s=HOUR),
        )


async def test_the_long_job_is_snapshotted_for_a_node_rented_for_it(service):
    broker, placement, moves = service
    await _long_job_on_the_only_owned_gpu(broker, placement, billing_allows=True)

    await placement.schedule_once()

    assert placement.queue["long"].moving
    assert [(m["job_id"], m["cause"], m["requested_by"]) for m in moves] == [("long", "migrated", "placement")]
    [rented] = [n for n in placement.fleet.nodes.values() if n.provisioned]
    assert rented.reserved_for == "long" and rented.instance_type == "gpu.1x"


async def test_billing_refusing_the_rental_leaves_the_job_where_it_is(service):
    broker, placement, moves = service
    await _long_job_on_the_only_owned_gpu(broker, placement, billing_allows=False)

    await placement.schedule_once()

    assert not placement.queue["long"].moving and not moves
    assert [a.node_id for a in placement.queue["long"].assignments] == ["owned"]


async def test_the_rented_node_stays_kept_for_the_job_while_it_checkpoints(service):
    broker, placement, _ = service
    await _long_job_on_the_only_owned_gpu(broker, placement, billing_allows=True)
    await placement.schedule_once()  # the move: the rental is made, the job asked to snapshot
    [rented] = [n for n in placement.fleet.nodes.values() if n.provisioned]
    info = node(node_id=rented.node_id, kind="on_demand", gpus=1, tflops=100, price=0.5)
    await publish(broker, NodeRegistered(event_id=f"{rented.node_id}:r", node=info, boot_id="b"))
    await publish(broker, submitted(job_id="urgent", gpu_count=1, allowed="any", expected_duration_s=HOUR))

    # booted; "long" still checkpoints on the owned GPU: its rental is not free to others
    await placement.schedule_once(now=placement.fleet.nodes[rented.node_id].ready_at + 1)

    assert placement.queue["urgent"].state == "queued"
    assert placement.fleet.nodes[rented.node_id].reserved_for == "long"
