"""Heartbeats on a real NATS server: core NATS from the agent's identity to the monitor's, never stored."""
import asyncio

import nats
import pytest
from nats.js.errors import NotFoundError

from shared.bus import HEARTBEATS, NODES, connect, make_broker, publish
from shared.events import NodeHeartbeat
from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("hb")
    (data / "cluster.toml").write_text('[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n')
    stack = Stack(StackSettings(data_dir=data / "data", nats_port=free_port(), nats_url=None,
                                cluster_file=data / "cluster.toml"))
    stack.start_nats()
    stack.prepare_bus()
    yield stack
    stack.stop_all()


async def test_an_agents_heartbeat_reaches_the_monitor_and_no_stream(server):
    monitor = await nats.connect(server.nats_url, user_credentials=str(server.identities.creds("monitor")),
                                 inbox_prefix="_INBOX_monitor")
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
