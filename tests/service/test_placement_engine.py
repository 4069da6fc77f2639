"""Placement under TestNatsBroker: one engine places every job and prices the dry run (the price shown is the price
decided); jobs without GPUs, jobs moving away and jobs in a pool go through it too."""

from datetime import UTC, datetime, timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from shared.events import JobStatusChanged, NodeRegistered
from shared.jobs import Phase, SecondaryPhase
from shared.nodes import NodeInfo
from shared.rpc import CandidatesQuery
from services.placement.handlers import router as placement_router
from services.placement.policy.options import waited_s
from tests.factories import T0, node, requeued, spec, status_changed, submitted
from tests.service.conftest import placement_service


@pytest.fixture
async def service():
    broker = NatsBroker()
    broker.include_router(placement_router)
    async with TestNatsBroker(broker) as test_broker:
        placement = placement_service(test_broker)
        test_broker.context.set_global("placement", placement)
        yield test_broker, placement


async def register(broker, info: NodeInfo) -> None:
    await publish(broker, NodeRegistered(event_id=f"{info.node_id}:r", node=info, boot_id="b"))


def where(placement, job_id: str) -> list[str]:
    return [a.node_id for a in placement.queue[job_id].assignments]


@pytest.mark.parametrize("priority", ["time", "cost"])
async def test_the_dry_runs_first_candidate_is_where_the_job_goes_at_that_price(service, priority):
    broker, placement = service
    await register(broker, node(node_id="cheap", gpus=2, tflops=50, price=1.0))
    await register(broker, node(node_id="fast", gpus=2, tflops=200, price=8.0))
    job = dict(gpu_count=1, expected_duration_s=3600, priority=priority)
    [first, *_] = placement.candidates(
        CandidatesQuery(
            spec=spec(resource={"gpu_count": 1}, placement={"expected_duration_s": 3600, "priority": priority}),
            user_name="alice",
            project_id="p",
        )
    ).candidates
    await publish(broker, submitted(job_id="j", **job))
    assert await placement.schedule_once() == 1
    assert where(placement, "j") == [first.node_id]
    share = {"cheap": 0.5, "fast": 4.0}[first.node_id]  # the job's GPU of the node's price, as billing charges it
    assert first.price_per_hour == share and first.expected_cost == pytest.approx(
        share * first.predicted_duration_s / 3600, abs=1e-6
    )


async def test_a_job_without_gpus_is_placed_by_the_engine_at_the_price_its_dry_run_shows(service):
    broker, placement = service
    await register(broker, node(node_id="gpu-box", kind="reserved", gpus=1, price=3.0))
    await register(broker, node(node_id="cpu-box", gpus=0, price=0.5))
    reply = placement.candidates(
        CandidatesQuery(spec=spec(resource={"cpu_count": 2}), user_name="alice", project_id="p")
    )
    assert [(c.node_id, c.price_per_hour) for c in reply.candidates] == [("cpu-box", 0.5), ("gpu-box", 3.0)]
    await publish(broker, submitted(job_id="j", cpu_count=2))
    assert await placement.schedule_once() == 1
    assert where(placement, "j") == ["cpu-box"] and placement.queue["j"].assignments[0].gpu_indices == ()


async def test_a_job_that_moved_away_is_placed_anywhere_but_where_it_was(service):
    broker, placement = service
    await register(broker, node(node_id="first", tflops=300))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["first"]
    await register(broker, node(node_id="second", tflops=100))
    await publish(
        broker,
        requeued("j", "migrated"),
    )
    assert placement.queue["j"].exclude == ("first",)
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["second"]


@pytest.mark.parametrize("cause", ["hung", "node_lost"])
async def test_a_job_whose_attempt_hung_or_lost_its_node_avoids_it_for_a_while_where_another_can_host_it(
    service, monkeypatch, cause
):
    """A bad GPU or a flapping node had the job back at once, every attempt, for as long as it was the best fit.
    A lost node's attempt goes through Abnormal first (its assignments cleared): the nodes it ran on are kept."""
    from services.placement import inputs as placement_inputs

    broker, placement = service

    async def lose(version: int, attempt: int) -> None:
        if cause == "node_lost":  # the monitor's way: Abnormal[Lost], then the requeue
            lost = status_changed("j", Phase.ABNORMAL, SecondaryPhase.LOST, version=version - 1, attempt=attempt)
            await publish(broker, lost)
        await publish(broker, requeued("j", cause, version=version, attempt=attempt))

    await register(broker, node(node_id="first", tflops=300))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["first"]
    await lose(5, 1)
    assert placement.queue["j"].exclude == ()  # the only node that can host it: back there, as before
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["first"]
    await register(broker, node(node_id="second", tflops=100))
    await lose(7, 2)
    item = placement.queue["j"]
    assert item.exclude == ("first",) and item.exclude_until is not None
    assert placement.inputs.constraints([item])["j"].exclude == {"first"}
    later = item.exclude_until + timedelta(seconds=1)
    monkeypatch.setattr(placement_inputs, "utcnow", lambda: later)  # past AVOID_S: any node again
    assert "j" not in placement.inputs.constraints([item])
    monkeypatch.undo()
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["second"]


async def test_a_multi_node_job_that_lost_one_node_avoids_that_node_only(service):
    """The monitor names the node found gone (Abnormal[Lost]): the attempt's other nodes were alive and may host the
    next attempt (before, every node of the attempt was avoided for 15 minutes)."""
    broker, placement = service
    for name, tflops in (("a", 300), ("b", 300), ("c", 300)):
        await register(broker, node(node_id=name, tflops=tflops))
    await publish(broker, submitted(job_id="j", gpu_count=1, node_count=2))
    assert await placement.schedule_once() == 1 and sorted(where(placement, "j")) == ["a", "b"]
    lost = status_changed("j", Phase.ABNORMAL, SecondaryPhase.LOST, version=4, attempt=1, lost_node_ids=("a", "c"))
    await publish(broker, lost)
    await publish(broker, requeued("j", "node_lost", version=5, attempt=1))
    assert placement.queue["j"].exclude == ("a",)  # "c" is not a node it ran on: named, not avoided
    assert await placement.schedule_once() == 1 and sorted(where(placement, "j")) == ["b", "c"]


async def test_a_pooled_job_that_hung_goes_back_to_its_pools_only_node_whatever_else_is_registered(service):
    broker, placement = service
    pooled = node(node_id="pooled")
    await register(broker, pooled.model_copy(update={"labels": {"pool": "vision"}}))
    await register(broker, node(node_id="plain"))
    await publish(broker, submitted(job_id="j", gpu_count=1, pool_id="vision"))
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["pooled"]
    await publish(broker, requeued("j", "hung"))
    assert placement.queue["j"].exclude == ()  # "plain" is not its pool's: it would have waited for ever
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["pooled"]


async def test_a_job_in_a_pool_goes_only_to_its_pools_nodes(service):
    broker, placement = service
    await register(broker, node(node_id="plain"))
    pooled = node(node_id="pooled")
    await register(broker, pooled.model_copy(update={"labels": {"pool": "vision"}}))
    await publish(broker, submitted(job_id="j", gpu_count=1, pool_id="vision"))
    assert await placement.schedule_once() == 1 and where(placement, "j") == ["pooled"]


async def test_a_dry_run_is_weighed_behind_the_jobs_queued_before_it(service):
    broker, placement = service
    await register(broker, node(node_id="fast", gpus=1, tflops=200, price=1.0))
    await register(broker, node(node_id="slow", gpus=1, tflops=150, price=1.0))
    await publish(broker, submitted(job_id="ahead", gpu_count=1, expected_duration_s=3600))
    [first, *_] = placement.candidates(
        CandidatesQuery(
            spec=spec(resource={"gpu_count": 1}, placement={"expected_duration_s": 3600}),
            user_name="alice",
            project_id="p",
        )
    ).candidates
    assert first.node_id == "slow"  # the job queued first takes the fast node
    await publish(broker, submitted(job_id="j", gpu_count=1, expected_duration_s=3600))
    assert await placement.schedule_once() == 2
    assert (where(placement, "ahead"), where(placement, "j")) == (["fast"], ["slow"])


def status(job_id: str, version: int, phase: Phase, **fields) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=version,
        phase=phase,
        secondary_phase=SecondaryPhase(phase.value),
        attempt=1,
        **fields,
    )


async def test_the_start_of_a_job_nothing_clocks_is_stored_with_its_next_change_not_on_its_own(service):
    """A job without GPUs or an expected duration: nothing reads its start after a restart, so its Running status
    writes nothing; a GPU job's start is stored at once (its expected end runs from it)."""
    broker, placement = service
    await register(broker, node(node_id="box", gpus=1))
    await register(broker, node(node_id="cpu-box", gpus=0))
    await publish(broker, submitted(job_id="cpu", cpu_count=1))
    await publish(broker, submitted(job_id="gpu", gpu_count=1))
    assert await placement.schedule_once() == 2
    stored = placement.store.store.collection.docs
    started = datetime(2026, 11, 26, tzinfo=UTC)
    before = dict(stored["cpu"])
    for job_id in ("cpu", "gpu"):
        await publish(broker, status(job_id, 3, Phase.RUNNING, start_time=started, node_ids=("box",)))
    assert stored["cpu"] == before and placement.queue["cpu"].started_at == started  # kept in memory only
    assert stored["gpu"]["started_at"] == started
    await publish(broker, status("cpu", 4, Phase.COMPLETED, start_time=started, end_time=started))
    assert (stored["cpu"]["state"], stored["cpu"]["started_at"]) == ("done", started)


async def test_a_job_queued_again_after_it_ran_has_waited_only_its_time_in_the_queue(service, monkeypatch):
    """Submitted at T0, placed an hour later, queued again (its node lost) eight hours after that: at T0 + 10 h it
    has waited 2 h (placement's own clock at each change), not the 10 h since its submission."""
    broker, placement = service
    await register(broker, node(node_id="box", gpus=1))
    await publish(broker, submitted(job_id="j", gpu_count=1, created=T0))
    monkeypatch.setattr("services.placement.apply.utcnow", lambda: T0 + timedelta(hours=1))
    assert await placement.schedule_once() == 1
    monkeypatch.setattr("services.placement.service.utcnow", lambda: T0 + timedelta(hours=9))
    await publish(
        broker,
        requeued("j", "node_lost"),
    )

    job = placement.inputs.job_request(placement.queue["j"])

    assert placement.queue["j"].state == "queued"
    assert waited_s(job, (T0 + timedelta(hours=10)).timestamp()) == 2 * 3600
