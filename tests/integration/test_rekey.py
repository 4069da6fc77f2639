"""A rented node's start identity (in its EC2 user data, readable by any principal allowed
`ec2:DescribeInstanceAttribute`, for the instance's life; in its Secret; in placement's files) is traded by its
agent for one of a key it made itself, on the real NATS server with the real minter: the start identity is refused
once the agent confirms, the new one speaks for the node alone, a lost answer is asked again for the same key, a
trade to another key revokes the node, and the node's release revokes the new one."""

import asyncio

import nats
import pytest
from nats.errors import Error as NatsError

from shared import busroles
from shared.buscreds import new_seed, public_key
from shared.minting import REKEY_AGENT, REKEY_INBOX, RekeyAgent
from services.agent import rekey as agent_rekey
from services.minter import app as minter_app
from services.placement.providers import NodeCredentials
from tests.factories import unique
from tests.integration.servers import real_servers, running_minter
from tests.integration.test_bus_security import CLUSTER, agent_creds

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


async def started(server, tmp_path, node_id: str, errors: list[str]):
    """The node's start identity as placement issued it, the agent's own copy, and its connection."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    start = await credentials.issue(node_id, tmp_path / "placement")  # what the user data carries
    own = agent_rekey.own_creds(start, data_dir=tmp_path / "node", node_id=node_id)
    return credentials, start, own, await connected_as(server, own, node_id, errors)


async def test_an_agent_trades_its_start_identity_for_its_own_key_and_says_so(server, tmp_path, monkeypatch):
    monkeypatch.setattr(minter_app, "REKEY_HOLD_S", 0.0)  # the node's hold over: the start identity goes at once
    node_id, errors, keyed, stopped = unique("od"), [], [], []
    async with running_minter(server):
        credentials, start, own, agent = await started(server, tmp_path, node_id, errors)
        try:
            started_as = agent_rekey.creds_user(own)
            keying = agent_rekey.Keying()
            assert keying.check() == "this node's agent has not traded the identity it was started with yet"
            await agent_rekey.keep_own_key(
                agent,
                node_id=node_id,
                creds=own,
                given=start,
                keyed=keyed.append,
                stop=lambda: stopped.append(1),
                keying=keying,
            )
            user = agent_rekey.creds_user(own)
            assert user != started_as and agent.is_connected and keyed == [own] and not stopped
            assert keying.done and keying.check() is None  # its own key may ask for its tasks' secrets
            await agent.publish(f"tm.rpc.submitter.secrets.{node_id}", b"{}")  # and the server lets it
            assert agent_rekey.creds_user(start) == started_as  # the given file is as it was: only the copy changes
            assert not own.with_name(f"{own.name}.next").exists()
            assert server.identities.minter().minted[node_id] == [user]
            assert await refused(server, start)  # revoked once the agent said so: the user data is worthless
            await agent.publish(f"tm.node.evt.{node_id}.heartbeat", b"{}")  # the node's own key speaks for it
            await agent.publish(REKEY_AGENT.format(node_id=node_id), b"{}")  # and trades nothing more
            await agent.flush()
            await asyncio.sleep(0.3)
            assert agent.is_connected and errors == [
                f'nats: permissions violation for publish to "{REKEY_AGENT.format(node_id=node_id)}"'
            ], errors
            # a restarted agent finds its trade done (its copy is not the given file): it only says so again
            await agent_rekey.keep_own_key(agent, node_id=node_id, creds=own, given=start)
            assert agent_rekey.creds_user(own) == user
            await credentials.revoke(node_id, tmp_path / "placement")  # the node's release
            assert await refused(server, own)  # revokes the agent's own key too
        finally:
            await agent.close()


async def test_a_lost_answer_is_asked_again_for_the_same_key_and_signed_again(server, tmp_path, monkeypatch):
    monkeypatch.setattr(minter_app, "REKEY_HOLD_S", 0.0)
    node_id, errors = unique("od"), []
    async with running_minter(server):
        credentials, start, own, agent = await started(server, tmp_path, node_id, errors)
        try:
            seed = agent_rekey.pending_seed(own)  # made once, kept until the trade is written
            request = RekeyAgent(node_id=node_id, user=public_key(seed))
            await agent_rekey.ask(agent, REKEY_AGENT.format(node_id=node_id), request, node_id=node_id)  # lost
            assert agent_rekey.creds_user(own) != public_key(seed)
            await agent_rekey.keep_own_key(
                agent, node_id=node_id, creds=own, given=start, stop=lambda: pytest.fail("stopped")
            )
            assert agent_rekey.creds_user(own) == public_key(seed) == server.identities.minter().minted[node_id][-1]
            assert await refused(server, start)
        finally:
            await agent.close()
            await credentials.revoke(node_id, tmp_path / "placement")


async def test_a_start_identity_traded_for_another_key_revokes_the_node(server, tmp_path):
    """Whoever read the user data traded first: the agent's own trade finds another key, the minter revokes the
    node (both keys), and the agent stops."""
    node_id, errors, stopped = unique("od"), [], []
    async with running_minter(server):
        credentials, start, own, agent = await started(server, tmp_path, node_id, errors)
        thief = await connected_as(server, start, node_id, [])
        try:
            theirs = RekeyAgent(node_id=node_id, user=public_key(new_seed("user")))
            await agent_rekey.ask(thief, REKEY_AGENT.format(node_id=node_id), theirs, node_id=node_id)
            await agent_rekey.keep_own_key(
                agent, node_id=node_id, creds=own, given=start, stop=lambda: stopped.append(1)
            )
            assert stopped == [1] or agent.is_closed  # refused, or cut by the node's revocation first
            assert node_id not in server.identities.minter().minted
            assert await refused(server, start)
        finally:
            await thief.close()
            await agent.close()


async def test_a_thief_who_traded_and_confirmed_first_is_caught_when_the_agent_trades_within_the_hold(server, tmp_path):
    """Whoever read the user data traded and confirmed while the machine booted: the start identity stays good for
    the node's hold, so the agent's own trade finds the thief's key and the node is revoked (both keys): the theft
    fails closed instead of locking the agent out."""
    node_id, errors, stopped = unique("od"), [], []
    async with running_minter(server):
        credentials, start, own, agent = await started(server, tmp_path, node_id, errors)
        thief_dir = tmp_path / "thief"
        thief_own = agent_rekey.own_creds(start, data_dir=thief_dir, node_id=node_id)
        thief = await connected_as(server, thief_own, node_id, [])
        try:
            await agent_rekey.keep_own_key(thief, node_id=node_id, creds=thief_own, given=start)
            assert agent_rekey.creds_user(thief_own) == server.identities.minter().minted[node_id][-1]
            assert not await refused(server, start)  # within the hold: not yet revoked
            await agent_rekey.keep_own_key(
                agent, node_id=node_id, creds=own, given=start, stop=lambda: stopped.append(1)
            )
            assert stopped == [1] or agent.is_closed
            assert node_id not in server.identities.minter().minted
            assert await refused(server, start) and await refused(server, thief_own)
        finally:
            await thief.close()
            await agent.close()


async def test_the_minter_answers_a_trade_in_that_nodes_answer_space_only(server, tmp_path):
    """An agent aiming the answer at another node's answer space gets nothing signed."""
    node_id, errors = unique("od"), []
    async with running_minter(server):
        credentials, _, _, agent = await started(server, tmp_path, node_id, errors)
        try:
            body = RekeyAgent(node_id=node_id, user=public_key(new_seed("user"))).model_dump_json().encode()
            other = f"{REKEY_INBOX.format(node_id='od-other')}.x"
            await agent.publish(REKEY_AGENT.format(node_id=node_id), body, reply=other)
            await agent.flush()
            await asyncio.sleep(0.5)
            assert node_id not in server.identities.minter().rekeyed
        finally:
            await agent.close()
            await credentials.revoke(node_id, tmp_path / "placement")


async def test_a_static_node_has_no_start_identity_to_trade(server, tmp_path):
    errors: list[str] = []
    async with running_minter(server):
        agent = await connected_as(server, agent_creds(server, "n1"), "n1", errors)
        try:
            with pytest.raises(agent_rekey.RekeyRefused, match="node of the cluster file") as refusal:
                await agent_rekey.trade(agent, node_id="n1", creds=tmp_path / "n1.creds")
            assert refusal.value.final and not (tmp_path / "n1.creds").exists()
        finally:
            await agent.close()
