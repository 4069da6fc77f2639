"""A fixed-subject consumer's replica meets an event type its version does not know (a rolling deploy adding one):
given back for the newer replica where a platform service publishes, dropped where an agent may publish."""

import asyncio
import json
from dataclasses import dataclass

import pytest
from faststream.nats import NatsBroker
from nats.js.api import ConsumerInfo

from shared import unknowntypes
from shared.bus import connect, make_broker
from shared.bustopology import CONSUMERS, bound
from shared.events import NodeEvent
from services.placement.handlers import JOBS as PLACEMENT_JOBS
from tests.factories import unique
from tests.integration.servers import real_servers
from tests.integration.test_consumer_filters import CLUSTER
from tests.integration.test_output_origin import until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("unknown"), cluster=CLUSTER) as stack:
        yield stack


def declared(role: str, consumer: str) -> dict:
    return next(s for s in CONSUMERS[role] if s["durable"] == consumer)


def envelope(kind: str) -> dict:
    """A newer version's event: the envelope every event has, of a type this version does not know."""
    return {"type": kind, "event_id": unique(kind), "occurred_at": "2026-11-27T10:00:00Z", "node_id": "n1"}


@dataclass
class Read:
    """The consumer a replica of this version read the payload from (the stream's last message, `last`)."""

    operator: NatsBroker
    stream: str
    consumer: str
    last: int

    async def info(self) -> ConsumerInfo:
        return await self.operator.config.connection_state.stream.consumer_info(self.stream, self.consumer)


async def read_by_old(server, *, role: str, subscription: dict, subject: str, payload: dict) -> Read:
    """Publish `payload` on `subject`; a replica of this version reads the consumer until the server delivered it,
    then stops (its decision, ack, term or nak, given the time to reach the server)."""
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    js = operator.config.connection_state.stream
    stream = subscription["stream"].name
    await js.purge_stream(stream)  # what earlier tests left held (an ordered consumer would wait behind it)
    await js.publish(subject, json.dumps(payload).encode(), headers={"Nats-Msg-Id": payload["event_id"]})
    read = Read(operator, stream, subscription["durable"], (await js.stream_info(stream)).state.last_seq)
    old = make_broker(server.nats_url, name=role, creds=server.identities.creds(role))

    @old.subscriber(**subscription)
    async def on_old(event: NodeEvent) -> None:
        pass

    await connect(old)
    await bound(old, patience_s=5)
    await old.start()

    async def delivered_to_old() -> bool:
        return (await read.info()).delivered.stream_seq >= read.last

    assert await until(delivered_to_old)
    await asyncio.sleep(0.3)  # its decision (ack, term or nak) reaches the server
    await old.stop()
    return read


async def read_in_turn(server, *, role: str, subscription: dict, subject: str, payload: dict) -> list[dict]:
    """`read_by_old`, then a replica of a newer version (a decoder that takes any payload) reads the consumer: what
    the newer one was delivered."""
    read = await read_by_old(server, role=role, subscription=subscription, subject=subject, payload=payload)
    new = make_broker(server.nats_url, name=role, creds=server.identities.creds(role))
    seen: list[dict] = []

    @new.subscriber(**{**subscription, "decoder": None})
    async def on_new(event: dict) -> None:
        seen.append(event)

    await connect(new)
    await new.start()

    async def given_to_new() -> bool:
        return any(e.get("event_id") == payload["event_id"] for e in seen)

    await until(given_to_new, tries=40)
    await new.stop()
    await read.operator.stop()
    return [e for e in seen if e.get("event_id") == payload["event_id"]]


async def dropped_by_old(server, *, role: str, subscription: dict, subject: str, payload: dict) -> None:
    """`read_by_old`, then the server's word that the payload is done with: its consumer's ack floor at or past it
    (acknowledged or terminated), nothing left to deliver nor awaiting an ack. The server offers such a message to
    no replica again, so no newer one need be waited for (an absence proved by waiting it out took 4 s a test)."""
    read = await read_by_old(server, role=role, subscription=subscription, subject=subject, payload=payload)

    async def done_with() -> bool:
        info = await read.info()
        return info.ack_floor.stream_seq >= read.last and info.num_pending == 0 and info.num_ack_pending == 0

    try:
        assert await until(done_with), await read.info()
    finally:
        await read.operator.stop()


@pytest.mark.parametrize(
    ("role", "subscription", "subject"),
    [
        ("monitor", declared("monitor", "monitor-nodes"), "tm.node.evt.drained"),
        ("billing", declared("billing", "billing-fleet"), "tm.node.evt.drained"),
        ("submitter", declared("submitter", "submitter-status"), "tm.job.status.Running.Running"),
        ("placement", PLACEMENT_JOBS.subscription, "tm.job.status.Running.Running"),
    ],
    ids=["unordered", "ordered", "submitter", "keyed"],
)
async def test_a_replica_of_the_version_before_gives_back_a_platform_event_of_a_type_it_does_not_know(
    server, role, subscription, subject
):
    """It used to acknowledge it as no event of its own (rejected): the newer replica never saw it."""
    payload = envelope(unique("NodeDrained"))
    got = await read_in_turn(server, role=role, subscription=subscription, subject=subject, payload=payload)
    assert [e["type"] for e in got] == [payload["type"]]


async def test_an_unknown_type_on_a_nodes_own_subject_is_dropped_not_held(server):
    """What an agent may publish: its garbage never holds a consumer back (agents come after their readers)."""
    payload = envelope(unique("NodeDrained"))
    await dropped_by_old(
        server,
        role="monitor",
        subscription=declared("monitor", "monitor-nodes"),
        subject="tm.node.evt.n1.interrupted",
        payload=payload,
    )


async def test_an_unknown_type_no_newer_replica_took_in_time_is_dropped(server, monkeypatch):
    """The bound on what a platform service's unknown type may hold back: its age by the server's clock."""
    monkeypatch.setattr(unknowntypes, "UNKNOWN_TYPE_PATIENCE_S", 0.0)
    payload = envelope(unique("NodeDrained"))
    subscription = declared("billing", "billing-fleet")  # in order: one held would hold back all after it
    await dropped_by_old(
        server, role="billing", subscription=subscription, subject="tm.node.evt.drained", payload=payload
    )
