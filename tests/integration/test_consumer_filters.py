"""A service's consumers are the platform's: declared (and narrowed to what its handlers handle) by the operator,
bound to unchanged by the service, whatever version of it starts; a service started before the declaration waits
for it and says what is missing."""

import asyncio
import json
import logging

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared import busroles
from shared.bus import (
    ACK_WAIT_S,
    JOB_EVENTS_MAX_AGE_S,
    NODE_COMMANDS_MAX_AGE_S,
    RENTED_CONSUMER_INACTIVE_S,
    Shrinking,
    agent_consumer_config,
    connect,
    filters_of,
    make_broker,
    publish,
)
from shared.bustopology import bound
from shared.events import ALL_STATUSES, PLACEMENT_STATUSES, JobDeleted, JobEvent, JobStatusChanged, JobSubmitted
from shared.jobs import Phase, SecondaryPhase
from shared.keyed import keyed_durable
from services.monitor.handlers import JOBS as MONITOR_JOBS
from services.placement.handlers import JOBS as PLACEMENT_JOBS
from services.stack.identities import prepare_bus
from tests.factories import started, submitted, unique
from tests.integration.servers import real_servers
from tests.integration.test_output_origin import until

pytestmark = pytest.mark.integration
CLUSTER = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n'

PLACEMENT_FILTERS = sorted(["tm.job.deleted", *PLACEMENT_STATUSES, "tm.job.submitted"])  # as the operator declares it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("filters"), cluster=CLUSTER) as stack:
        yield stack


def status(
    job_id: str, *, version: int = 1, phase: Phase = Phase.PENDING, secondary: SecondaryPhase = SecondaryPhase.QUEUING
) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=version,
        phase=phase,
        secondary_phase=secondary,
    )


async def made_as_before(js, name: str, **config) -> None:
    """A jobs consumer as an earlier version made it (replacing the declared one)."""
    await js.delete_consumer("TM_JOBS", name)
    await js.add_consumer(
        "TM_JOBS", config=ConsumerConfig(name=name, durable_name=name, ack_policy=AckPolicy.EXPLICIT, **config)
    )


async def test_statuses_an_earlier_monitor_published_still_reach_their_readers_after_the_upgrade(server):
    """Before the phase was in a status's subject, the monitor published every status on `tm.job.status` and each
    reader's consumer read that subject whole. Statuses still in the stream when the platform is upgraded are read
    by the new declaration's consumers (the legacy subject is among their filters); a new status is delivered only
    to the readers of its phase."""

    async def as_before(js) -> None:
        old_filters = ["tm.job.deleted", "tm.job.placed", "tm.job.status", "tm.job.submitted"]
        await made_as_before(js, "estimator-jobs", filter_subjects=old_filters)
        await made_as_before(js, "submitter-status", filter_subject="tm.job.status", max_ack_pending=1000)

    await as_operator(server, as_before)
    job = unique("j")
    legacy = status(job).model_copy(update={"event_id": f"{job}:status:legacy"})
    nc = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    await nc.jetstream().publish("tm.job.status", legacy.model_dump_json().encode())
    await nc.close()
    await asyncio.to_thread(server.prepare_bus)  # the upgrade's declaration
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    running = status(job, version=2, phase=Phase.RUNNING, secondary=SecondaryPhase.RUNNING)
    done = status(job, version=3, phase=Phase.COMPLETED, secondary=SecondaryPhase.COMPLETED)
    for event in (running, done):
        await publish(operator, event)
    await operator.stop()

    ids = [json.loads(m)["event_id"] for m in await delivered(server, "estimator", "estimator-jobs")]
    assert [i for i in ids if i.startswith(job)] == [legacy.event_id, done.event_id]  # not the Running one
    assert await filters(server, "submitter-status") == sorted(ALL_STATUSES)
    ids = [json.loads(m)["event_id"] for m in await delivered(server, "submitter", "submitter-status")]
    assert [i for i in ids if i.startswith(job)] == [legacy.event_id, running.event_id, done.event_id]


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
        found.extend(filters_of(info.config))

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
        await made_as_before(js, "monitor-jobs", filter_subject="tm.job.>")

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


async def test_a_replica_of_another_version_neither_binds_to_the_declared_consumer_nor_changes_it(server):
    """In a rolling deploy an old replica's start used to put its own filter back on the shared jobs consumer (and
    the next new one narrowed it again): now neither may change it. One whose filter is not the declared one does
    not read it (it would take events it has no handler for): it waits, saying so, and gives up."""
    declared = await filters(server, "placement-jobs")
    assert declared == PLACEMENT_FILTERS
    older = keyed_durable("tm.job.>", consumer="placement-jobs", event=JobSubmitted, handles={JobSubmitted: None})
    placement = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))

    @placement.subscriber(**older.subscription)
    async def on_event(event: dict) -> None:
        pass

    await connect(placement)
    with pytest.raises(
        RuntimeError, match=r"placement-jobs of TM_JOBS as this version reads it \(\['tm.job.submitted'\]"
    ):
        await bound(placement, patience_s=0)
    await placement.stop()
    assert await filters(server, "placement-jobs") == PLACEMENT_FILTERS
    assert PLACEMENT_JOBS.subscription["config"].filter_subjects == declared


async def test_a_replica_of_the_version_before_gives_back_what_a_wider_declaration_sends_it(server):
    """A deploy's declaration widens a jobs consumer while a replica of the version before still reads it. That
    replica used to drop the event its table names no handler for (acknowledged, or rejected as no event of its
    type), so the new version's replica never saw it. Now it gives it back, and the new replica handles it."""
    job = unique("j")
    older = keyed_durable("tm.job.>", consumer="placement-jobs", event=JobEvent, handles={JobSubmitted: None})
    newer = keyed_durable(
        "tm.job.>",
        consumer="placement-jobs",
        event=JobEvent,
        handles={JobSubmitted: None, JobStatusChanged: None, JobDeleted: None},
        narrowed={JobStatusChanged: PLACEMENT_STATUSES},
    )
    assert newer.subscription["config"].filter_subjects == await filters(server, "placement-jobs")
    old = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))

    @old.subscriber(**older.subscription)
    async def on_old(event: JobEvent) -> None:
        pass

    await connect(old)
    await old.start()  # it was reading before the declaration widened its consumer
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    for event in (submitted(job_id=job), status(job)):
        await publish(operator, event)
    streams = operator.config.connection_state.stream
    last = (await streams.stream_info("TM_JOBS")).state.last_seq

    async def delivered_to_old() -> bool:
        return (await streams.consumer_info("TM_JOBS", "placement-jobs")).delivered.stream_seq >= last

    assert await until(delivered_to_old)
    await old.stop()

    new = make_broker(server.nats_url, name="placement", creds=server.identities.creds("placement"))
    seen: list[tuple[str, str]] = []

    @new.subscriber(**newer.subscription)
    async def on_new(event: JobEvent) -> None:
        seen.append((event.job_id, type(event).__name__))

    await connect(new)
    await bound(new, patience_s=5)
    await new.start()

    async def handled() -> bool:
        return (job, "JobStatusChanged") in seen

    # the old replica may have stopped before its give-back reached the server: then the server redelivers it once
    # the ack wait has run out, so the wait covers that too
    assert await until(handled, tries=int((ACK_WAIT_S + 10) / 0.1))
    await new.stop()
    await operator.stop()


async def test_the_declaration_deletes_the_consumers_no_one_may_keep_and_makes_rented_nodes_expire(server):
    """Consumers made under the credentials of an earlier version (any service could make any) survived every
    declaration: a push consumer sending a node's commands (job secrets) into placement's inbox, one of a declared
    name turned into a push consumer, one reading every node's commands. Rented nodes' stayed forever. A pull
    consumer no identity may read goes only when pruning (a rollback's declaration deleted the newer version's)."""
    rented, other, odd = unique("od"), unique("od"), unique("od")
    spy = "_INBOX_placement.spy"

    async def plant(js) -> None:
        await js.delete_consumer("TM_JOBS", "estimator-placed")
        planted = [
            ("TM_NODE_CMD", "agent-spy", {"deliver_subject": spy, "filter_subject": "tm.node.cmd.n1.>"}),
            ("TM_JOBS", "estimator-placed", {"deliver_subject": spy, "filter_subject": "tm.job.placed"}),
            ("TM_JOBS", "estimator-extra", {"filter_subject": "tm.job.>"}),
            ("TM_NODE_CMD", f"agent-{other}", {"filter_subject": "tm.node.cmd.>"}),
            # a node's filter, but only what comes after it: no update can make it a rented node's
            (
                "TM_NODE_CMD",
                f"agent-{odd}",
                {"filter_subject": f"tm.node.cmd.{odd}.>", "deliver_policy": DeliverPolicy.NEW},
            ),
        ]
        for stream, name, config in planted:
            await js.add_consumer(stream, config=ConsumerConfig(name=name, durable_name=name, **config))
        await js.add_consumer("TM_NODE_CMD", config=agent_consumer_config(rented))  # made before they expired

    await as_operator(server, plant)
    await asyncio.to_thread(server.prepare_bus)
    consumers: dict[str, ConsumerConfig] = {}

    async def read(js) -> None:
        for stream in ("TM_JOBS", "TM_NODE_CMD"):
            consumers.update({info.name: info.config for info in await js.consumers_info(stream)})

    await as_operator(server, read)
    assert not {"agent-spy", f"agent-{other}", f"agent-{odd}"} & set(consumers)
    assert not any(config.deliver_subject for config in consumers.values())
    assert consumers["estimator-placed"].filter_subject == "tm.job.placed"  # declared again, a pull consumer
    assert consumers[f"agent-{rented}"].inactive_threshold == RENTED_CONSUMER_INACTIVE_S
    assert consumers["agent-n1"].inactive_threshold is None  # a static node's waits for its agent whatever the time
    # a pull consumer no identity may read (a newer version's after a rollback, an operator's) stays unless pruned
    assert "estimator-extra" in consumers
    await prepare_bus(
        server.nats_url,
        creds=server.admin_creds(),
        node_ids=server.node_ids(),
        replicas=server.stream_replicas,
        log_max_bytes=server.settings.log_stream_max_bytes,
        prune=True,
    )
    consumers.clear()
    await as_operator(server, read)
    assert "estimator-extra" not in consumers and f"agent-{rented}" in consumers and "agent-n1" in consumers


async def test_a_declaration_that_would_shrink_a_stream_is_refused_naming_the_setting(server):
    async def kept() -> int:
        found: list[int] = []

        async def read(js) -> None:
            found.append((await js.stream_info("TM_LOGS")).config.max_bytes)

        await as_operator(server, read)
        return found[0]

    before = await kept()
    with pytest.raises(Shrinking, match=r"TM_LOGS has max_bytes=.*TRAINMASTER_LOG_STREAM_MAX_BYTES"):
        await prepare_bus(server.nats_url, creds=server.admin_creds(), node_ids=["n1"], log_max_bytes=before // 2)
    assert await kept() == before
    await prepare_bus(server.nats_url, creds=server.admin_creds(), node_ids=["n1"], log_max_bytes=before, shrink=True)


@pytest.mark.parametrize(
    ("stream", "limit"), [("TM_JOBS", JOB_EVENTS_MAX_AGE_S), ("TM_NODE_CMD", NODE_COMMANDS_MAX_AGE_S)]
)
async def test_a_stream_declared_without_an_age_limit_by_an_older_version_gets_one(server, stream, limit):
    # they kept every event of every job, and every command (a job's environment in each start), for ever
    ages: list[float] = []

    async def unlimited(js) -> None:
        config = (await js.stream_info(stream)).config
        config.max_age = 0
        await js.update_stream(config=config)

    async def read(js) -> None:
        ages.append((await js.stream_info(stream)).config.max_age)

    await as_operator(server, unlimited)
    await as_operator(server, read)
    await prepare_bus(server.nats_url, creds=server.admin_creds(), node_ids=["n1"])  # no --shrink asked for
    await as_operator(server, read)
    assert ages == [0, limit]


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
    assert await filters(server, "placement-jobs") == PLACEMENT_FILTERS
