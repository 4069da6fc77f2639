"""Facts from the platform, claims from the node, against a real NATS server and database with one agent's real
credentials: billing and placement run as `make run` starts them (their own identities, the cluster file)."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from faststream import TestApp

from shared.bus import connect, make_broker, publish
from shared.events import NodeRegistered
from shared.rpc import UsageQuery
from services.billing.app import BillingSettings, create_app as billing_app
from services.placement.app import PlacementSettings, create_app as placement_app
from services.stack.processes import Stack
from tests.factories import exited, node, placed, started, submitted, unique
from tests.integration.servers import real_servers

pytestmark = pytest.mark.integration
CLUSTER = """
[[nodes]]
id = "n1"
kind = "reserved"
cpu_count = 4
memory_gb = 8
price_per_hour = 0.5
gpus = [{ model = "RTX-4090", memory_gb = 24, tflops = 165, count = 1 }]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("facts"), cluster=CLUSTER, database=True) as stack:
        yield stack


def settings(stack: Stack, kind, identity: str, **extra):
    return kind(
        nats_url=stack.nats_url,
        nats_creds=stack.identities.creds(identity),
        mongo_url=stack.mongo_url_of(identity),
        mongo_db=unique("facts").replace("-", "_"),
        cluster_file=stack.settings.cluster_file,
        data_dir=stack.settings.data_dir,
        **extra,
    )


async def as_identity(stack: Stack, identity: str):
    broker = make_broker(stack.nats_url, name=identity, creds=stack.identities.creds(identity))
    await connect(broker, declare=False)
    return broker


async def until(check, *, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise AssertionError("not seen in time")
        await asyncio.sleep(0.1)
    return found


async def test_an_exit_dated_2100_by_the_placed_nodes_agent_costs_the_seconds_that_passed(stack):
    app = billing_app(settings(stack, BillingSettings, "billing"))
    async with TestApp(app):
        billing = app.broker.context.get("billing")
        job_id = unique("j")
        submitter, placement = await as_identity(stack, "submitter"), await as_identity(stack, "placement")
        agent = await as_identity(stack, "agent-n1")
        begun = datetime.now(UTC)
        await publish(submitter, submitted(job_id=job_id))
        await publish(
            placement,
            placed(job_id, nodes=("n1",), price=0.5).model_copy(update={"occurred_at": begun - timedelta(seconds=1)}),
        )
        await publish(
            agent,
            started(job_id, node_id="n1", at=begun.replace(year=2000)).model_copy(
                update={"price_per_hour": 50_000.0, "gpu_count": 8, "node_gpu_count": 1, "node_kind": "on_demand"}
            ),
        )
        await publish(agent, exited(job_id, node_id="n1", at=begun.replace(year=2100)))
        line = await until(lambda: billing.attempts.ledger.find_one({"job_id": job_id, "ended_at": {"$exists": True}}))
        ended = datetime.now(UTC)
        assert (
            begun - timedelta(seconds=1)
            <= line["started_at"].replace(tzinfo=UTC)
            <= line["ended_at"].replace(tzinfo=UTC)
            <= ended
        )
        assert line["seconds"] < (ended - begun).total_seconds() + 1
        assert (line["gpu_count"], line["node_kind"], line["node_price_per_hour"]) == (1, "local", 0.5)
        report = await billing.reports.usage(UsageQuery(project_id="p"))
        assert report.total.cost < 0.01
        for broker in (submitter, placement, agent):
            await broker.stop()


async def test_a_registration_claiming_eight_big_gpus_does_not_grow_the_node_placement_sees(stack):
    app = placement_app(settings(stack, PlacementSettings, "placement", schedule_tick_s=3600))
    async with TestApp(app):
        service = app.broker.context.get("placement")
        agent = await as_identity(stack, "agent-n1")
        await publish(
            agent,
            NodeRegistered(
                event_id=unique("n1:boot"),
                boot_id="forged",
                node=node(
                    node_id="n1", kind="local", gpus=8, gpu_memory_gb=80, tflops=312, cpu=96, memory_gb=1024, price=0.0
                ),
            ),
        )
        kept = await until(lambda: asyncio.sleep(0, service.fleet.nodes.get("n1")))
        assert (kept.info.kind, kept.info.price_per_hour, len(kept.info.gpus), kept.info.gpus[0].memory_gb) == (
            "reserved",
            0.5,
            1,
            24,
        )
        assert kept.claims_refused["gpus"] == "claimed 8, record 1"
        submitter = await as_identity(stack, "submitter")
        job_id = unique("big")
        await publish(submitter, submitted(job_id=job_id, gpu_count=8))
        await until(lambda: asyncio.sleep(0, job_id in service.queued or None))
        assert await service.schedule_once() == 0 and job_id in service.queued
        await agent.stop()
        await submitter.stop()
