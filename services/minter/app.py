"""The minter: the one process that holds the keys which sign bus users and re-issue the account. It answers
placement's narrow requests (`shared.minting`): an agent identity for one rented node, that node's consumer maker,
the revocation of a node's identities, pushed to the server through the system account. Within limits of its own
(one identity per node, a cap, a rate) and, where the cluster rents from EC2 or Kubernetes, only for machines the
provider that rented the node says the platform launched: it revokes what no such machine carries after a grace."""

import asyncio
import fcntl
import logging
import os
import ssl
import time
from pathlib import Path
from typing import ClassVar

import nats
from nats.aio.client import RawCredentials
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from pydantic import Field, SecretStr, ValidationError, field_validator

from shared import busroles
from shared.bus import BusLink, servers
from shared.buscreds import Minter, write_secret
from shared.cluster import read_cluster
from shared.minting import (
    MINT_AGENT,
    MINT_CONSUMER_MAKER,
    REKEY_AGENT,
    REKEY_HOLD_S,
    REKEY_INBOX,
    REKEY_REVOKE_AFTER_S,
    REKEY_SUBJECTS,
    REKEYED_AGENT,
    REVOKE_NODE,
    MintAgent,
    MintConsumerMaker,
    MinterAnswer,
    RekeyAgent,
    RekeyConfirmed,
    RevokeNode,
)
from shared.service import configure_logging
from shared.settings import CommonSettings
from services.minter.bucket import TokenBucket
from services.minter.cloud import Cloud, clouds_of
from services.minter.pods import KubeCredentials
from services.minter.rules import (
    Compromised,
    Limits,
    Refused,
    Revoked,
    carrier,
    checked_by,
    confirm_rekey,
    drop_replaced,
    may_make_consumer,
    mint_agent,
    mint_consumer_maker,
    pin,
    pin_found,
    rekey_agent,
    replaced_due,
    revoke_node,
    unlaunched,
)

log = logging.getLogger(__name__)
ASKERS = ("placement", busroles.OPERATOR)  # whose inboxes it answers into (its permissions allow no other)
REKEY_PREFIX = REKEY_AGENT.format(node_id="")  # `tm.rpc.minter.rekey.`: the node's id follows
REKEYED_PREFIX = REKEYED_AGENT.format(node_id="")


class MinterSettings(CommonSettings):
    minter_file: Path = Field(
        Path(".trainmaster/bus/minter/minter.json"),
        description="Its keys, revocations and the identities it minted per node (`make run` writes it).",
    )
    cluster_file: Path = Field(
        Path("cluster.toml"),
        description="Its nodes are static: none gets a rented identity; its [providers.ec2] and "
        "[providers.kubernetes], the clouds it asks.",
    )
    max_rented_nodes: int = Field(64, ge=1, description="Rented nodes with a live agent identity, at most.")
    max_revocations: int = Field(
        50_000, ge=1, description="Revocations the account carries at most; past them no identity is minted."
    )
    rented_per_signer: int = Field(
        500,
        ge=1,
        description="Rented agents one rental signing key signs before the next; an older key is dropped with its "
        "revocations once none of its agents is live.",
    )
    mint_burst: int = Field(64, ge=1, description="Identities (agents and consumer makers) minted at once, at most.")
    mints_per_minute: float = Field(12, gt=0, description="Past the burst, identities minted a minute, at most.")
    ec2_access_key_id: str | None = Field(None, description="Its own EC2 key, allowed DescribeInstances only.")
    ec2_secret_access_key: SecretStr | None = Field(None, description="(default: boto3's own chain, e.g. a role)")
    k8s_kubeconfig: Path | None = Field(None, description="Its own kubeconfig, whose user may get and list pods only.")
    k8s_context: str | None = Field(None, description="That kubeconfig's context (default: its current-context).")
    k8s_api_url: str | None = Field(None, description="Without a kubeconfig (default: [providers.kubernetes] api_url).")
    k8s_token_file: Path | None = Field(
        None, description="Its own bearer token with the API URL (default: its pod's service account's)."
    )
    k8s_ca_file: Path | None = Field(None, description="The API's CA (default: [providers.kubernetes] ca_file).")
    launch_grace_s: float = Field(
        300, ge=0, description="How long a node's identity lives before its instance must be pending or running."
    )
    launch_patience_s: float = Field(
        6,
        ge=0,
        description="How long a consumer maker's check asks the cloud again for a machine it does not list yet "
        "(EC2's Describe calls may not show an instance launched a moment ago); within placement's 10-s wait.",
    )
    verify_every_s: float = Field(60, gt=0, description="How often live identities are checked against the cloud.")

    # The settings of its own credentials for each provider it asks: a deployment must pass them (empty: unset).
    CLOUD_SETTINGS: ClassVar[dict[str, tuple[str, ...]]] = {
        "ec2": ("ec2_access_key_id", "ec2_secret_access_key"),
        "kubernetes": ("k8s_kubeconfig", "k8s_context", "k8s_api_url", "k8s_token_file", "k8s_ca_file"),
    }

    @field_validator(*(name for names in CLOUD_SETTINGS.values() for name in names), mode="before")
    @classmethod
    def empty_is_unset(cls, value: object) -> object:
        """Compose passes an unset variable as an empty string: that is no key, no file, no context."""
        return None if value == "" else value

    def kube(self) -> KubeCredentials:
        return KubeCredentials(
            kubeconfig=self.k8s_kubeconfig,
            context=self.k8s_context,
            api_url=self.k8s_api_url,
            token_file=self.k8s_token_file,
            ca_file=self.k8s_ca_file,
        )


class MinterProcess:
    """Requests one at a time (each a read-modify-write of the minter file)."""

    def __init__(self, settings: MinterSettings) -> None:
        self.settings = settings
        cluster = read_cluster(settings.cluster_file)  # missing: no start (its static nodes unknown, none refused)
        self.clouds: dict[str, Cloud] = clouds_of(
            cluster.providers,
            key_id=settings.ec2_access_key_id,
            secret=settings.ec2_secret_access_key,
            kube=settings.kube(),
        )
        self.limits = Limits(
            static=frozenset(cluster.nodes_by_id()),
            max_rented_nodes=settings.max_rented_nodes,
            max_revocations=settings.max_revocations,
            bucket=TokenBucket(capacity=settings.mint_burst, per_minute=settings.mints_per_minute),
            providers=frozenset(self.clouds),
            per_signer=settings.rented_per_signer,
        )
        self.lock = asyncio.Lock()
        self.pushed: int | None = None  # the account's issue time this process last pushed (None: none yet)
        self.tls = ssl.create_default_context(cafile=str(settings.nats_ca_file)) if settings.nats_ca_file else None
        self.link = BusLink()  # its connection closed for good (its credentials revoked): the process exits
        self.started_at = time.time()  # an unconfirmed trade's wait counts from here at the earliest

    async def handle(self, subject: str, data: bytes) -> MinterAnswer:
        if subject == MINT_CONSUMER_MAKER:  # takes the lock itself: the cloud is asked without it
            return await self.consumer_maker(MintConsumerMaker.model_validate_json(data))
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            if subject.startswith(REKEY_PREFIX):
                return await self.rekey(minter, RekeyAgent.model_validate_json(data), subject[len(REKEY_PREFIX) :])
            if subject.startswith(REKEYED_PREFIX):
                return await self.rekeyed(
                    minter, RekeyConfirmed.model_validate_json(data), subject[len(REKEYED_PREFIX) :]
                )
            if subject == MINT_AGENT:
                return await self.agent(minter, MintAgent.model_validate_json(data))
            if subject == REVOKE_NODE:
                return await self.revoke(minter, RevokeNode.model_validate_json(data))
        raise Refused(f"no such request: {subject}")

    async def agent(self, minter: Minter, request: MintAgent) -> MinterAnswer:
        signers = list(minter.rental_signers)
        user, creds = mint_agent(minter, request, limits=self.limits, now=time.time(), monotonic=time.monotonic())
        if minter.rental_signers != signers:  # a new signer: the server must trust it before its first agent connects
            minter.reissue(int(time.time()))
        write_secret(self.settings.minter_file, minter.to_json())  # the key, for the node's revocation
        if minter.rental_signers != signers:
            try:
                await self.push(minter, minter.account_jwt())
            except Exception:  # the server may not trust it: the next mint makes another, pushed again
                minter.rental_signers = signers
                write_secret(self.settings.minter_file, minter.to_json())
                raise
        return MinterAnswer(creds=creds, user=user)

    async def rekey(self, minter: Minter, request: RekeyAgent, asked_for: str) -> MinterAnswer:
        """The agent's own key signed for its node (its start identity revoked once it confirms, past the hold). A
        second trade to another key: the node revoked (someone else holds its start identity), said as the
        refusal."""
        again = request.node_id in minter.rekeyed
        try:
            token = rekey_agent(minter, request, asked_for=asked_for, limits=self.limits, now=time.time())
        except Compromised:
            log.critical("%s's start identity was traded twice, for different keys: the node is revoked", asked_for)
            await self.revoke(minter, RevokeNode(node_id=request.node_id))
            raise
        if not again:  # first: a node's release revokes the new key too (signed again, nothing changed)
            write_secret(self.settings.minter_file, minter.to_json())
            log.info("signed the agent's own key for %s", asked_for)
        return MinterAnswer(jwt=token, user=request.user)

    async def rekeyed(self, minter: Minter, request: RekeyConfirmed, asked_for: str) -> MinterAnswer:
        """The node's agent is connected as its own key: recorded, and its start identity revoked where the node's
        hold is over (else at the sweep that finds it over)."""
        now = time.time()
        if request.node_id not in minter.confirmed:
            confirm_rekey(minter, request.node_id, asked_for=asked_for, static=self.limits.static, now=now)
            write_secret(self.settings.minter_file, minter.to_json())
        await self.revoke_due(minter, now=now)
        return MinterAnswer()

    async def consumer_maker(self, request: MintConsumerMaker) -> MinterAnswer:
        """The node's consumer maker, once the provider that rented it lists its machine: the one the node was pinned
        to at its first check (pinned now where none was). The cloud is asked outside the lock (a slow cloud would
        hold every mint and revocation behind it), so the node is looked up again after: revoked meanwhile, it gets
        none."""
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            node_id = may_make_consumer(minter, request, limits=self.limits, monotonic=time.monotonic())
            provider = checked_by(minter, node_id, providers=self.limits.providers)
        machine = None
        if provider is not None:
            cloud = self.clouds.get(provider)
            if cloud is None:
                raise Refused(f"{node_id} was rented from {provider}, which the cluster file no longer configures")
            machine = await self.until_launched(cloud, node_id, pinned=minter.machine_of.get(node_id))
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            if not minter.minted.get(node_id):
                raise Refused(f"{node_id} has no live agent identity: no consumer maker")
            if machine is not None and pin(minter, node_id, machine):
                write_secret(self.settings.minter_file, minter.to_json())
            user, creds = mint_consumer_maker(minter, node_id, now=time.time())
        return MinterAnswer(creds=creds, user=user)

    async def until_launched(self, cloud: Cloud, node_id: str, *, pinned: str | None) -> str:
        """The machine that vouches for the node (`carrier`: the `pinned` one, else the only one) once the cloud
        lists it; asked again (0.5 s, then twice as long up to 2 s) for `launch_patience_s`, since a machine launched
        a moment ago may not show yet; then refused."""
        deadline, pause = time.monotonic() + self.settings.launch_patience_s, 0.5
        while True:
            machines = (await self.launched(cloud, node_id)).get(node_id, set())
            machine = carrier(node_id, machines, pinned=pinned)
            if machine is not None:
                return machine
            if time.monotonic() + pause > deadline:
                own = f": its own, {pinned}, pinned at its first check, is gone" if pinned else ""
                raise Refused(
                    f"{node_id} is no pending or running {cloud.machine} the platform launched ({cloud.where}){own}"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    @staticmethod
    async def launched(cloud: Cloud, node_id: str) -> dict[str, set[str]]:
        try:
            return await asyncio.to_thread(cloud.launched, [node_id])
        except Exception as exc:  # botocore's or httpx's errors, whatever the cloud or the network says
            raise Refused(f"the cloud could not be asked about {node_id} ({cloud.where}): {exc}") from exc

    async def revoke(self, minter: Minter, request: RevokeNode) -> MinterAnswer:
        account = revoke_node(minter, request)
        write_secret(self.settings.minter_file, minter.to_json())  # first: a restarted server is configured with it
        await self.push(minter, account)
        log.info("revoked the bus identities of %s", request.node_id)
        return MinterAnswer()

    async def sweep(self) -> list[str]:
        """Revoke the identities of nodes minted over `launch_grace_s` ago that no pending or running machine of the
        cluster carries at the provider that rented it, or whose pinned machine is gone (invented, never launched,
        gone without a release, or carried by another machine since); the nodes revoked. The others that one machine
        carries and none was pinned to (a file written before pins) are pinned to it. First, an account re-issued
        since this process last pushed one (a push that failed: a swept node is asked about by no one again) is
        pushed, re-issued newer."""
        await self.revoke_replaced_due()
        await self.push_pending()
        if not self.clouds:
            return []
        grace_s, providers = self.settings.launch_grace_s, self.limits.providers
        minter = Minter.load(self.settings.minter_file)
        due = unlaunched(minter, launched=None, now=time.time(), grace_s=grace_s, providers=providers)
        if not due:
            return []
        # a machine the cloud is stopping still carries its agent, whose last reports (its tasks' ends) go out then
        launched = {
            p: await asyncio.to_thread(self.clouds[p].launched, None, stopping=True) for p in due if p in self.clouds
        }
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            found = unlaunched(minter, launched=launched, now=time.time(), grace_s=grace_s, providers=providers)
            # a node due since the clouds were asked, of a provider not asked, waits for the next sweep
            by_provider = {p: nodes for p, nodes in found.items() if p in launched or p not in self.clouds}
            gone = sorted(n for nodes in by_provider.values() for n in nodes)
            asked = {n for nodes in due.values() for n in nodes} - set(gone)
            pinned = pin_found(minter, launched=launched, providers=providers, among=asked)
            if gone or pinned:
                accounts = [revoke_node(minter, RevokeNode(node_id=node_id)) for node_id in gone]
                write_secret(self.settings.minter_file, minter.to_json())
            if gone:
                await self.push(minter, accounts[-1])
                log.warning("revoked %s: no pending or running machine of the provider that rented them", by_provider)
        return gone

    async def revoke_replaced_due(self) -> None:
        """Revoke the start identities whose nodes' trades may let them go now (`replaced_due`)."""
        async with self.lock:
            await self.revoke_due(Minter.load(self.settings.minter_file), now=time.time())

    async def revoke_due(self, minter: Minter, *, now: float) -> None:
        """`revoke_replaced_due` under the lock, with the minter file as read: written and pushed where any went."""
        due = replaced_due(
            minter, now=now, hold_s=REKEY_HOLD_S, unconfirmed_s=REKEY_REVOKE_AFTER_S, since=self.started_at
        )
        accounts = [drop_replaced(minter, node_id, users) for node_id, users in due.items()]
        if due:
            write_secret(self.settings.minter_file, minter.to_json())
            if (account := next((a for a in reversed(accounts) if a is not None), None)) is not None:
                await self.push(minter, account)
            log.info("revoked the start identities of %s: their agents hold keys of their own", ", ".join(due))

    async def push_pending(self) -> None:
        """Push the account, re-issued, where its issue time is not the one this process last pushed (at start: once,
        whatever an earlier process pushed)."""
        async with self.lock:
            minter = Minter.load(self.settings.minter_file)
            if not minter.latest_issued_at or minter.latest_issued_at == self.pushed:
                return
            account = minter.revoke()  # no one new: the same account, issued anew (a server takes a newer one only)
            write_secret(self.settings.minter_file, minter.to_json())
            await self.push(minter, account)

    async def sweeping(self) -> None:
        """`sweep` every `verify_every_s`, until cancelled."""
        while True:
            await asyncio.sleep(self.settings.verify_every_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("checking the live identities against the cloud failed (tried again)")

    async def push(self, minter: Minter, account: str) -> None:
        """The re-issued account to the server, which then closes the revoked users' connections; its issue time
        kept as the one last pushed."""
        await self.update_account(minter, account)
        self.pushed = minter.latest_issued_at

    async def update_account(self, minter: Minter, account: str) -> None:
        """The account claims update, through the system account; raises where the server refuses it."""
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
        # a node's agent is answered in the space kept for its node's answers (its permissions allow no other)
        node = msg.subject.rsplit(".", 1)[-1]
        traded = msg.subject.startswith((REKEY_PREFIX, REKEYED_PREFIX))
        inboxes = (REKEY_INBOX.format(node_id=node),) if traded else tuple(busroles.inbox(r) for r in ASKERS)
        if not msg.reply.startswith(tuple(f"{i}." for i in inboxes)):
            log.warning("dropped a request on %s answering to %r, not an asker's inbox", msg.subject, msg.reply)
            return
        try:
            answer = await self.handle(msg.subject, msg.data)
        except (Refused, ValidationError) as exc:
            log.warning("refused %s: %s", msg.subject, exc)
            answer = MinterAnswer(error=str(exc)[:500], final=True, revoked=isinstance(exc, Revoked))
        except (RuntimeError, NatsError, TimeoutError) as exc:  # the server, or the bus: asked again, it may pass
            log.warning("refused %s: %s", msg.subject, exc)
            answer = MinterAnswer(error=str(exc)[:500])
        except Exception as exc:  # its file unreadable or unwritable, a newer version's: said at once, not a timeout
            log.exception("could not answer %s", msg.subject)
            answer = MinterAnswer(error=f"the minter failed: {type(exc).__name__}: {str(exc)[:400]}")
        await msg.respond(answer.model_dump_json().encode())

    async def start(self) -> nats.NATS:
        """Connected and listening (its own credentials; requests come only from placement and the operator)."""
        client = await nats.connect(
            servers(self.settings.nats_url),
            user_credentials=str(self.settings.nats_creds) if self.settings.nats_creds else None,
            tls=self.tls,
            inbox_prefix=busroles.inbox(busroles.MINTER),
            max_reconnect_attempts=-1,
            **self.link.callbacks(),
        )
        for subject in (MINT_AGENT, MINT_CONSUMER_MAKER, REVOKE_NODE, *REKEY_SUBJECTS):
            await client.subscribe(subject, cb=self.on_request)
        await client.flush()
        return client


def hold_alone(minter_file: Path) -> int:
    """An exclusive lock beside the minter file, held for the process's life (its descriptor): a second minter on
    the same file would overwrite the first's record of what it minted, and a user missing from it is never
    revoked. Taken: no start."""
    minter_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(minter_file.with_name(f".{minter_file.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"another minter runs on {minter_file}: one at a time (compose: one replica)") from None
    return fd


async def serve(settings: MinterSettings) -> None:
    """Run until cancelled."""
    configure_logging(settings.log_level)
    hold_alone(settings.minter_file)
    minter = MinterProcess(settings)
    client = await minter.start()
    log.info("minter: answering %s", ", ".join(busroles.minter().subscribe))
    try:
        await minter.sweeping()
    finally:
        minter.link.stopping = True  # its own close is no loss
        await client.close()
