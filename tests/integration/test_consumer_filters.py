"""A service's consumers are the platform's: declared (and narrowed to what its handlers handle) by the operator,
bound to unchanged by the service, whatever version of it starts; a service started before the declaration waits
for it and says what is missing."""

import asyncio
import logging

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from shared import busroles
from shared.bus import connect, make_broker, publish
from shared.bustopology import bound
from shared.events import JobStatusChanged, JobSubmitted
from shared.jobs import Phase, SecondaryPhase
from shared.keyed import keyed_durable
from services.monitor.handlers import JOBS as MONITOR_JOBS
from services.placement.handlers import JOBS as PLACEMENT_JOBS
from tests.factories import started, submitted, unique
from tests.integration.servers import real_servers

pytestmark = pytest.mark.integration
CLUSTER = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("filters"), cluster=CLUSTER) as stack:
        yield stack


def status(job_id: str) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:1",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=1,
        phase=Phase.PENDING,
        secondary_phase=SecondaryPhase.QUEUING,
    )


async def as_operator(server, act) -> None:
    nc = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    try:
        await act(nc.jetstream(timeout=2))
    finally:
        await nc.close()


async def filters(server, consumer: str, stream: str = "TM_JOBS") -> list[str]:
    found: list[str] = []

    async def read(js) -> None:
        info = await js.consumer_info(stream, consumer)
        found.extend(sorted(info.config.filter_subjects or ()) or [info.config.filter_subject])

    await as_operator(server, read)
    return found


async def delivered(server, role: str, consumer: str) -> list[bytes]:
    """What the role's consumer delivers now, read with the role's own credentials."""
    nc = await nats.connect(
        server.nats_url, user_credentials=str(server.identities.creds(role)), inbox_prefix=busroles.inbox(role)
    )
    try:
        subscription = await nc.jetstream(timeout=2).pull_subscribe_bind(consumer, stream="TM_JOBS")
        messages = []
        for _ in range(10):  # a fetch may return part of what waits
            try:
                batch = await subscription.fetch(batch=100, timeout=1)
            except TimeoutError:
                break
            for m in batch:
                await m.ack()
            messages += [m.data for m in batch]
        return messages
    finally:
        await nc.close()


async def test_an_earlier_whole_stream_consumer_is_narrowed_by_the_declaration_and_keeps_its_backlog_in_order(server):
    async def as_before(js) -> None:  # as the version before created it
        await js.delete_consumer("TM_JOBS", "monitor-jobs")
        await js.add_consumer(
            "TM_JOBS",
            config=ConsumerConfig(
                name="monitor-jobs",
                durable_name="monitor-jobs",
                filter_subject="tm.job.>",
                ack_policy=AckPolicy.EXPLICIT,
            ),
        )

    await as_operator(server, as_before)
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    job = unique("j")
    for event in (submitted(job_id=job), status(job), started(job, node_id="n1")):
        await publish(operator, event)
    await operator.stop()

    await asyncio.to_thread(server.prepare_bus)  # the next deploy's declaration

    assert await filters(server, "monitor-jobs") == sorted(MONITOR_JOBS.subscription["config"].filter_subjects)
    got = await delivered(server, "monitor", "monitor-jobs")
    assert [b'"JobSubmitted"' in m for m in got] == [True, False]  # the status it publishes itself: not sent
    assert b'"TaskStarted"' in got[1]


async def test_a_replica_of_another_version_binds_to_the_declared_consumer_and_cannot_change_it(server):
    """In a rolling deploy an old replica's start used to put its own filter back on the shared jobs consumer (and
    the next new one narrowed it again): now neither may change it, both bind to the one the operator declared."""
    declared = await filters(server, "placement-jobs")
    assert declared == ["tm.job.deleted", "tm.job.status", "tm.job.submitted"]
    older = keyed_durable("tm.job.>", consumer="placement-jobs", event=JobSubmitted, handles={JobSubmitted: None})
    placement = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))
    seen: list[str] = []

    @placement.subscriber(**older.subscription)
    async def on_event(event: dict) -> None:
        seen.append(event["type"])

    await connect(placement)
    await bound(placement, patience_s=5)
    await older.resume(placement)
    await placement.start()
    await placement.stop()
    assert await filters(server, "placement-jobs") == declared
    assert PLACEMENT_JOBS.subscription["config"].filter_subjects == declared


async def test_a_service_started_before_the_bus_is_declared_waits_saying_what_is_missing(server, caplog):
    placement = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))

    @placement.subscriber(**PLACEMENT_JOBS.subscription)
    async def on_event(event: dict) -> None:
        pass

    await as_operator(server, lambda js: js.delete_consumer("TM_JOBS", "placement-jobs"))
    await connect(placement)
    with pytest.raises(RuntimeError, match="consumer placement-jobs of TM_JOBS missing"):
        await bound(placement, patience_s=0)
    with caplog.at_level(logging.WARNING, logger="shared.bustopology"):
        waiting = asyncio.create_task(bound(placement, patience_s=60))
        await asyncio.sleep(0.5)
        assert not waiting.done() and "the bus is not declared yet" in caplog.text
        await asyncio.to_thread(server.prepare_bus)
        await asyncio.wait_for(waiting, timeout=10)
    await placement.start()  # binds to the declared consumer
    await placement.stop()
    assert await filters(server, "placement-jobs") == ["tm.job.deleted", "tm.job.status", "tm.job.submitted"]
