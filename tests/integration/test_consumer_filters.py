"""A state machine's jobs consumer is delivered only the events its service handles, under its own credentials,
also when an earlier version created it for the whole jobs stream."""

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from shared import busroles
from shared.bus import connect, make_broker, publish
from shared.events import JobStatusChanged
from shared.jobs import Phase, SecondaryPhase
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


async def test_an_earlier_whole_stream_consumer_is_narrowed_at_start_and_keeps_its_backlog_in_order(server):
    role = "monitor"
    nc = await nats.connect(
        server.nats_url, user_credentials=str(server.identities.creds(role)), inbox_prefix=busroles.inbox(role)
    )
    await nc.jetstream(timeout=2).add_consumer(  # as the version before created it, under the same credentials
        "TM_JOBS",
        config=ConsumerConfig(
            name="monitor-jobs", durable_name="monitor-jobs", filter_subject="tm.job.>", ack_policy=AckPolicy.EXPLICIT
        ),
    )
    await nc.close()
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    job = unique("j")
    for event in (submitted(job_id=job), status(job), started(job, node_id="n1")):
        await publish(operator, event)
    await operator.stop()

    monitor = make_broker(server.nats_url, name=role, creds=server.identities.creds(role))
    await connect(monitor, declare=False)
    await MONITOR_JOBS.resume(monitor)
    info = await monitor.config.connection_state.stream.consumer_info("TM_JOBS", "monitor-jobs")
    await monitor.stop()

    assert sorted(info.config.filter_subjects or ()) == sorted(MONITOR_JOBS.subscription["config"].filter_subjects)
    got = await delivered(server, role, "monitor-jobs")
    assert [b'"JobSubmitted"' in m for m in got] == [True, False]  # the status it publishes itself: not sent
    assert b'"TaskStarted"' in got[1]


async def test_a_new_jobs_consumer_is_created_narrow_under_the_services_credentials(server):
    placement = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))
    seen: list[str] = []

    @placement.subscriber(**PLACEMENT_JOBS.subscription)
    async def on_event(event: dict) -> None:
        seen.append(event["type"])

    await connect(placement, declare=False)
    await placement.start()
    info = await placement.config.connection_state.stream.consumer_info("TM_JOBS", "placement-jobs")
    await placement.stop()
    assert info.config.filter_subjects == ["tm.job.deleted", "tm.job.status", "tm.job.submitted"]
