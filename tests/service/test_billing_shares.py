"""Attempts side by side on one multi-GPU node pay their GPUs' share of its price (as placement prices them), so
together they pay the node's price once, and a rented node's lifetime is not counted twice with them."""

from datetime import timedelta

import pytest

from shared.bus import publish
from shared.events import NodeRegistered, NodeReleased
from shared.rpc import UsageQuery
from tests.factories import T0, exited, node, placed, provisioned, started, submitted
from tests.service.test_billing_lifetimes import deliver

HOUR = timedelta(hours=1)


def two_jobs_on(
    node_id: str,
    *,
    kind: str,
    price: float,
    node_gpus: int = 0,
    user: str = "alice",
    jobs: tuple[str, ...] = ("j1", "j2"),
) -> list:
    """1-GPU jobs placed side by side on a node placement recorded at `price` with `node_gpus` GPUs (0: not
    said), each an hour; their agent claims a node of its own making (8 GPUs at $100/h, local), which billing
    does not read."""
    claim = {"node_kind": "local", "price_per_hour": 100.0, "gpu_count": 1, "node_gpu_count": 8}
    return (
        [submitted(job_id=job).model_copy(update={"user_name": user}) for job in jobs]
        + [placed(job, nodes=(node_id,), kind=kind, price=price, node_gpus=node_gpus) for job in jobs]
        + [started(job, node_id=node_id, at=T0).model_copy(update=claim) for job in jobs]
        + [exited(job, node_id=node_id, at=T0 + HOUR) for job in jobs]
    )


async def test_two_one_gpu_jobs_on_a_rented_two_gpu_node_pay_its_price_once(billing):
    broker, service, _ = billing
    await publish(
        broker,
        provisioned(),
    )
    await deliver(broker, service, *two_jobs_on("od", kind="on_demand", price=4.0, node_gpus=2))
    await publish(broker, NodeReleased(event_id="od:released", node_id="od", released_at=T0 + HOUR, reason="idle"))
    assert sorted(line["cost"] for line in service.attempts.ledger.docs.values()) == [2.0, 2.0]
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.total.on_demand_cost == pytest.approx(4.0) == pytest.approx(report.on_demand.cost)
    assert report.on_demand.idle_cost == pytest.approx(0)


async def test_an_owned_node_charges_each_attempt_its_share(billing):
    broker, service, _ = billing
    await publish(
        broker,
        NodeRegistered(event_id="ws:boot", occurred_at=T0, node=node(node_id="ws", gpus=2, price=1.0), boot_id="b"),
    )
    await deliver(broker, service, *two_jobs_on("ws", kind="local", price=1.0))
    assert sorted(line["cost"] for line in service.attempts.ledger.docs.values()) == [0.5, 0.5]
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.total.owned_cost == pytest.approx(1.0)


async def test_the_node_placement_recorded_is_charged_not_the_one_the_agent_reports(billing):
    broker, service, _ = billing
    await deliver(broker, service, *two_jobs_on("n4", kind="reserved", price=8.0, node_gpus=4))
    lines = sorted(service.attempts.ledger.docs.values(), key=lambda line: line["job_id"])
    assert [(line["cost"], line["node_kind"], line["node_gpu_count"]) for line in lines] == [(2.0, "reserved", 4)] * 2


async def test_a_rented_node_half_used_is_charged_half_idle_to_whoever_rented_it(billing):
    broker, service, _ = billing
    await publish(
        broker,
        provisioned(),
    )
    await deliver(
        broker, service, *two_jobs_on("od", kind="on_demand", price=4.0, node_gpus=2, user="bob", jobs=("j1",))
    )  # one 1-GPU job of bob's
    await publish(broker, NodeReleased(event_id="od:released", node_id="od", released_at=T0 + HOUR, reason="idle"))
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.on_demand.idle_cost == pytest.approx(2.0)
    by_user = {r.key: r for r in report.by_user}
    assert by_user["ana"].on_demand_cost == pytest.approx(2.0)  # the idle GPU of the node ana's job asked for
    assert by_user["ana"].on_demand_seconds == pytest.approx(1800)  # half the node for the hour, in node-seconds
    assert report.total.on_demand_cost == pytest.approx(4.0)


async def test_a_jobs_cost_so_far_is_its_own_attempts_without_the_rented_nodes_idle_time(billing):
    broker, service, _ = billing
    await publish(
        broker,
        provisioned(),
    )
    await deliver(broker, service, *two_jobs_on("od", kind="on_demand", price=4.0, node_gpus=2, jobs=("j1",)))
    await publish(broker, NodeReleased(event_id="od:released", node_id="od", released_at=T0 + 2 * HOUR, reason="idle"))
    report = await service.reports.usage(UsageQuery(project_id="p", job_id="j1"))
    assert report.total.cost == pytest.approx(2.0) and report.total.attempts == 1
    assert (await service.reports.usage(UsageQuery(project_id="p", job_id="j2"))).total.cost == 0
