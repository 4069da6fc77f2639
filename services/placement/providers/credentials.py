"""Each rented node gets bus credentials of its own, minted here (placement holds the application account's
signing key) and handed to its agent; they are revoked on the server when the node is released."""

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import nats
from faststream.nats import NatsBroker
from nats.aio.client import RawCredentials

from shared import busroles
from shared.bus import create_agent_consumer, servers
from shared.buscreds import NAME, Minter, write_secret

log = logging.getLogger(__name__)


@dataclass
class NodeCredentials:
    """Bus identities of rented nodes: minted at provisioning, revoked on the server at release."""

    minter_file: Path  # the account signing key, the operator signing key and the revocations so far
    broker: NatsBroker
    nats_url: str
    ca_file: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read-modify-write of the minter file at a time

    async def issue(self, node_id: str, folder: Path) -> Path:
        """Mint the node's agent credentials (0600 file) and create the consumer of its commands."""
        if not NAME.match(node_id):
            raise ValueError(f"param[node_id] invalid: {node_id!r} cannot be a bus subject token")
        user, text = Minter.load(self.minter_file).mint(name=f"agent-{node_id}", permissions=busroles.agent(node_id))
        write_secret(folder / f"{node_id}.user", user)
        await create_agent_consumer(self.broker, node_id)
        return write_secret(folder / f"{node_id}.creds", text)

    async def revoke(self, node_id: str, folder: Path) -> None:
        """Revoke the node's user: recorded first (a restarted server is configured with it), then pushed; a
        failure raises, so the release is tried again and the node stays ours until its identity is gone."""
        user_file = folder / f"{node_id}.user"
        if not user_file.exists():
            return
        async with self.lock:
            minter = Minter.load(self.minter_file)
            account = minter.revoke(user_file.read_text().strip())
            write_secret(self.minter_file, minter.to_json())
        tls = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        client = await nats.connect(
            servers(self.nats_url),
            user_credentials=RawCredentials(minter.system_creds),
            tls=tls,
            inbox_prefix=busroles.inbox("account-updater"),
            connect_timeout=5,
            max_reconnect_attempts=3,
        )
        try:
            reply = await client.request(
                f"$SYS.REQ.ACCOUNT.{minter.account}.CLAIMS.UPDATE", account.encode(), timeout=5
            )
            if b'"error"' in reply.data:
                raise RuntimeError(f"the server refused the revocation of {node_id}: {reply.data[:300]!r}")
        finally:
            await client.close()
        user_file.unlink(missing_ok=True)
        (folder / f"{node_id}.creds").unlink(missing_ok=True)
        log.info("revoked the bus credentials of %s", node_id)
