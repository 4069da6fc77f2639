"""Each rented node gets bus credentials of its own, minted here (placement holds the application account's
signing key) and handed to its agent; they are revoked on the server when the node is released."""

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import RawCredentials
from nats.errors import Error as NatsError

from shared import busroles
from shared.bus import NODE_COMMANDS, rented_consumer_config, servers
from shared.buscreds import NAME, Minter, write_secret

log = logging.getLogger(__name__)
CONSUMER_MAKER_TTL_S = 120  # the identity that creates a node's command consumer is refused by the server after this


@dataclass
class NodeCredentials:
    """Bus identities of rented nodes: minted at provisioning, revoked on the server at release."""

    minter_file: Path  # the account signing key, the operator signing key and the revocations so far
    nats_url: str
    ca_file: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read-modify-write of the minter file at a time

    async def issue(self, node_id: str, folder: Path, *, boot_s: float = 0.0) -> Path:
        """Mint the node's agent credentials (0600 file) and create the consumer of its commands (`boot_s`: the
        longest its agent may take to start, waited for before the consumer's expiry counts)."""
        if not NAME.match(node_id):
            raise ValueError(f"param[node_id] invalid: {node_id!r} cannot be a bus subject token")
        user, text = Minter.load(self.minter_file).mint(name=f"agent-{node_id}", permissions=busroles.agent(node_id))
        write_secret(folder / f"{node_id}.user", user)
        await self.create_consumer(node_id, boot_s=boot_s)
        return write_secret(folder / f"{node_id}.creds", text)

    async def create_consumer(self, node_id: str, *, boot_s: float = 0.0) -> None:
        """The node's command consumer, created through an identity minted for it alone: it may create that one
        consumer (with the node's filter) and expires within minutes. Placement's own bus credentials create no
        consumer: a consumer's config is in the request's body, where the server checks nothing (a push consumer
        could send any node's commands into placement's inbox); the config here is fixed by code, and the server
        deletes the consumer once the node has not read it for `RENTED_CONSUMER_INACTIVE_S` (before its first read,
        that and `boot_s`)."""
        identity = f"consumer-maker-{node_id}"
        _, text = Minter.load(self.minter_file).mint(
            name=identity,
            permissions=busroles.consumer_maker(node_id),
            expires_at=int(time.time()) + CONSUMER_MAKER_TTL_S,
        )
        refusals: list[str] = []

        async def refused(exc: Exception) -> None:
            refusals.append(str(exc))

        try:
            client = await self.connect(text, inbox=busroles.inbox(identity), errors=refused)
        except NatsError as exc:
            if not any("authorization" in r.lower() for r in refusals):
                raise
            raise RuntimeError(
                f"the bus server refused the identity minted to make {node_id}'s command consumer ({refusals[-1]}): "
                f"it expires {CONSUMER_MAKER_TTL_S} s after this host's clock, so a placement host whose clock is "
                "behind the bus servers' by that much mints it already expired; check both clocks (NTP)"
            ) from exc
        try:
            await client.jetstream(timeout=10).add_consumer(
                NODE_COMMANDS.name, config=rented_consumer_config(node_id, boot_s=boot_s)
            )
        finally:
            await client.close()

    async def connect(
        self, creds: str, *, inbox: str, errors: Callable[[Exception], Awaitable[None]] | None = None
    ) -> nats.NATS:
        """A connection of its own as a minted identity (`creds`: its `.creds` text; `errors`: what the server says
        to it, a refusal included)."""
        tls = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        return await nats.connect(
            servers(self.nats_url),
            user_credentials=RawCredentials(creds),
            tls=tls,
            inbox_prefix=inbox,
            connect_timeout=5,
            max_reconnect_attempts=3,
            error_cb=errors,
        )

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
        client = await self.connect(minter.system_creds, inbox=busroles.inbox("account-updater"))
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
