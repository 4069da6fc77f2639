"""The minter: the one process that holds the keys which sign bus users and re-issue the account. It answers
placement's narrow requests (`shared.minting`): an agent identity for one rented node, that node's consumer maker,
the revocation of a node's identities, pushed to the server through the system account."""

import asyncio
import logging
import ssl
import time
from pathlib import Path

import nats
from nats.aio.client import RawCredentials
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from pydantic import Field, ValidationError

from shared import busroles
from shared.bus import servers
from shared.buscreds import Minter, write_secret
from shared.cluster import read_cluster
from shared.minting import (
    MINT_AGENT,
    MINT_CONSUMER_MAKER,
    REVOKE_NODE,
    MintAgent,
    MintConsumerMaker,
    MinterAnswer,
    RevokeNode,
)
from shared.service import configure_logging
from shared.settings import CommonSettings
from services.minter.rules import Refused, mint_agent, mint_consumer_maker, revoke_node

log = logging.getLogger(__name__)
ASKERS = ("placement", busroles.OPERATOR)  # whose inboxes it answers into (its permissions allow no other)


class MinterSettings(CommonSettings):
    minter_file: Path = Field(
        Path(".trainmaster/bus/minter/minter.json"),
        description="Its keys, revocations and the identities it minted per node (`make run` writes it).",
    )
    cluster_file: Path = Field(Path("cluster.toml"), description="Its nodes are static: none gets a rented identity.")


class MinterProcess:
    """Requests one at a time (each a read-modify-write of the minter file)."""

    def __init__(self, settings: MinterSettings) -> None:
        self.settings = settings
        self.static = frozenset(read_cluster(settings.cluster_file, missing_ok=True).nodes_by_id())
        self.lock = asyncio.Lock()
        self.tls = ssl.create_default_context(cafile=str(settings.nats_ca_file)) if settings.nats_ca_file else None

    async def handle(self, subject: str, data: bytes) -> MinterAnswer:
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            if subject == MINT_AGENT:
                return self.agent(minter, MintAgent.model_validate_json(data))
            if subject == MINT_CONSUMER_MAKER:
                return self.consumer_maker(minter, MintConsumerMaker.model_validate_json(data))
            if subject == REVOKE_NODE:
                return await self.revoke(minter, RevokeNode.model_validate_json(data))
        raise Refused(f"no such request: {subject}")

    def agent(self, minter: Minter, request: MintAgent) -> MinterAnswer:
        user, creds = mint_agent(minter, request, static=self.static)
        write_secret(self.settings.minter_file, minter.to_json())  # the key, for the node's revocation
        return MinterAnswer(creds=creds, user=user)

    def consumer_maker(self, minter: Minter, request: MintConsumerMaker) -> MinterAnswer:
        user, creds = mint_consumer_maker(minter, request, static=self.static, now=time.time())
        return MinterAnswer(creds=creds, user=user)

    async def revoke(self, minter: Minter, request: RevokeNode) -> MinterAnswer:
        account = revoke_node(minter, request)
        write_secret(self.settings.minter_file, minter.to_json())  # first: a restarted server is configured with it
        await self.push(minter, account)
        log.info("revoked the bus identities of %s", request.node_id)
        return MinterAnswer()

    async def push(self, minter: Minter, account: str) -> None:
        """The re-issued account to the server, which then closes the revoked users' connections."""
        client = await nats.connect(
            servers(self.settings.nats_url),
            user_credentials=RawCredentials(minter.system_creds),
            tls=self.tls,
            inbox_prefix=busroles.inbox("account-updater"),
            connect_timeout=5,
            max_reconnect_attempts=3,
        )
        try:
            subject = f"$SYS.REQ.ACCOUNT.{minter.account}.CLAIMS.UPDATE"
            reply = await client.request(subject, account.encode(), timeout=5)
        finally:
            await client.close()
        if b'"error"' in reply.data:
            raise RuntimeError(f"the server refused the account update: {reply.data[:300]!r}")

    async def on_request(self, msg: Msg) -> None:
        if not msg.reply.startswith(tuple(f"{busroles.inbox(r)}." for r in ASKERS)):
            log.warning("dropped a request on %s answering to %r, not an asker's inbox", msg.subject, msg.reply)
            return
        try:
            answer = await self.handle(msg.subject, msg.data)
        except (Refused, ValidationError, RuntimeError, NatsError, TimeoutError) as exc:
            log.warning("refused %s: %s", msg.subject, exc)
            answer = MinterAnswer(error=str(exc)[:500])
        await msg.respond(answer.model_dump_json().encode())

    async def start(self) -> nats.NATS:
        """Connected and listening (its own credentials; requests come only from placement and the operator)."""
        client = await nats.connect(
            servers(self.settings.nats_url),
            user_credentials=str(self.settings.nats_creds) if self.settings.nats_creds else None,
            tls=self.tls,
            inbox_prefix=busroles.inbox(busroles.MINTER),
            max_reconnect_attempts=-1,
        )
        for subject in (MINT_AGENT, MINT_CONSUMER_MAKER, REVOKE_NODE):
            await client.subscribe(subject, cb=self.on_request)
        await client.flush()
        return client


async def serve(settings: MinterSettings) -> None:
    """Run until cancelled."""
    configure_logging(settings.log_level)
    client = await MinterProcess(settings).start()
    log.info("minter: answering %s", ", ".join(busroles.minter().subscribe))
    try:
        await asyncio.Event().wait()
    finally:
        await client.close()
