"""Each rented node gets bus credentials of its own, minted by the minter (`services.minter`: placement holds no
key that signs users or the account) and handed to its agent; they are revoked on the server when the node is
released."""

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import RawCredentials
from nats.errors import Error as NatsError

from shared import busroles
from shared.asking import ask
from shared.bus import NODE_COMMANDS, rented_consumer_config, servers
from shared.buscreds import NAME, write_secret
from shared.minting import (
    CONSUMER_MAKER_TTL_S,
    MINT_AGENT,
    MINT_CONSUMER_MAKER,
    REVOKE_NODE,
    ForNode,
    MintAgent,
    MintConsumerMaker,
    MinterAnswer,
    RevokeNode,
)

log = logging.getLogger(__name__)
MINTER_TIMEOUT_S = 10.0
MINTER_PATIENCE_S = 15.0  # the stack starts a minter that exited again within seconds


@dataclass
class NodeCredentials:
    """Bus identities of rented nodes: minted at provisioning, revoked on the server at release, both asked of the
    minter with placement's own credentials."""

    creds: Path  # placement's own `.creds`: it may ask the minter, nothing more
    nats_url: str
    ca_file: Path | None = None

    async def ask(self, subject: str, request: ForNode) -> MinterAnswer:
        """The minter's answer; its refusal raises. A minter not listening (starting, or started again by its
        supervisor) is asked again for `MINTER_PATIENCE_S`."""
        client = await self.connect(self.creds.read_text(), inbox=busroles.inbox("placement"))
        data = request.model_dump_json().encode()
        try:
            reply = await ask(
                lambda _: client.request(subject, data, timeout=MINTER_TIMEOUT_S), timeout=MINTER_PATIENCE_S
            )
        finally:
            await client.close()
        answer = MinterAnswer.model_validate_json(reply.data)
        if answer.error:
            raise RuntimeError(f"the minter refused {subject} for {request.node_id}: {answer.error}")
        return answer

    async def issue(
        self, node_id: str, folder: Path, *, boot_s: float = 0.0, consumer: bool = True, provider: str | None = None
    ) -> Path:
        """Mint the node's agent credentials (0600 file) and create the consumer of its commands (`boot_s`: the
        longest its agent may take to start, waited for before the consumer's expiry counts; `consumer`: False
        where the minter grants it only once the machine is launched, see `create_consumer`; `provider`: the one
        renting it, which the minter asks)."""
        if not NAME.match(node_id):
            raise ValueError(f"param[node_id] invalid: {node_id!r} cannot be a bus subject token")
        user_file = write_secret(folder / f"{node_id}.user", "")  # first: a mint whose answer is lost is revoked too
        answer = await self.ask(MINT_AGENT, MintAgent(node_id=node_id, provider=provider))
        write_secret(user_file, answer.user)
        if consumer:
            await self.create_consumer(node_id, boot_s=boot_s)
        return write_secret(folder / f"{node_id}.creds", answer.creds)

    async def create_consumer(self, node_id: str, *, boot_s: float = 0.0) -> None:
        """The node's command consumer, created through an identity minted for it alone: it may create that one
        consumer (with the node's filter) and expires within minutes. Placement's own bus credentials create no
        consumer: a consumer's config is in the request's body, where the server checks nothing (a push consumer
        could send any node's commands into placement's inbox); the config here is fixed by code, and the server
        deletes the consumer once the node has not read it for `RENTED_CONSUMER_INACTIVE_S` plus `boot_s` (one
        threshold, before the first read and after it)."""
        identity = f"consumer-maker-{node_id}"
        text = (await self.ask(MINT_CONSUMER_MAKER, MintConsumerMaker(node_id=node_id))).creds
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
                f"it expires {CONSUMER_MAKER_TTL_S} s after the minter's clock, so a minter host whose clock is "
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
        """Have the minter revoke the node's identities (recorded first, then pushed to the server); a failure
        raises, so the release is tried again and the node stays ours until its identity is gone."""
        user_file = folder / f"{node_id}.user"
        if not user_file.exists():
            return
        await self.ask(REVOKE_NODE, RevokeNode(node_id=node_id))
        user_file.unlink(missing_ok=True)
        (folder / f"{node_id}.creds").unlink(missing_ok=True)
        log.info("revoked the bus credentials of %s", node_id)
