"""Placement takes a node's registration only as far as its record allows: the cluster file's entry for a static
node, the instance type it rented for its own nodes; no record, no node."""

import time

from shared.bus import publish
from shared.events import NodeRegistered
from shared.noderecords import limits_from_entry
from shared.nodes import Gpu
from services.placement.fleet import FleetNode
from services.placement.policy import InstanceType
from tests.factories import node, submitted

WS = {
    "id": "ws-1",
    "kind": "reserved",
    "cpu_count": 16,
    "memory_gb": 64,
    "price_per_hour": 1.6,
    "gpus": [{"model": "A100-40GB", "memory_gb": 40, "tflops": 312, "count": 1}],
}
A10 = InstanceType(
    name="a10g.1x",
    gpus=1,
    gpu_model="A10G",
    gpu_memory_gb=24,
    tflops=125,
    cpu=8,
    memory_gb=32,
    price_per_hour=1.01,
    startup_delay_s=0,
)


def eight_big_gpus(node_id: str):
    """Row 5's registration: 8 x A100-80GB, kind local, price 0."""
    return NodeRegistered(
        event_id=f"{node_id}:boot:forged",
        boot_id="forged",
        node=node(
            node_id=node_id, kind="local", gpus=8, gpu_memory_gb=80, tflops=312, cpu=96, memory_gb=1024, price=0.0
        ),
    )


async def test_a_registration_claiming_more_than_the_cluster_file_is_capped_and_no_big_job_lands(placement):  # noqa: F811
    broker, service, placements = placement
    service.fleet.static = {"ws-1": limits_from_entry(WS)}
    await publish(broker, eight_big_gpus("ws-1"))
    await publish(broker, submitted(job_id="big", gpu_count=8))
    assert await service.schedule_once() == 0 and placements == []
    kept = service.fleet.nodes["ws-1"]
    assert (kept.info.kind, kept.info.price_per_hour, kept.info.cpu_count, kept.info.memory_gb) == (
        "reserved",
        1.6,
        16,
        64,
    )
    assert kept.info.gpus == (Gpu(index=0, model="A100-40GB", memory_gb=40, tflops=312),)
    assert kept.claims_refused["gpus"] == "claimed 8, record 1" and "kind" in kept.claims_refused
    await publish(broker, submitted(job_id="small", gpu_count=1))
    assert await service.schedule_once() == 1  # what the record allows is used, at the record's price
    [(assignment,)] = [tuple(p["assignments"]) for p in placements]
    assert (
        assignment["node_id"],
        assignment["price_per_hour"],
        assignment["node_kind"],
        assignment["node_gpu_count"],
    ) == ("ws-1", 1.6, "reserved", 1)


async def test_a_node_with_no_record_is_not_taken_into_the_fleet(placement):  # noqa: F811
    broker, service, placements = placement
    service.fleet.static = {"ws-1": limits_from_entry(WS)}
    await publish(broker, eight_big_gpus("stranger"))
    await publish(broker, submitted(job_id="big", gpu_count=8))
    assert await service.schedule_once() == 0 and "stranger" not in service.fleet.nodes


async def test_a_rented_node_is_capped_to_the_instance_type_it_was_rented_as(placement):  # noqa: F811
    broker, service, _ = placement
    service.fleet.static = {}
    service.fleet.catalogue = (A10,)
    service.fleet.nodes["od-a10g-1x-1"] = FleetNode(
        node_id="od-a10g-1x-1", state="provisioning", provisioned=True, instance_type="a10g.1x", ready_at=time.time()
    )
    await publish(broker, eight_big_gpus("od-a10g-1x-1"))
    kept = service.fleet.nodes["od-a10g-1x-1"]
    assert (kept.state, kept.info.kind, kept.info.price_per_hour, len(kept.info.gpus)) == (
        "ready",
        "on_demand",
        1.01,
        1,
    )
    assert kept.info.gpus[0].memory_gb == 24 and kept.claims_refused["price_per_hour"] == "claimed 0.0, record 1.01"


async def test_a_boasted_measurement_is_capped_to_the_record_and_the_placed_rank_carries_the_capped_speed(placement):  # noqa: F811
    broker, service, placements = placement
    service.fleet.static = {"ws-1": limits_from_entry(WS)}
    honest = node(
        node_id="ws-1", kind="reserved", gpus=1, gpu_memory_gb=40, tflops=312, cpu=16, memory_gb=64, price=1.6
    )
    gpu = honest.gpus[0].model_copy(update={"model": "A100-40GB", "measured_tflops": 5000.0})
    boasting = honest.model_copy(update={"gpus": (gpu,), "labels": {"pool": "default"}})
    await publish(broker, NodeRegistered(event_id="ws-1:boot:boast", boot_id="boast", node=boasting))
    kept = service.fleet.nodes["ws-1"]
    assert kept.info.gpus[0].measured_tflops == 343.2
    assert kept.claims_refused == {"gpus[0].measured_tflops": "claimed 5000.0, record 343.2"}
    await publish(broker, submitted(job_id="fast", gpu_count=1))
    assert await service.schedule_once() == 1
    [(assignment,)] = [tuple(p["assignments"]) for p in placements]
    assert assignment["gpu_tflops"] == 343.2
