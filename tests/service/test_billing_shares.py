"""Attempts side by side on one multi-GPU node pay their GPUs' share of its price (as placement prices them), so
together they pay the node's price once, and a rented node's lifetime is not counted twice with them."""
from datetime import timedelta

import pytest

from shared.bus import publish
from shared.events import NodeProvisioned, NodeRegistered, NodeReleased
from shared.rpc import UsageQuery
from services.billing.ledger import share_per_hour
from tests.factories import T0, exited, node, placed, started
from tests.service.test_billing_lifetimes import billing  # noqa: F401 (the fixture)

HOUR = timedelta(hours=1)


def two_jobs_on(node_id: str, *, kind: str, price: float, node_gpus: int = 0) -> list:
    events = []
    for job in ("j1", "j2"):
        events += [placed(job, nodes=(node_id,)),
                   started(job, node_id=node_id, at=T0).model_copy(update={
                       "node_kind": kind, "price_per_hour": price, "gpu_count": 1, "node_gpu_count": node_gpus}),
                   exited(job, node_id=node_id, at=T0 + HOUR)]
    return events


async def test_two_one_gpu_jobs_on_a_rented_two_gpu_node_pay_its_price_once(billing):
    broker, service, _ = billing
    await publish(broker, NodeProvisioned(event_id="od:provisioned", node_id="od", instance_type="x2",
                                          provider="fake", price_per_hour=4.0, gpu_count=2, provisioned_at=T0,
                                          for_job_id="j1", project_id="p", user_name="ana"))
    for event in two_jobs_on("od", kind="on_demand", price=4.0):
        await publish(broker, event)
    await publish(broker, NodeReleased(event_id="od:released", node_id="od", released_at=T0 + HOUR, reason="idle"))
    assert sorted(line["cost"] for line in service.ledger.docs.values()) == [2.0, 2.0]
    report = await service.usage(UsageQuery(project_id="p"))
    assert report.total.on_demand_cost == pytest.approx(4.0) == pytest.approx(report.on_demand.cost)
    assert report.on_demand.idle_cost == pytest.approx(0)


async def test_an_owned_node_charges_each_attempt_its_share(billing):
    broker, service, _ = billing
    await publish(broker, NodeRegistered(event_id="ws:boot", occurred_at=T0, node=node(node_id="ws", gpus=2,
                                                                                         price=1.0), boot_id="b"))
    for event in two_jobs_on("ws", kind="local", price=1.0):  # the agent did not say; billing knows the node
        await publish(broker, event)
    assert sorted(line["cost"] for line in service.ledger.docs.values()) == [0.5, 0.5]
    report = await service.usage(UsageQuery(project_id="p"))
    assert report.total.owned_cost == pytest.approx(1.0)


async def test_the_node_size_the_agent_reports_is_used_when_billing_has_not_seen_the_node(billing):
    broker, service, _ = billing
    for event in two_jobs_on("n8", kind="local", price=8.0, node_gpus=8):
        await publish(broker, event)
    assert sorted(line["cost"] for line in service.ledger.docs.values()) == [1.0, 1.0]


async def test_a_rented_node_half_used_is_charged_half_idle_to_whoever_rented_it(billing):
    broker, service, _ = billing
    await publish(broker, NodeProvisioned(event_id="od:provisioned", node_id="od", instance_type="x2",
                                          provider="fake", price_per_hour=4.0, gpu_count=2, provisioned_at=T0,
                                          for_job_id="j1", project_id="p", user_name="ana"))
    for event in two_jobs_on("od", kind="on_demand", price=4.0)[:3]:  # one 1-GPU job of bob's
        await publish(broker, event.model_copy(update={"user_name": "bob"}) if hasattr(event, "user_name")
                      else event)
    await publish(broker, NodeReleased(event_id="od:released", node_id="od", released_at=T0 + HOUR, reason="idle"))
    report = await service.usage(UsageQuery(project_id="p"))
    assert report.on_demand.idle_cost == pytest.approx(2.0)
    by_user = {r.key: r for r in report.by_user}
    assert by_user["ana"].on_demand_cost == pytest.approx(2.0)  # the idle GPU of the node ana's job asked for
    assert by_user["ana"].on_demand_seconds == pytest.approx(1800)  # half the node for the hour, in node-seconds
    assert report.total.on_demand_cost == pytest.approx(4.0)


def test_a_share_is_by_gpus_and_the_whole_node_without_them():
    assert share_per_hour(4.0, gpus=1, node_gpus=2) == 2.0
    assert share_per_hour(4.0, gpus=0, node_gpus=2) == 4.0  # a CPU job takes the node, as placement prices it
    assert share_per_hour(4.0, gpus=1, node_gpus=0) == 4.0  # node size unknown: the node's price
