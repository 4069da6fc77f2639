"""Billing under TestNatsBroker: node lifetimes exactly once and reconciled, admission, budget alerts once."""

from datetime import timedelta

import pytest

from shared.bus import RPC_ADMIT, publish
from shared.events import (
    JobStatusChanged,
    NodeProvisioned,
    NodeRegistered,
    NodeReleased,
    NodeStateChanged,
    TaskExited,
    TaskStarted,
)
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import AdmitQuery, AdmitReply, ProjectQuotas, Quota, QuotasRequest, UsageQuery
from services.billing.ledger import reconcile
from services.billing.service import Billing
from tests.factories import T0, exited, node, placed, started, submitted


async def deliver(broker, service: Billing, *events) -> None:
    """Publish events; a task's start or end as an honest agent's report, which billing sees when it says it
    happened (billing's clock is moved there first: it charges by when it sees a report, not by what it says)."""
    for event in events:
        if isinstance(event, TaskStarted | TaskExited):
            service.attempts.clock.at(event.started_at if isinstance(event, TaskStarted) else event.ended_at)
        await publish(broker, event)


def provisioned(node_id: str, *, at=T0, price=3.6, user="ana") -> NodeProvisioned:
    return NodeProvisioned(
        event_id=f"{node_id}:provisioned",
        node_id=node_id,
        instance_type="a2",
        provider="fake",
        price_per_hour=price,
        gpu_count=1,
        provisioned_at=at,
        for_job_id="j",
        project_id="p",
        user_name=user,
    )


def released(node_id: str, *, at) -> NodeReleased:
    return NodeReleased(event_id=f"{node_id}:released", node_id=node_id, released_at=at, reason="idle")


def on_demand_start(job_id: str, *, node_id: str, at, user="bob") -> TaskStarted:
    return started(job_id, node_id=node_id, at=at).model_copy(
        update={"node_kind": "on_demand", "price_per_hour": 3.6, "user_name": user}
    )


async def test_every_on_demand_node_is_charged_its_lifetime_times_its_price_once(billing):
    broker, service, _ = billing
    lifetimes = {"od-1": 2.5, "od-2": 0.75, "od-3": 10.0}
    for node_id, hours in lifetimes.items():
        for event in [
            provisioned(node_id),
            provisioned(node_id),
            released(node_id, at=T0 + timedelta(hours=hours)),
            released(node_id, at=T0 + timedelta(hours=hours)),
            provisioned(node_id),
        ]:
            await publish(broker, event)  # every event twice, and a late duplicate after the release
    lines = list(service.lifetimes.nodes.docs.values())
    assert len(lines) == 3 and service.lifetimes.nodes_open.docs == {}
    for node_id, (charged, expected) in reconcile(lines).items():
        assert charged == pytest.approx(expected) == pytest.approx(lifetimes[node_id] * 3.6)
    report = await service.reports.usage(UsageQuery())
    assert report.on_demand.nodes == 3 and report.on_demand.cost == pytest.approx(sum(lifetimes.values()) * 3.6)


async def bobs_hour_on_a_node_anas_job_rented(broker, service: Billing) -> None:
    """od-1 rented for ana's job for two hours ($3.6 an hour); bob's attempt ran on it for one of them."""
    await publish(broker, provisioned("od-1", user="ana"))
    await publish(broker, submitted(job_id="j1").model_copy(update={"user_name": "bob"}))
    await publish(broker, placed("j1", nodes=("od-1",), kind="on_demand", price=3.6))
    await deliver(broker, service, on_demand_start("j1", node_id="od-1", at=T0 + timedelta(minutes=10), user="bob"))
    await deliver(broker, service, exited("j1", node_id="od-1", at=T0 + timedelta(minutes=70)))
    await publish(broker, released("od-1", at=T0 + timedelta(hours=2)))


async def test_attempts_on_a_rented_node_plus_its_idle_time_add_up_to_its_lifetime(billing):
    broker, service, _ = billing
    await bobs_hour_on_a_node_anas_job_rented(broker, service)
    report = await service.reports.usage(UsageQuery(project_id="p"))
    by_user = {r.key: r for r in report.by_user}
    assert by_user["bob"].on_demand_cost == pytest.approx(3.6)  # the hour bob's attempt ran
    assert by_user["ana"].on_demand_cost == pytest.approx(3.6)  # the idle hour of the node ana's job asked for
    assert report.total.on_demand_cost == pytest.approx(2 * 3.6) == pytest.approx(report.on_demand.cost)


async def test_a_lost_node_that_was_never_released_is_charged_up_to_its_last_heartbeat(billing):
    broker, service, _ = billing
    await publish(broker, provisioned("od-9"))
    await publish(
        broker,
        NodeStateChanged(event_id="od-9:lost", node_id="od-9", state="lost", last_seen=T0 + timedelta(minutes=30)),
    )
    await publish(broker, released("od-9", at=T0 + timedelta(hours=5)))  # after the loss: nothing more
    [line] = service.lifetimes.nodes.docs.values()
    assert (line["seconds"], line["cost"]) == (1800, pytest.approx(1.8))


async def test_owned_capacity_from_registration_to_loss_gives_utilisation(billing):
    broker, service, _ = billing
    ws = node(node_id="ws", kind="local", gpus=2, price=0.5)
    await publish(broker, NodeRegistered(event_id="ws:boot", occurred_at=T0, node=ws, boot_id="b"))
    await publish(broker, placed("j", nodes=("ws",)))
    await deliver(broker, service, started("j", node_id="ws", at=T0))
    await deliver(broker, service, exited("j", node_id="ws", at=T0 + timedelta(hours=1)))
    await publish(
        broker, NodeStateChanged(event_id="ws:lost", node_id="ws", state="lost", last_seen=T0 + timedelta(hours=4))
    )
    report = await service.reports.usage(UsageQuery(project_id="p"))
    local = report.owned["local"]
    assert (local.available_gpu_hours, local.busy_gpu_hours, local.idle_gpu_hours) == (8, 1, 7)
    assert local.utilisation == pytest.approx(1 / 8)


async def test_a_budget_refuses_a_submission_and_a_paid_node(billing):
    broker, service, _ = billing
    await service.admission.set_quotas(QuotasRequest(project_id="p", project=ProjectQuotas(budget_per_month=1.0)))
    ask = AdmitQuery(project_id="p", user_name="ana", purpose="provision", gpus=1, estimated_cost=2.0)
    reply = AdmitReply.model_validate(await (await broker.request(ask, RPC_ADMIT)).decode())
    assert (reply.allowed, reply.error_code) == (False, "406029")
    assert (await service.admission.admit(ask.model_copy(update={"estimated_cost": 0.5}))).allowed
    await service.admission.set_quotas(QuotasRequest(project_id="p", user_name="ana", user=Quota(max_gpus=0)))
    refused = await service.admission.admit(ask.model_copy(update={"estimated_cost": 0.5}))
    assert (refused.allowed, refused.error_code) == (False, "406008") and "p/ana.max_gpus" in refused.reason
    assert (await service.admission.admit(ask.model_copy(update={"user_name": "bob", "estimated_cost": 0.5}))).allowed


async def test_max_gpus_counts_the_queued_jobs_of_the_project_and_of_the_user(billing):
    broker, service, _ = billing
    await service.admission.set_quotas(
        QuotasRequest(project_id="p", project=ProjectQuotas(max_gpus=4, users={"alice": Quota(max_gpus=2)}))
    )
    await publish(broker, submitted(job_id="queued", gpu_count=2))  # alice's, not started
    await publish(broker, submitted(job_id="running", gpu_count=1))
    await publish(broker, placed("running"))
    await deliver(broker, service, started("running"))  # one GPU in use: counted once, as running
    ask = AdmitQuery(project_id="p", user_name="bob", purpose="submit", gpus=1)
    assert (await service.admission.admit(ask)).allowed  # 1 running + 2 queued + 1 = 4
    refused = await service.admission.admit(ask.model_copy(update={"gpus": 2}))
    assert refused.error_code == "406008" and "1 GPUs in use + 2 queued + 2 asked > 4" in refused.reason
    refused = await service.admission.admit(ask.model_copy(update={"user_name": "alice"}))
    assert "[p/alice.max_gpus]" in refused.reason  # alice: 1 running + 2 queued + 1 > 2
    assert (
        await service.admission.admit(ask.model_copy(update={"user_name": "alice", "purpose": "provision"}))
    ).allowed
    await publish(
        broker,
        JobStatusChanged(
            event_id="queued:status:9",
            job_id="queued",
            project_id="p",
            user_name="alice",
            version=9,
            phase=Phase.TERMINATED,
            secondary_phase=SecondaryPhase.TERMINATED,
            end_time=T0,
        ),
    )
    assert (await service.admission.admit(ask.model_copy(update={"gpus": 3}))).allowed  # finished jobs no longer count


async def test_each_budget_alert_is_published_once(billing):
    broker, service, sent = billing
    from shared.clock import utcnow

    now = utcnow()
    service.attempts.clock.at(now - timedelta(hours=1))
    await service.admission.set_quotas(QuotasRequest(project_id="p", project=ProjectQuotas(budget_per_month=1.0)))
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await deliver(broker, service, started("j", at=now - timedelta(minutes=54)))  # $0.90 so far at $1/h
    service.attempts.clock.at(now)
    for _ in range(3):
        await service.alerts.check_all()
    assert [m.event_id.rsplit(":", 1)[-1] for m in sent] == ["80"]
    await deliver(broker, service, exited("j", at=now + timedelta(minutes=10)))
    await service.alerts.check_all()
    assert [m.event_id.rsplit(":", 1)[-1] for m in sent] == ["80", "100"]
    assert all(m.kind == "budget" and m.project_id == "p" for m in sent)


async def test_quotas_are_read_once_and_each_change_is_what_the_next_admission_sees(billing):
    _, service, _ = billing
    reads = []
    quotas = service.admission.book.quotas
    read = quotas.find_one
    quotas.find_one = lambda query, projection=None: reads.append(query) or read(query, projection)
    ask = AdmitQuery(project_id="p", user_name="ana", purpose="provision", gpus=1, estimated_cost=2.0)
    assert (await service.admission.admit(ask)).allowed and (await service.admission.admit(ask)).allowed
    assert len(reads) == 1  # no quotas: read once, remembered
    await service.admission.set_quotas(QuotasRequest(project_id="p", project=ProjectQuotas(budget_per_month=1.0)))
    assert not (await service.admission.admit(ask)).allowed  # the change is seen at once
    assert (await quotas.find_one({"_id": "p"}))["quotas"]["budget_per_month"] == 1.0  # and stored
    service.admission.book.known.clear()  # a restarted billing reads what was stored
    assert not (await service.admission.admit(ask)).allowed


async def test_a_registration_an_agent_dates_years_back_is_charged_from_when_billing_saw_it(billing):
    broker, service, _ = billing
    ws = node(node_id="ws", kind="local", gpus=2, price=0.5)
    claimed = T0 - timedelta(days=3650)  # the agent's clock (or its lie): ten years of capacity never offered
    await publish(broker, NodeRegistered(event_id="ws:boot", occurred_at=claimed, node=ws, boot_id="b"))
    await publish(
        broker, NodeStateChanged(event_id="ws:lost", node_id="ws", state="lost", last_seen=T0 + timedelta(hours=4))
    )
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.owned["local"].available_gpu_hours == 8


async def test_the_spend_only_report_admission_asks_for_is_the_whole_reports_spend(billing):
    """Admission and budget alerts ask for the month's spend (`spend_only`: fewer ledger reads); its totals, rows
    and GPUs in use are the whole report's, with owned and on-demand, closed, idle and running lines."""
    broker, service, _ = billing
    await bobs_hour_on_a_node_anas_job_rented(broker, service)
    for job_id, user, ends in (("j2", "ana", 3), ("j3", "cem", None)):  # a local attempt closed, one running
        await publish(broker, submitted(job_id=job_id).model_copy(update={"user_name": user}))
        await publish(broker, placed(job_id))
        await deliver(broker, service, started(job_id, at=T0 + timedelta(hours=1)))
        if ends:
            await deliver(broker, service, exited(job_id, at=T0 + timedelta(hours=ends)))
    service.reports.clock = lambda: T0 + timedelta(hours=4)
    for query in (
        UsageQuery(project_id="p"),
        UsageQuery(project_id="p", start=T0 + timedelta(minutes=30)),
        UsageQuery(project_id="p", start=T0 + timedelta(minutes=30), end=T0 + timedelta(hours=2, minutes=30)),
    ):
        whole = await service.reports.usage(query)
        spend = await service.reports.usage(query, spend_only=True)
        assert whole.total.spend > 0 and len(whole.by_user) == 3
        assert spend.total == whole.total and spend.by_user == whole.by_user and spend.groups == whole.groups
        assert spend.gpus_in_use == whole.gpus_in_use == 1 and spend.on_demand == whole.on_demand
        assert spend.by_node_kind == [] and spend.owned == {}


async def test_a_report_reuses_the_lifetimes_it_read_until_a_lifetime_is_written(billing):
    broker, service, _ = billing
    reports = service.reports
    await publish(broker, provisioned("od-1"))
    reports.clock = lambda: T0 + timedelta(hours=1)
    query = UsageQuery(project_id="p", start=T0)
    assert (await reports.usage(query, spend_only=True)).on_demand.cost == pytest.approx(3.6)
    before = reports.lifetime_reads.reused
    reports.clock = lambda: T0 + timedelta(hours=2)
    assert (await reports.usage(query, spend_only=True)).on_demand.cost == pytest.approx(7.2)  # open: to the new now
    assert reports.lifetime_reads.reused > before
    await publish(broker, provisioned("od-2", at=T0 + timedelta(hours=1)))  # a lifetime written: read again
    assert (await reports.usage(query, spend_only=True)).on_demand.nodes == 2
    await publish(broker, released("od-1", at=T0 + timedelta(hours=1, minutes=30)))
    report = await reports.usage(query, spend_only=True)
    assert report.on_demand.nodes == 2 and report.on_demand.cost == pytest.approx(3.6 * 2.5)


async def test_a_rented_node_that_registers_after_its_release_is_charged_no_more(billing):
    """Its lifetime closed at the release; a registration after it (an agent not yet revoked, or started again)
    opened a lifetime nothing ever closed, charged to the renter for good: $100 a day later for a $4 hour (found by
    review). The release is remembered in the node's record."""
    broker, service, _ = billing
    hour = timedelta(hours=1)
    await publish(broker, provisioned("od", price=4.0))
    await publish(broker, released("od", at=T0 + hour))
    service.lifetimes.clock.at(T0 + 2 * hour)
    again = node(node_id="od", kind="on_demand", gpus=1, price=0.0)
    await publish(broker, NodeRegistered(event_id="od:boot2", occurred_at=T0 + 2 * hour, node=again, boot_id="b2"))
    await publish(broker, NodeStateChanged(event_id="od:ready2", node_id="od", state="ready", last_seen=T0 + 2 * hour))
    assert service.lifetimes.nodes_open.docs == {}
    service.reports.clock.at(T0 + 26 * hour)
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert round(report.total.on_demand_cost, 2) == 4.0
