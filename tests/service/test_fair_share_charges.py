"""A finished job's GPU-hours count once in fair share whatever happens to the event that reports it: a charge whose
write failed, a job whose own write failed after its charge was written, and the event seen again by a restarted
placement each add nothing a second time."""

from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from shared.events import JobStatusChanged, NodeRegistered
from shared.jobs import Phase, SecondaryPhase
from shared.store import DocumentStore
from services.placement.estimates import Estimates
from services.placement.fairshare import MAX_KEYS, FairShare, recent
from services.placement.fleet import Fleet
from services.placement.handlers import router as placement_router
from services.placement.service import Placement
from tests.factories import T0, node, submitted
from tests.memory import MemoryCollection
from tests.service.conftest import FakeProvider


class WriteFailed(Exception):
    pass


def placement(broker, *, jobs: MemoryCollection, usage: MemoryCollection) -> Placement:
    fleet = Fleet(store=DocumentStore(MemoryCollection("nodes"), broker), provider=FakeProvider())
    return Placement(
        jobs=DocumentStore(jobs, broker),
        fleet=fleet,
        fair=FairShare(usage),
        estimates=Estimates(broker=broker),
    )


def status(version: int, phase: Phase, secondary: SecondaryPhase) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"j:status:{version}",
        job_id="j",
        project_id="p",
        user_name="alice",
        version=version,
        phase=phase,
        secondary_phase=secondary,
        attempt=1,
        node_ids=("box",),
        start_time=T0,
        end_time=T0 + timedelta(hours=3) if phase.is_finished() else None,
    )


FINISHED = status(4, Phase.COMPLETED, SecondaryPhase.COMPLETED)  # 3 hours on 2 GPUs: 6 GPU-hours


@pytest.fixture
async def running():
    """A broker, placement's collections, and a placement whose job `j` of alice runs on 2 GPUs."""
    broker = NatsBroker()
    broker.include_router(placement_router)
    async with TestNatsBroker(broker) as test_broker:
        jobs, usage = MemoryCollection("jobs"), MemoryCollection("usage")
        service = placement(test_broker, jobs=jobs, usage=usage)
        test_broker.context.set_global("placement", service)
        await publish(test_broker, submitted(job_id="j", gpu_count=2))
        await publish(test_broker, NodeRegistered(event_id="r", node=node(node_id="box", gpus=2), boot_id="b"))
        assert await service.schedule_once() == 1
        await service.status_changed(status(3, Phase.RUNNING, SecondaryPhase.RUNNING))
        yield test_broker, service, jobs, usage


async def stored_usage(usage: MemoryCollection) -> dict[str, float]:
    restarted = FairShare(usage)
    await restarted.load()
    return restarted.usage


def fail_once(target, name: str) -> None:
    original = getattr(target, name)
    failed = []

    async def write(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise WriteFailed(name)
        return await original(*args, **kwargs)

    setattr(target, name, write)


async def test_a_charge_whose_write_failed_counts_once_when_its_event_comes_again(running):
    _, service, _, usage = running
    fail_once(usage, "replace_one")
    with pytest.raises(WriteFailed):
        await service.status_changed(FINISHED)
    await service.status_changed(FINISHED)  # redelivered: the handler failed
    assert service.fair.usage == pytest.approx({"alice": 6.0}, rel=1e-3)
    assert await stored_usage(usage) == pytest.approx({"alice": 6.0}, rel=1e-3)


async def test_a_charge_written_before_the_job_s_own_write_failed_counts_once(running):
    _, service, _, usage = running
    fail_once(service.store, "save")
    with pytest.raises(WriteFailed):
        await service.status_changed(FINISHED)
    await service.status_changed(FINISHED)
    assert service.fair.usage == pytest.approx({"alice": 6.0}, rel=1e-3)
    assert await stored_usage(usage) == pytest.approx({"alice": 6.0}, rel=1e-3)


async def test_a_restarted_placement_that_sees_the_event_again_adds_nothing(running):
    broker, service, jobs, usage = running
    fail_once(service.store, "save")  # the charge is written, then the process stops before the job is
    with pytest.raises(WriteFailed):
        await service.status_changed(FINISHED)
    restarted = placement(broker, jobs=jobs, usage=usage)
    await restarted.load()
    await restarted.status_changed(FINISHED)  # the unacknowledged event, delivered again
    assert restarted.fair.usage == pytest.approx({"alice": 6.0}, rel=1e-3)
    assert await stored_usage(usage) == pytest.approx({"alice": 6.0}, rel=1e-3)


def test_charge_keys_are_kept_a_while_and_only_the_newest():
    now = 10_000_000.0
    assert recent({"old": now - 8 * 86400, "new": now - 60}, now) == {"new": now - 60}
    many = recent({f"k{i}": now - i for i in range(MAX_KEYS + 5)}, now)
    assert len(many) == MAX_KEYS and "k0" in many and f"k{MAX_KEYS}" not in many
