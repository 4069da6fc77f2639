"""Heartbeats on a real NATS server: core NATS from the agent's identity to the monitor's, never stored."""

import asyncio

import nats
import pytest
from nats.js.errors import NotFoundError

from shared.bus import HEARTBEATS, NODE_CADENCE, NODES, connect, make_broker, publish
from shared.events import NodeCadence, NodeHeartbeat
from services.agent.pace import Pace
from tests.integration.servers import real_servers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cluster = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n'
    with real_servers(tmp_path_factory.mktemp("hb"), cluster=cluster) as stack:
        yield stack


async def test_an_agents_heartbeat_reaches_the_monitor_and_no_stream(server):
    monitor = await nats.connect(
        server.nats_url, user_credentials=str(server.identities.creds("monitor")), inbox_prefix="_INBOX_monitor"
    )
    heard: asyncio.Queue = asyncio.Queue()

    async def on_heartbeat(msg) -> None:
        heard.put_nowait(NodeHeartbeat.model_validate_json(msg.data))

    await monitor.subscribe(HEARTBEATS, cb=on_heartbeat)
    await monitor.flush()
    agent = make_broker(server.nats_url, name="agent-n1", creds=server.identities.creds("agent-n1"))
    await connect(agent, declare=False)
    await publish(agent, NodeHeartbeat(event_id="n1:b:hb:1", node_id="n1", boot_id="b"))
    assert (await asyncio.wait_for(heard.get(), timeout=5)).node_id == "n1"
    admin = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    with pytest.raises(NotFoundError):
        await admin.jetstream().get_last_msg(NODES.name, "tm.node.evt.n1.heartbeat")
    await agent.stop()
    await monitor.close()
    await admin.close()


async def test_the_monitor_tells_agents_the_heartbeat_interval_and_only_the_monitor_may(server):
    """The announcement reaches an agent's identity; an agent's own attempt to announce one is refused by the
    server (an agent that could would slow every other node's heartbeat down, or fence them)."""
    agent = await nats.connect(
        server.nats_url, user_credentials=str(server.identities.creds("agent-n1")), inbox_prefix="_INBOX_agent-n1"
    )
    pace = Pace(2.0)
    heard = asyncio.Event()

    async def on_cadence(msg) -> None:
        if pace.heard(msg.data):
            heard.set()

    await agent.subscribe(NODE_CADENCE, cb=on_cadence)
    await agent.flush()
    errors: list[str] = []

    async def on_error(exc) -> None:
        errors.append(str(exc).lower())

    rogue = await nats.connect(
        server.nats_url,
        user_credentials=str(server.identities.creds("agent-n1")),
        inbox_prefix="_INBOX_agent-n1",
        error_cb=on_error,
    )
    await rogue.publish(NODE_CADENCE, announcement(30.0))
    await rogue.flush()
    await asyncio.sleep(0.5)
    assert not heard.is_set() and pace.interval_s == 2.0
    assert any("permissions violation" in e for e in errors)
    monitor = make_broker(server.nats_url, name="monitor", creds=server.identities.creds("monitor"))
    await connect(monitor, declare=False)
    await publish(monitor, NodeCadence(event_id="c", interval_s=4.0, timeout_s=20.0))
    await asyncio.wait_for(heard.wait(), timeout=5)
    assert pace.interval_s == 4.0
    await monitor.stop()
    await rogue.close()
    await agent.close()


def announcement(interval_s: float) -> bytes:
    return NodeCadence(event_id="rogue", interval_s=interval_s, timeout_s=60.0).model_dump_json().encode()
