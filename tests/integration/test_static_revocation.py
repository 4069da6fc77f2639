"""A start of the stack revokes what earlier starts gave its static identities (the services, the static nodes'
agents, the admin, the minter): their user keys stay from start to start, so a `.creds` file kept from one, copied
off a node taken out of the cluster or minted by a version whose permissions were wider, was good for ever. It is
refused by the server the next start configures, and stays refused in the account the minter pushes after."""

import asyncio
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError

from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port
from tests.integration.servers import running_minter
from tests.integration.test_bus_security import CLUSTER

KEPT = ("agent-n1", "monitor", "admin")


async def connect(stack: Stack, creds: Path) -> nats.NATS:
    return await nats.connect(
        stack.nats_url, user_credentials=str(creds), allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
    )


def started(settings: StackSettings) -> Stack:
    """The stack's NATS server as `Stack.start_all` starts it: the earlier starts' JWTs revoked first."""
    stack = Stack(settings)
    stack.identities.revoke_earlier()
    stack.start_nats()
    return stack


async def test_creds_of_an_earlier_start_are_refused_at_the_next_and_after_the_minters_push(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    settings = StackSettings(
        data_dir=tmp_path / "data",
        nats_port=free_port(),
        nats_url=None,
        mongo_url=None,
        cluster_file=tmp_path / "cluster.toml",
    )
    kept = {identity: tmp_path / f"{identity}.creds" for identity in KEPT}
    first = started(settings)
    try:
        for identity, path in kept.items():
            path.write_text(first.identities.creds(identity).read_text())
            await (await connect(first, path)).close()  # good while its start lasts
    finally:
        first.stop_all()

    await asyncio.sleep(1.1)  # the server counts in seconds: the next start, a second later
    second = started(settings)
    try:
        for path in kept.values():
            with pytest.raises(NatsError, match="Authorization Violation"):
                await connect(second, path)
        for identity in KEPT:  # what this start gives each is good
            await (await connect(second, second.identities.creds(identity))).close()
        async with running_minter(second) as minter:
            await minter.push_pending()  # what it does at its start: the account, re-issued newer
            assert minter.pushed is not None
        for path in kept.values():
            with pytest.raises(NatsError, match="Authorization Violation"):
                await connect(second, path)
        await (await connect(second, second.identities.creds("agent-n1"))).close()
    finally:
        second.stop_all()
