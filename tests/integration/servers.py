"""The real servers an integration test talks to: NATS with trainmaster's streams and identities, and the embedded
database when asked, from a cluster file of the test's own."""

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import nats

from shared.asking import ask
from shared.busroles import MINTER
from shared.minting import MINT_AGENT, REVOKE_NODE, MinterAnswer, RevokeNode
from services.minter.app import MinterProcess, MinterSettings
from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port


@contextmanager
def real_servers(data: Path, *, cluster: str, database: bool = False) -> Iterator[Stack]:
    """Start them under `data` (the cluster file's nodes get their bus identities); stop them at the end."""
    (data / "cluster.toml").write_text(cluster)
    stack = Stack(
        StackSettings(
            data_dir=data / "data",
            nats_port=free_port(),
            nats_url=None,
            mongo_url=None,
            cluster_file=data / "cluster.toml",
        )
    )
    stack.start_nats()
    stack.prepare_bus()
    if database:
        stack.start_database()
    try:
        yield stack
    finally:
        stack.stop_all()


@asynccontextmanager
async def running_minter(stack: Stack, **settings: Any) -> AsyncIterator[MinterProcess]:
    """The minter as `make run` starts it (its own credentials, the stack's minter file), in this test's loop;
    `settings`: other minter settings (its limits, another cluster file)."""
    stack.identities.minter()
    minter = MinterProcess(
        MinterSettings(
            nats_url=stack.nats_url,
            nats_creds=stack.identities.creds(MINTER),
            minter_file=stack.identities.minter_file,
            **{"cluster_file": stack.settings.cluster_file, **settings},
        )
    )
    client = await minter.start()
    try:
        await answering(stack)
        yield minter
    finally:
        await client.close()


async def answering(stack: Stack, *, patience_s: float = 5.0) -> None:
    """Once the minter answers (a request it refuses, so nothing changes): the server may tell a request sent right
    after the minter subscribed that no one listens."""
    operator = await nats.connect(
        stack.nats_url, user_credentials=str(stack.admin_creds()), inbox_prefix="_INBOX_admin"
    )
    try:
        await ask(lambda left: operator.request(MINT_AGENT, b"{}", timeout=left), timeout=patience_s)
    finally:
        await operator.close()


def live_rented(stack: Stack) -> set[str]:
    """The rented nodes whose identity the stack's minter has not revoked."""
    return {node_id for node_id, users in stack.identities.minter().minted.items() if users}


@asynccontextmanager
async def revoking_what_it_mints(stack: Stack) -> AsyncIterator[None]:
    """Every rented identity minted inside is revoked at the end, whatever happened: one left live counts against
    the minter's cap on this stack's server, so a later test's mint could be refused."""
    before = live_rented(stack)
    try:
        yield
    finally:
        left = sorted(live_rented(stack) - before)
        if left:
            async with running_minter(stack):
                operator = await nats.connect(
                    stack.nats_url, user_credentials=str(stack.admin_creds()), inbox_prefix="_INBOX_admin"
                )
                try:
                    for node_id in left:
                        reply = await operator.request(
                            REVOKE_NODE, RevokeNode(node_id=node_id).model_dump_json().encode(), timeout=10
                        )
                        assert MinterAnswer.model_validate_json(reply.data).error == "", reply.data
                finally:
                    await operator.close()
        assert live_rented(stack) <= before, "an identity minted by the test is still live"
