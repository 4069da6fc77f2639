"""A start of the stack revokes what earlier starts gave its static identities (the services, the static nodes'
agents, the admin, the minter): their user keys stay from start to start, so a `.creds` file kept from one, copied
off a node taken out of the cluster or minted by a version whose permissions were wider, was good for ever. It is
refused by the server the next start configures, and stays refused in the account the minter pushes after."""

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError

from shared.bus import BUS_CLOSED_EXIT
from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port
from tests.integration.servers import running_minter
from tests.integration.test_bus_security import CLUSTER

KEPT = ("agent-n1", "monitor", "admin")


async def connect(stack: Stack, creds: Path) -> nats.NATS:
    return await nats.connect(
        stack.nats_url, user_credentials=str(creds), allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
    )


def own_stack(tmp_path: Path) -> StackSettings:
    """A stack of the test's own (its NATS server, CLUSTER's nodes), on a free port."""
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    return StackSettings(
        data_dir=tmp_path / "data",
        nats_port=free_port(),
        nats_url=None,
        mongo_url=None,
        cluster_file=tmp_path / "cluster.toml",
    )


def started(settings: StackSettings) -> Stack:
    """The stack's NATS server as `Stack.start_all` starts it: the earlier starts' JWTs revoked first."""
    stack = Stack(settings)
    stack.identities.revoke_earlier()
    stack.start_nats()
    return stack


async def test_creds_of_an_earlier_start_are_refused_at_the_next_and_after_the_minters_push(tmp_path):
    settings = own_stack(tmp_path)
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


# A process of the platform as `shared.service.wire` makes its broker, connected with its own `.creds`.
HOLDER = """
import asyncio, sys, time
from pathlib import Path
from shared import bus
from shared.bus import BusLink, make_broker

bus.EXIT_WHEN_CLOSED = True  # as a process's entry point sets it

async def main():
    broker = make_broker(sys.argv[1], name="monitor", link=BusLink(), creds=Path(sys.argv[2]))
    await broker.connect()
    print("connected", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_process_whose_connection_is_closed_for_good_exits_for_its_supervisor_to_start_it_again(tmp_path):
    """Revoked while it runs, a process's connection is closed by the server and nats-py does not reconnect: the
    process exits (75) where it used to stay up without its bus, answering and reading nothing for ever."""
    stack = started(own_stack(tmp_path))
    holder = None
    try:
        creds = stack.identities.creds("monitor")
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, stack.nats_url, str(creds)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "connected"
        await asyncio.sleep(1.1)  # a later second: what was minted before it is revoked
        stack.identities.revoke_earlier()
        async with running_minter(stack) as minter:
            await minter.push_pending()  # the account with the revocation, to the server
        deadline = time.monotonic() + 10
        while holder.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert holder.returncode == BUS_CLOSED_EXIT
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
        stack.stop_all()
