"""Placement's policy inputs: the estimator's predictions, the exchange rate per project, fair share kept across a
restart, and node verdicts that cost nothing when nothing waits."""

import asyncio
from datetime import timedelta

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import RPC_CANDIDATES, RPC_PREDICT, publish
from shared.cluster import ClusterFile
from shared.events import JobStatusChanged, NodeRegistered, NodeStateChanged
from shared.jobs import Phase, SecondaryPhase, Spec
from shared.rpc import CandidatesQuery, CandidatesReply, PredictQuery, PredictReply
from shared.store import DocumentStore
from services.placement.estimates import Estimates
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.handlers import router as placement_router
from services.placement.service import Placement
from services.placement.tradeoff import tradeoff_from
from tests.factories import T0, node, submitted
from tests.memory import MemoryCollection
from tests.service.conftest import FakeProvider

BERT = [{"name": "benchmark", "value": "bert"}, {"name": "batch_size", "value": "64"}]


def _placement(broker, *, usage: MemoryCollection | None = None, **kw) -> Placement:
    fleet = Fleet(store=DocumentStore(MemoryCollection("nodes"), broker), provider=FakeProvider())
    return Placement(
        jobs=DocumentStore(MemoryCollection("jobs"), broker),
        fleet=fleet,
        fair=FairShare(usage or MemoryCollection("usage")),
        estimates=Estimates(broker=broker),
        **kw,
    )


@pytest.fixture
async def bus():
    broker = NatsBroker()
    broker.include_router(placement_router)
    asked: list[dict] = []

    @broker.subscriber(RPC_PREDICT)
    async def predict(query: PredictQuery) -> PredictReply:
        asked.append(query.model_dump())
        return PredictReply(duration_s=7200.0, low_s=3600.0, high_s=14400.0, model_version=3)

    async with TestNatsBroker(broker) as test_broker:
        yield test_broker, asked


async def test_queued_jobs_take_the_estimators_prediction_and_its_uncertainty_once(bus):
    broker, asked = bus
    service = _placement(broker)
    broker.context.set_global("placement", service)
    await publish(broker, submitted(job_id="named", gpu_count=1, expected_duration_s=60, parameters=BERT))
    await publish(broker, submitted(job_id="anonymous", gpu_count=1, expected_duration_s=60))
    for _ in range(2):
        await service.schedule_once()

    named, anonymous = (service.inputs.job_request(service.queue[j]) for j in ("named", "anonymous"))
    assert [(q["benchmark"], q["batch_size"]) for q in asked] == [("bert", 64.0)]  # cached after the first pass
    assert named.predicted_duration_s == 7200.0 and 0.2 < named.duration_sigma < 0.6
    assert anonymous.predicted_duration_s is None and anonymous.expected_duration_s == 60


async def test_without_an_estimator_the_owners_expectation_stands():
    broker = NatsBroker()
    broker.include_router(placement_router)
    async with TestNatsBroker(broker) as test_broker:
        service = _placement(test_broker)
        test_broker.context.set_global("placement", service)
        await publish(test_broker, submitted(job_id="j", gpu_count=1, expected_duration_s=60, parameters=BERT))
        await service.schedule_once()
        view = service.inputs.job_request(service.queue["j"])
    assert view.predicted_duration_s is None and view.expected_duration_s == 60


async def test_a_projects_exchange_rate_reaches_the_policy(bus):
    broker, _ = bus
    tradeoff = tradeoff_from(ClusterFile(placement={"exchange_rate": 1.5, "projects": {"p": {"exchange_rate": 0}}}))
    service = _placement(broker, tradeoff=tradeoff)
    broker.context.set_global("placement", service)
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert service.inputs.job_request(service.queue["j"]).exchange_rate == 0
    assert tradeoff.exchange_rate == 1.5 and tradeoff.rate_for("other") is None


@pytest.mark.parametrize(
    "section", [{"exchange_rate": -1}, {"exchange_rat": 1}, {"projects": {"p": {"exchange_rate": "fast"}}}]
)
def test_a_bad_placement_section_is_refused_naming_the_field(section):
    with pytest.raises(SystemExit, match="exchange_rat"):
        tradeoff_from(ClusterFile(placement=section))


async def test_fair_share_usage_survives_a_restart(bus):
    broker, _ = bus
    usage = MemoryCollection("usage")
    service = _placement(broker, usage=usage)
    broker.context.set_global("placement", service)
    await publish(broker, submitted(job_id="j", gpu_count=2))
    await publish(broker, NodeRegistered(event_id="r", node=node(node_id="box", gpus=2), boot_id="b"))
    assert await service.schedule_once() == 1
    for version, phase, secondary in (
        (3, Phase.RUNNING, SecondaryPhase.RUNNING),
        (4, Phase.COMPLETED, SecondaryPhase.COMPLETED),
    ):
        await publish(
            broker,
            JobStatusChanged(
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
                end_time=T0 + timedelta(hours=3) if phase == Phase.COMPLETED else None,
            ),
        )

    restarted = _placement(broker, usage=usage)
    await restarted.load()
    assert restarted.fair.usage == pytest.approx({"alice": 6.0}, rel=1e-3)


async def test_a_node_verdict_with_nothing_queued_or_rented_asks_for_no_pass(bus):
    broker, _ = bus
    service = _placement(broker)
    broker.context.set_global("placement", service)
    await publish(broker, NodeRegistered(event_id="r", node=node(node_id="box"), boot_id="b"))
    service.dirty.clear()
    await publish(broker, NodeStateChanged(event_id="l", node_id="box", state="lost", last_seen=T0))
    assert not service.dirty.is_set()
    assert await service.schedule_once() == 0
    await publish(broker, submitted(job_id="j", gpu_count=1))
    await publish(broker, NodeStateChanged(event_id="r2", node_id="box", state="ready", last_seen=T0))
    assert service.dirty.is_set() and await service.schedule_once() == 1


async def test_a_reservation_on_a_lost_node_does_not_keep_its_job_waiting(bus):
    broker, _ = bus
    service = _placement(broker)
    broker.context.set_global("placement", service)
    await publish(broker, NodeRegistered(event_id="r1", node=node(node_id="kept"), boot_id="b"))
    await publish(broker, NodeRegistered(event_id="r2", node=node(node_id="other"), boot_id="b"))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    await service.fleet.reserve("kept", "j")  # e.g. pulled back to it, or rented for it
    await publish(broker, NodeStateChanged(event_id="l", node_id="kept", state="lost", last_seen=T0))

    assert await service.schedule_once() == 1
    assert [a.node_id for a in service.queue["j"].assignments] == ["other"]


async def test_a_job_placed_on_its_kept_node_frees_the_reservation(bus):
    broker, _ = bus
    service = _placement(broker)
    broker.context.set_global("placement", service)
    await publish(broker, NodeRegistered(event_id="r1", node=node(node_id="kept"), boot_id="b"))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    await service.fleet.reserve("kept", "j")

    assert await service.schedule_once() == 1
    assert service.fleet.nodes["kept"].reserved_for is None


async def test_charges_of_jobs_finishing_together_are_all_kept_whatever_order_their_writes_land_in():
    usage = MemoryCollection("usage")
    replace = usage.replace_one
    first = asyncio.Event()

    async def slow_first_write(query, doc, upsert=False):  # the first charge's write is overtaken in flight
        if not first.is_set():
            first.set()
            await asyncio.sleep(0.05)
        return await replace(query, doc, upsert=upsert)

    usage.replace_one = slow_first_write
    fair = FairShare(usage)
    await asyncio.gather(fair.charge("alice", 2.0, key="a"), fair.charge("bob", 3.0, key="b"))
    restarted = FairShare(usage)
    await restarted.load()
    assert restarted.usage == pytest.approx({"alice": 2.0, "bob": 3.0}, rel=1e-3)


async def test_a_pass_rebuilds_only_the_nodes_that_changed():
    service = _placement(None)
    a, b = node(gpus=2, tflops=100), node(gpus=2, tflops=300)
    for info in (a, b):
        await service.fleet.seen(info.node_id, info=info, state="ready")
    first = {n.id: n for n in service.fleet.policy_nodes({})}
    again = {n.id: n for n in service.fleet.policy_nodes({})}
    assert all(again[i] is first[i] for i in first)  # nothing changed: the same views
    assert service.fleet.known_nodes()[0] is service.fleet.known_nodes()[0]
    assert service.fleet.reference_tflops() == 200.0

    from services.placement.adapter import Usage

    used = {a.node_id: Usage(gpus={0}, cpu=1.0, memory_gb=2.0)}
    busy = {n.id: n for n in service.fleet.policy_nodes(used)}
    assert busy[a.node_id].free_gpu_indices == (1,) and busy[b.node_id] is first[b.node_id]
    await service.fleet.seen(b.node_id, info=None, state="lost")
    assert b.node_id not in {n.id for n in service.fleet.policy_nodes(used)}  # a lost node takes no work
    faster = node(node_id=a.node_id, gpus=2, tflops=500)
    await service.fleet.seen(a.node_id, info=faster, state="ready")  # re-registered with other GPUs
    [view] = service.fleet.policy_nodes({})
    assert view.tflops == 500 and view.free_gpu_indices == (0, 1)
    assert service.fleet.reference_tflops() == 400.0  # the lost node still counts: it may come back


async def test_a_dry_run_asks_the_estimator_as_a_queued_job_would(bus):
    broker, asked = bus
    service = _placement(broker)
    broker.context.set_global("placement", service)
    await publish(broker, NodeRegistered(event_id="n:r", node=node(node_id="n", gpus=1), boot_id="b"))
    query = CandidatesQuery(
        spec=Spec.model_validate({"resource": {"gpu_count": 1}, "placement": {"expected_duration_s": 60}}),
        user_name="alice",
        project_id="p",
        parameters=BERT,
    )
    reply = CandidatesReply.model_validate(await (await broker.request(query, RPC_CANDIDATES)).decode())

    [first] = reply.candidates
    assert [q["benchmark"] for q in asked] == ["bert"]
    assert (first.predicted_duration_s, first.duration_source) == (7200.0, "estimator")


async def test_fair_share_writes_nothing_for_a_job_without_gpus_and_once_for_charges_that_come_together():
    usage = MemoryCollection("usage")
    replace = usage.replace_one
    writes = []
    held = asyncio.Event()

    async def counted_write(query, doc, upsert=False):  # the first write of hours waits while more jobs finish
        writes.append(doc)
        if len(writes) == 1 and doc["usage"]:
            await held.wait()
        return await replace(query, doc, upsert=upsert)

    usage.replace_one = counted_write
    fair = FairShare(usage)
    await fair.charge("alice", 0.0, key="none")  # a no-op job: nothing to add
    assert writes == []
    first = asyncio.create_task(fair.charge("alice", 1.0, key="a"))
    await asyncio.sleep(0)
    others = asyncio.gather(*(fair.charge(user, 2.0, key=user) for user in ("bob", "carol", "dave")))
    await asyncio.sleep(0)
    held.set()
    await asyncio.gather(first, others)
    assert len(writes) == 2  # the first, then one for the three that came while it was written (four before)
    restarted = FairShare(usage)
    await restarted.load()
    assert restarted.usage == pytest.approx({"alice": 1.0, "bob": 2.0, "carol": 2.0, "dave": 2.0}, rel=1e-3)
