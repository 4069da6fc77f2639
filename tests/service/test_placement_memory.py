"""Placement under TestNatsBroker decides the host memory of a job that names none: its GPUs' share of the node it
is placed on, shown by the dry run, launched with the attempt, held against the node, doubled after running out."""

import pytest

from shared.bus import publish
from shared.rpc import CandidatesQuery
from tests.factories import node, requeued, spec, submitted
from tests.service.test_placement_engine import register


def quote(service, **resource) -> list:
    query = CandidatesQuery(spec=spec(resource=resource), user_name="alice", project_id="p")
    return service.candidates(query).candidates


async def test_a_gpu_job_without_host_memory_is_launched_with_its_gpus_share_the_dry_run_showed(placement):  # noqa: F811
    broker, service, placements = placement
    await register(broker, node(node_id="box", gpus=4, memory_gb=64))
    [offer] = quote(service, gpu_count=1)
    assert offer.memory_gb == 16
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await service.schedule_once() == 1
    [launched] = placements
    assert launched["launch"]["spec"]["resource"]["memory_gb"] == 16 and service.queue["j"].memory_gb == 16


async def test_asked_host_memory_and_the_cpu_jobs_default_are_what_the_dry_run_shows_and_the_job_gets(placement):  # noqa: F811,E501
    broker, service, placements = placement
    await register(broker, node(node_id="box", gpus=4, memory_gb=64))
    assert [o.memory_gb for o in quote(service, gpu_count=1, memory_gb=3)] == [3]
    assert [o.memory_gb for o in quote(service, cpu_count=1)] == [1]
    await publish(broker, submitted(job_id="asked", gpu_count=1, memory_gb=3))
    await publish(broker, submitted(job_id="cpu", cpu_count=1))
    assert await service.schedule_once() == 2
    assert sorted((p["job_id"], p["launch"]["spec"]["resource"]["memory_gb"]) for p in placements) == [
        ("asked", 3),
        ("cpu", 1),
    ]


async def test_the_share_a_placed_job_holds_is_not_given_to_the_next_job(placement):  # noqa: F811
    broker, service, _ = placement
    await register(broker, node(node_id="box", gpus=2, memory_gb=32))
    await publish(broker, submitted(job_id="gpu", gpu_count=1))
    assert await service.schedule_once() == 1
    await publish(broker, submitted(job_id="big", cpu_count=1, memory_gb=20))
    assert await service.schedule_once() == 0  # 16 GB left: the GPU job holds its 16


@pytest.mark.parametrize("cause, expected", [("oom_host", 32), ("migrated", None)])
async def test_after_running_out_of_host_memory_the_next_attempt_asks_twice_what_it_was_given(
    placement,
    cause,  # noqa: F811,E501
    expected,
):
    broker, service, _ = placement
    await register(broker, node(node_id="box", gpus=4, memory_gb=64))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await service.schedule_once() == 1 and service.queue["j"].memory_gb == 16
    await publish(
        broker,
        requeued("j", cause),
    )
    item = service.queue["j"]
    assert (item.state, item.needs.memory_gb, item.memory_gb) == ("queued", expected, None)


async def test_a_node_claiming_more_memory_than_a_task_spec_holds_launches_a_spec_every_reader_accepts(placement):  # noqa: F811
    """A node whose record bounds no memory registers 65,536 GB (the most a node may claim): its GPU job's share
    (16,384 GB) would make a `JobPlaced` every reader refuses, the job placed for good and never started. The share
    stops at what a spec holds, and a host out-of-memory requeue doubles no further."""
    from shared.events import JobPlaced
    from shared.jobs import Resource
    from services.placement.apply import MAX_MEMORY_GB

    broker, service, placements = placement
    await register(broker, node(node_id="box", gpus=4, memory_gb=65_536))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await service.schedule_once() == 1
    [launched] = placements
    assert launched["launch"]["spec"]["resource"]["memory_gb"] == MAX_MEMORY_GB
    JobPlaced.model_validate(launched)  # what the monitor, billing and the agent decode
    assert Resource.model_fields["memory_gb"].metadata[-1].le == MAX_MEMORY_GB
    await publish(broker, requeued("j", "oom_host"))
    assert service.queue["j"].needs.memory_gb == MAX_MEMORY_GB
