"""A rented node's start identity (in its EC2 user data, readable by any principal allowed
`ec2:DescribeInstanceAttribute`, for the instance's life; in its Secret; in placement's files) is traded by its
agent, once, for one of a key it made itself, on the real NATS server with the real minter: the start identity is
refused once revoked, the new one speaks for the node alone, a second trade is refused, and the node's release
revokes the new one."""

import asyncio

import nats
import pytest
from nats.errors import Error as NatsError

from shared import busroles
from shared.minting import REKEY_AGENT
from services.agent import rekey as agent_rekey
from services.minter import app as minter_app
from services.placement.providers import NodeCredentials
from tests.factories import unique
from tests.integration.servers import real_servers, running_minter
from tests.integration.test_bus_security import CLUSTER
from tests.integration.test_minter import public_key_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("minted_revoked")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("rekey"), cluster=CLUSTER) as stack:
        yield stack


async def connected_as(server, creds, node_id: str, errors: list[str]) -> nats.NATS:
    """An agent's connection: it reconnects, reading its `.creds` again at each connect."""

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    return await nats.connect(
        server.nats_url,
        user_credentials=str(creds),
        inbox_prefix=busroles.inbox(f"agent-{node_id}"),
        max_reconnect_attempts=5,
        reconnect_time_wait=0.1,
        error_cb=on_error,
    )


async def refused(server, creds) -> bool:
    try:
        client = await nats.connect(server.nats_url, user_credentials=str(creds), allow_reconnect=False)
    except (NatsError, OSError):
        return True
    await client.close()
    return False


async def until_refused(server, creds, *, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not await refused(server, creds):
            await asyncio.sleep(0.2)


async def test_an_agent_trades_its_start_identity_for_its_own_key_once(server, tmp_path, monkeypatch):
    monkeypatch.setattr(minter_app, "REKEY_REVOKE_AFTER_S", 1.0)
    node_id, errors = unique("od"), []
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    async with running_minter(server):
        start = await credentials.issue(node_id, tmp_path / "placement")  # what the user data carries
        own = agent_rekey.own_creds(start, data_dir=tmp_path / "node", node_id=node_id)
        started_as = public_key_of(own)
        agent = await connected_as(server, own, node_id, errors)
        try:
            user = await agent_rekey.rekey(agent, node_id=node_id, creds=own)
            assert user == public_key_of(own) != started_as and agent.is_connected
            assert public_key_of(start) == started_as  # the given file is as it was: only the agent's copy changes
            assert server.identities.minter().minted[node_id][-1] == user
            await until_refused(server, start)  # revoked: what the user data holds is worthless
            assert server.identities.minter().minted[node_id] == [user]
            await agent.publish(f"tm.node.evt.{node_id}.heartbeat", b"{}")  # the node's own key speaks for it
            await agent.publish(REKEY_AGENT.format(node_id="od-other"), b"{}")  # and for no other node
            await agent.flush()
            await asyncio.sleep(0.3)
            assert agent.is_connected and errors == [
                f'nats: permissions violation for publish to "{REKEY_AGENT.format(node_id="od-other")}"'
            ], errors
            with pytest.raises(agent_rekey.RekeyRefused, match="own key already"):
                await agent_rekey.rekey(agent, node_id=node_id, creds=tmp_path / "second.creds")
            # whoever traded first holds the node: an agent refused so stops
            agent_rekey.rekeyed_marker(own).unlink()
            stopped: list[bool] = []
            await agent_rekey.keep_own_key(lambda: agent, node_id=node_id, creds=own, stop=lambda: stopped.append(True))
            assert stopped == [True] and public_key_of(own) == user
            await credentials.revoke(node_id, tmp_path / "placement")  # the node's release
            await until_refused(server, own)  # revokes the agent's own key too
        finally:
            await agent.close()


async def test_the_minter_answers_a_rekey_into_that_nodes_agents_inbox_only(server, tmp_path):
    """The minter may answer any reply subject a rekey gives (response permission): an agent aiming its answer at
    another node's agent's inbox gets nothing signed."""
    node_id, errors = unique("od"), []
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    async with running_minter(server):
        start = await credentials.issue(node_id, tmp_path / "placement")
        own = agent_rekey.own_creds(start, data_dir=tmp_path / "node", node_id=node_id)
        agent = await connected_as(server, own, node_id, errors)
        try:
            body = b'{"node_id": "%s", "user": "U%s"}' % (node_id.encode(), b"A" * 55)
            await agent.publish(REKEY_AGENT.format(node_id=node_id), body, reply=busroles.inbox("agent-n1") + ".x")
            await agent.flush()
            await asyncio.sleep(0.5)
            assert node_id not in server.identities.minter().rekeyed
        finally:
            await agent.close()
            await credentials.revoke(node_id, tmp_path / "placement")


async def test_a_static_node_has_no_start_identity_to_trade(server, tmp_path):
    from tests.integration.test_bus_security import agent_creds

    errors: list[str] = []
    async with running_minter(server):
        agent = await connected_as(server, agent_creds(server, "n1"), "n1", errors)
        try:
            with pytest.raises(agent_rekey.RekeyRefused, match="node of the cluster file"):
                await agent_rekey.rekey(agent, node_id="n1", creds=tmp_path / "n1.creds")
            assert not (tmp_path / "n1.creds").exists()
        finally:
            await agent.close()
