"""The real servers an integration test talks to: NATS with trainmaster's streams and identities, and the embedded
database when asked, from a cluster file of the test's own."""

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from shared.busroles import MINTER
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
async def running_minter(stack: Stack) -> AsyncIterator[MinterProcess]:
    """The minter as `make run` starts it (its own credentials, the stack's minter file), in this test's loop."""
    stack.identities.minter()
    minter = MinterProcess(
        MinterSettings(
            nats_url=stack.nats_url,
            nats_creds=stack.identities.creds(MINTER),
            minter_file=stack.identities.minter_file,
            cluster_file=stack.settings.cluster_file,
        )
    )
    client = await minter.start()
    try:
        yield minter
    finally:
        await client.close()
