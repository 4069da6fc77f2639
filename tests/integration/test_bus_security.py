"""The bus against a real NATS server configured as `make run` does: identities, permissions, revocation."""

import asyncio
import json
import logging
import shutil
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import nats
import pytest
from nats.aio.msg import Msg
from nats.errors import Error as NatsError, NoRespondersError
from nats.js.api import ConsumerConfig, StreamConfig

from shared import bus, busroles
from shared.bus import agent_consumer_config, connect, durable, make_broker, publish
from shared.buscreds import Minter, decode_claims
from shared.events import StartTask, StopTask, TaskExited
from shared.minting import CONSUMER_MAKER_TTL_S
from services.minter import rules as minter_rules
from services.placement.providers import NodeCredentials, credentials as rented_credentials
from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port
from tests.factories import algorithm, exited, placed, spec, unique
from tests.integration.servers import real_servers, running_minter

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("minted_revoked")]
CLUSTER = """
[[nodes]]
id = "n1"
kind = "local"
cpu_count = 4
memory_gb = 8

[[nodes]]
id = "n2"
kind = "local"
cpu_count = 4
memory_gb = 8
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("bus"), cluster=CLUSTER) as stack:
        yield stack


class Client:
    """A raw connection as one identity, keeping every error the server sends it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.closed = asyncio.Event()
        self.nc: nats.NATS | None = None

    async def open(self, server: Stack, creds, *, inbox: str = "_INBOX") -> "Client":
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        async def on_closed() -> None:
            self.closed.set()

        self.nc = await nats.connect(
            server.nats_url,
            user_credentials=str(creds),
            inbox_prefix=inbox,
            error_cb=on_error,
            closed_cb=on_closed,
            allow_reconnect=False,
        )
        return self

    async def settle(self) -> list[str]:
        await self.nc.flush()
        await asyncio.sleep(0.2)
        return self.errors

    async def refused(self, subject: str, attempt: Callable[[], Awaitable[object]], *, timeout_s: float = 5) -> None:
        """The server refuses `attempt`: its Permissions Violation for a publish to `subject` reaches this client
        before the attempt ends (an answer, or an error such as JetStream's own, comes only to a request that got
        through). The server dropped the request, so nothing can follow: the attempt is ended there instead of
        waiting out its timeout, and `timeout_s` only bounds the wait for the refusal."""
        wanted, seen = f'publish to "{subject.lower()}"', len(self.errors)
        task = asyncio.ensure_future(attempt())
        try:
            async with asyncio.timeout(timeout_s):
                while not any(wanted in e for e in self.errors[seen:]):
                    if task.done():
                        raise AssertionError(f"{subject}: not refused, the attempt ended with {outcome(task)!r}")
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"{subject}: no refusal in {timeout_s} s, only {self.errors[seen:]}") from None
        finally:
            task.cancel()
            await asyncio.wait([task])
            outcome(task)  # what it raised is read, so asyncio does not log it as never retrieved


async def honest_request(asker: Client, answerer: Client, subject: str, *, tries: int = 5):
    """The answer to a plain request on `subject`, which `answerer` subscribed to and flushed before. In whole-suite
    runs (2026-11-28, 2026-11-30 in CI; never in 40 runs of the test alone on a loaded machine) the server twice said no
    one was subscribed, the answering client connected, told of no error: what was so is logged and the request
    asked again, bounded; an answer that never comes still fails."""
    for attempt in range(tries):
        try:
            return await asker.nc.request(subject, b"{}", timeout=5)
        except NoRespondersError:
            logging.getLogger(__name__).warning(
                "no responder on %s (attempt %d): answering client connected=%s closed=%s errors=%s, asker's errors=%s",
                subject,
                attempt + 1,
                answerer.nc.is_connected,
                answerer.closed.is_set(),
                answerer.errors,
                asker.errors,
            )
            await answerer.nc.flush()
            await asyncio.sleep(0.2)
    raise AssertionError(f"no responder on {subject} in {tries} requests: answering client errors={answerer.errors}")


def outcome(task: asyncio.Future) -> object:
    """What a finished task returned or raised (None once cancelled)."""
    if task.cancelled():
        return None
    return task.exception() or task.result()


def agent_creds(server: Stack, node_id: str):
    return server.identities.creds(f"agent-{node_id}")


async def as_agent(server: Stack, node_id: str) -> Client:
    return await Client().open(server, agent_creds(server, node_id), inbox=busroles.inbox(f"agent-{node_id}"))


async def read_all(agent: Client, node_id: str) -> list[Msg]:
    """Every command waiting for the node, read and acknowledged as its agent does, until its consumer has none left
    to deliver by the server's count (an empty fetch said so only once it had waited out its timeout). The consumer
    delivers one at a time (`max_ack_pending` 1), each once the one before is acknowledged."""
    js = agent.nc.jetstream(timeout=5)
    own = await js.pull_subscribe_bind(f"agent-{node_id}", stream="TM_NODE_CMD")
    messages: list[Msg] = []
    for _ in range(20):
        if not (await js.consumer_info("TM_NODE_CMD", f"agent-{node_id}")).num_pending:
            return messages
        for m in await own.fetch(batch=1, timeout=5):
            await m.ack()
            messages.append(m)
    raise AssertionError(f"agent-{node_id}: commands still waiting after {len(messages)} read")


async def command_for(server: Stack, node_id: str) -> StartTask:
    """A start command with a secret in it, in the commands stream (published as the operator)."""
    job_id = unique("j")
    command = StartTask(
        event_id=f"{job_id}:start",
        node_id=node_id,
        job_id=job_id,
        attempt=1,
        project_id="p",
        user_name="u",
        algorithm=algorithm("true").model_copy(update={"environments": {"HF_TOKEN": "secret-of-" + job_id}}),
        spec=spec(),
    )
    broker = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(broker)
    await publish(broker, command)
    await broker.stop()
    return command


async def test_a_client_without_credentials_cannot_connect(server):
    with pytest.raises(NatsError, match="Authorization Violation"):
        await nats.connect(server.nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_an_agent_may_publish_only_its_own_nodes_and_tasks_events(server):
    agent = await as_agent(server, "n1")
    for allowed in (
        "tm.node.evt.n1.heartbeat",
        "tm.job.task.n1.exited",
        "tm.job.task.n1.hung",
        "tm.log.n1.j-1",
        "tm.telemetry.n1.j-1",
        "tm.rpc.submitter.secrets.n1",
    ):
        await agent.nc.publish(allowed, b"{}")
    assert await agent.settle() == []  # what it may do goes through: the refusals below are the server's
    forbidden = (
        "tm.job.status.Completed.Completed",
        "tm.node.cmd.n2.start",
        "tm.node.cmd.n1.start",
        "tm.node.cmd.n1.stop",
        "tm.rpc.billing.quotas",
        "tm.rpc.billing.admit",
        "tm.node.evt.n2.heartbeat",
        "tm.node.evt.n2.registered",
        "tm.node.evt.released",
        "tm.job.task.n2.exited",
        "tm.job.task.exited",
        "tm.log.n2.j-1",
        "tm.notify.p",
        "$JS.API.STREAM.DELETE.TM_JOBS",
        "tm.job.task.n2.hung",
        "tm.job.task.n2.resumed",
        "tm.telemetry.n2.j-1",
        "tm.telemetry.n1",
        "tm.telemetry.n1.j-1.x",
        "tm.rpc.submitter.secrets.n2",  # another node's secrets: asked only on its own node's subject
    )
    for subject in forbidden:
        await agent.nc.publish(subject, b"{}")
    errors = await agent.settle()
    for subject in forbidden:
        assert any(f'publish to "{subject.lower()}"' in e for e in errors), (subject, errors)
    await agent.nc.close()


async def test_an_agent_cannot_subscribe_to_other_nodes_commands_or_everything(server):
    agent = await as_agent(server, "n1")
    forbidden = (
        "tm.node.cmd.n2.>",
        "tm.node.cmd.>",
        "tm.>",
        ">",
        "_INBOX.>",
        "_INBOX_submitter.>",
        "_INBOX_agent-n2.>",
        "tm.rpc.billing.quotas",
        "_INBOX_secrets.n2.>",  # the submitter's answers to another node
        "_INBOX_secrets.>",
    )
    for subject in forbidden:
        await agent.nc.subscribe(subject)
    errors = await agent.settle()
    for subject in forbidden:
        assert any(f'subscription to "{subject.lower()}"' in e for e in errors), (subject, errors)
    await agent.nc.close()


async def test_an_agent_reads_its_own_commands_and_not_another_nodes_through_jetstream(server):
    mine, theirs = await command_for(server, "n1"), await command_for(server, "n2")
    agent = await as_agent(server, "n1")
    received = await read_all(agent, "n1")
    assert mine.job_id.encode() in b"".join(m.data for m in received)
    assert all(theirs.job_id.encode() not in m.data for m in received)

    js = agent.nc.jetstream(timeout=5)

    async def their_consumer() -> object:
        return await (await js.pull_subscribe_bind("agent-n2", stream="TM_NODE_CMD")).fetch(batch=10, timeout=5)

    attempts = (  # the API request the server refuses, and the call that sends it
        ("$JS.API.CONSUMER.MSG.NEXT.TM_NODE_CMD.agent-n2", their_consumer),
        (  # a consumer of its own on their subject
            "$JS.API.CONSUMER.INFO.TM_NODE_CMD.spy",
            lambda: js.pull_subscribe("tm.node.cmd.n2.>", durable="spy", stream="TM_NODE_CMD"),
        ),
        (  # its consumer widened
            "$JS.API.CONSUMER.CREATE.TM_NODE_CMD.agent-n1.tm.node.cmd.>",
            lambda: js.add_consumer(
                "TM_NODE_CMD", durable_name="agent-n1", name="agent-n1", filter_subject="tm.node.cmd.>"
            ),
        ),
        ("$JS.API.STREAM.MSG.GET.TM_NODE_CMD", lambda: js.get_msg("TM_NODE_CMD", seq=1)),  # by sequence
        (  # the last message of their subject
            "$JS.API.STREAM.MSG.GET.TM_NODE_CMD",
            lambda: js.get_last_msg("TM_NODE_CMD", "tm.node.cmd.n2.start"),
        ),
        (
            "$JS.API.DIRECT.GET.TM_NODE_CMD.tm.node.cmd.n2.start",
            lambda: js.get_msg("TM_NODE_CMD", subject="tm.node.cmd.n2.start", direct=True),
        ),
    )
    for subject, attempt in attempts:
        await agent.refused(subject, attempt)
    errors = await agent.settle()
    assert not any(theirs.job_id in e for e in errors)
    await agent.nc.close()


async def test_the_monitor_drops_a_lost_nodes_queued_starts_and_nothing_else_and_an_agent_cannot(server):
    """A start queued for a node that is then declared lost never reaches its agent when it comes back; its stops
    and other nodes' starts stay; an agent may not purge (it could drop another node's work)."""
    stale, also_stale, theirs = [await command_for(server, n) for n in ("n1", "n1", "n2")]
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    stop = StopTask(event_id=f"{stale.job_id}:stop", node_id="n1", job_id=stale.job_id, attempt=1)
    await publish(operator, stop)
    await operator.stop()

    rogue = await as_agent(server, "n1")
    await rogue.refused(
        "$JS.API.STREAM.PURGE.TM_NODE_CMD",
        lambda: rogue.nc.jetstream(timeout=5).purge_stream("TM_NODE_CMD", subject="tm.node.cmd.n2.start"),
    )
    await rogue.nc.close()

    monitor = make_broker(server.nats_url, name="monitor", creds=server.identities.creds("monitor"))
    await connect(monitor, declare=False)
    await bus.forget_starts(monitor, "n1")
    await monitor.stop()

    async def delivered(node_id: str) -> bytes:
        agent = await as_agent(server, node_id)
        messages = await read_all(agent, node_id)
        await agent.nc.close()
        return b"".join(m.data for m in messages)

    back = await delivered("n1")
    assert b'"StopTask"' in back and stale.job_id.encode() in back  # the stop, not the start
    assert b'"StartTask"' not in back and also_stale.job_id.encode() not in back
    assert theirs.job_id.encode() in await delivered("n2")


async def test_an_event_on_a_subject_its_payload_does_not_imply_is_dropped(server):
    seen: list[str] = []
    broker = make_broker(server.nats_url, name="receiver", creds=server.admin_creds())

    @broker.subscriber(**durable("tm.job.task.>", consumer=unique("receiver"), ordered=False, deliver_new=True))
    async def on_task(event: TaskExited) -> None:
        seen.append(event.job_id)

    await connect(broker)
    await broker.start()
    agent = await as_agent(server, "n1")
    js = agent.nc.jetstream()
    forged, honest = exited(unique("j"), node_id="n2"), exited(unique("j"), node_id="n1")
    await js.publish("tm.job.task.n1.exited", forged.model_dump_json().encode())  # n1 speaking for n2
    await js.publish(honest.subject, honest.model_dump_json().encode())
    for _ in range(50):
        if honest.job_id in seen:
            break
        await asyncio.sleep(0.1)
    await broker.stop()
    await agent.nc.close()
    assert seen == [honest.job_id]


def placements(server: Stack) -> NodeCredentials:
    """What placement uses to ask the minter for rented nodes' identities: its own credentials."""
    return NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)


async def test_a_rented_nodes_credentials_are_revoked_when_it_is_released(server, tmp_path):
    credentials = placements(server)
    node_id = unique("od")
    async with running_minter(server):
        creds = await credentials.issue(node_id, tmp_path)  # its consumer made by an identity minted for that alone
    assert creds.stat().st_mode & 0o777 == 0o600
    agent = await Client().open(server, creds, inbox=busroles.inbox(f"agent-{node_id}"))
    await agent.nc.publish(f"tm.node.evt.{node_id}.heartbeat", b"{}")
    own = await agent.nc.jetstream(timeout=2).consumer_info("TM_NODE_CMD", f"agent-{node_id}")
    assert own.config.deliver_subject is None and own.config.filter_subject == f"tm.node.cmd.{node_id}.>"
    assert await agent.settle() == []
    copy = tmp_path / "kept.creds"
    copy.write_text(creds.read_text())  # what a node that does not want to leave would keep

    async with running_minter(server):
        await credentials.revoke(node_id, tmp_path)
    await asyncio.wait_for(agent.closed.wait(), timeout=5)  # the server cut the live connection
    with pytest.raises(NatsError, match="Authorization Violation"):
        await nats.connect(
            server.nats_url,
            user_credentials=str(copy),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )
    assert not creds.exists()
    other = await as_agent(server, "n1")  # other identities are untouched
    assert await other.settle() == []
    await other.nc.close()


async def test_the_identity_that_makes_a_rented_nodes_consumer_expires_and_so_does_the_consumer(
    server, tmp_path, monkeypatch
):
    """The identity is refused by the server after minutes; the consumer it makes is deleted by the server once the
    node has not read it for an hour (each one a Raft group on a cluster, kept forever before)."""
    minted: list[tuple[str, str]] = []
    mint = Minter.mint

    def recording(self, **kwargs):
        user, creds = mint(self, **kwargs)
        minted.append((kwargs["name"], creds))
        return user, creds

    monkeypatch.setattr(Minter, "mint", recording)
    credentials = placements(server)
    node_id = unique("od")
    now = time.time()
    async with running_minter(server):
        await credentials.issue(node_id, tmp_path)
    claims = {name: decode_claims(creds.split("USER JWT-----\n")[1].split("\n")[0]) for name, creds in minted}
    assert now < claims[f"consumer-maker-{node_id}"].get("exp", 0) <= now + CONSUMER_MAKER_TTL_S + 1
    assert "exp" not in claims[f"agent-{node_id}"]  # the node's own identity lasts until it is revoked
    operator = await Client().open(server, server.admin_creds())
    info = await operator.nc.jetstream(timeout=2).consumer_info("TM_NODE_CMD", f"agent-{node_id}")
    await operator.nc.close()
    assert info.config.inactive_threshold == bus.RENTED_CONSUMER_INACTIVE_S
    async with running_minter(server):
        await credentials.revoke(node_id, tmp_path)


async def test_a_consumer_maker_already_expired_on_arrival_is_an_error_that_names_the_clocks(
    server, tmp_path, monkeypatch
):
    """A minter host whose clock is behind the bus servers' by more than the identity's life mints it expired:
    the rental failed with an authorization error that said nothing of clocks."""
    monkeypatch.setattr(minter_rules, "CONSUMER_MAKER_TTL_S", -30)  # as seen by a server 150 s ahead
    # Placement's connection tries the refused identity again (three times, 2 s apart by nats-py's default) before
    # it gives up: the same tries here, without the 6 s of pauses between them.
    connect_now = nats.connect

    async def connect_again_at_once(*args, **kwargs) -> nats.NATS:
        return await connect_now(*args, **{**kwargs, "reconnect_time_wait": 0.05})

    monkeypatch.setattr(rented_credentials, "nats", SimpleNamespace(connect=connect_again_at_once, NATS=nats.NATS))
    node_id = unique("od")
    async with running_minter(server):
        with pytest.raises(RuntimeError, match="clock"):
            await placements(server).issue(node_id, tmp_path)  # its agent identity, then its consumer maker
        await placements(server).revoke(node_id, tmp_path)


async def test_the_agents_command_consumer_is_created_by_the_privileged_side(server):
    # The agent's identity on a connection that keeps what the server says to it (a FastStream broker only logs
    # it, so the refusal showed only as its JetStream context's 5 s timeout); the request is the same nats-py call.
    agent = await as_agent(server, "n1")
    await agent.refused(  # an agent may not create a consumer, even its own
        "$JS.API.CONSUMER.CREATE.TM_NODE_CMD.agent-n1.tm.node.cmd.n1.>",
        lambda: agent.nc.jetstream(timeout=5).add_consumer("TM_NODE_CMD", config=agent_consumer_config("n1")),
    )
    await agent.nc.close()


def certificates(folder) -> tuple:
    """A throw-away CA and a server certificate for 127.0.0.1 it signed."""
    run = lambda *argv: subprocess.run(["openssl", *argv], cwd=folder, check=True, capture_output=True)  # noqa: E731
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=trainmaster-test-ca",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=nats")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
async def test_the_bus_speaks_tls_when_configured(tmp_path):
    ca, cert, key = certificates(tmp_path)
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    stack = Stack(
        StackSettings(
            data_dir=tmp_path / "data",
            nats_port=free_port(),
            nats_url=None,
            cluster_file=tmp_path / "cluster.toml",
            nats_tls_cert=cert,
            nats_tls_key=key,
            nats_ca_file=ca,
        )
    )
    try:
        stack.start_nats()
        assert stack.nats_url.startswith("tls://")
        await asyncio.to_thread(stack.prepare_bus)  # connects with the CA file, as every process does
        with pytest.raises((NatsError, ssl.SSLError, OSError)):  # a client that does not trust that CA
            await nats.connect(
                stack.nats_url,
                user_credentials=str(stack.admin_creds()),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
        with pytest.raises((NatsError, OSError)):  # nor in clear text
            await nats.connect(
                stack.nats_url.replace("tls://", "nats://"),
                allow_reconnect=False,
                user_credentials=str(stack.admin_creds()),
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
    finally:
        stack.stop_all()


async def test_a_service_has_only_its_roles_rights(server):
    estimator = await Client().open(server, server.identities.creds("estimator"), inbox=busroles.inbox("estimator"))
    forbidden = (
        "tm.node.cmd.n1.start",
        "tm.job.status.Completed.Completed",
        "tm.job.task.n1.exited",
        "tm.rpc.billing.quotas",
        "$JS.API.CONSUMER.INFO.TM_NODE_CMD.agent-n1",
        "$JS.API.STREAM.MSG.GET.TM_NODE_CMD",
    )
    for subject in forbidden:
        await estimator.nc.publish(subject, b"{}")
    await estimator.nc.publish("tm.eta.j-1", b"{}")
    errors = await estimator.settle()
    assert [s for s in forbidden if not any(f'publish to "{s.lower()}"' in e for e in errors)] == []
    assert not any("tm.eta.j-1" in e for e in errors)
    await estimator.nc.close()


async def test_an_agent_cannot_drop_another_nodes_event_by_sending_its_message_id_first(server):
    """A stream de-duplicates by message id across all its subjects: ids must not be predictable."""
    seen: list[str] = []
    receiver = make_broker(server.nats_url, name="receiver", creds=server.admin_creds())

    @receiver.subscriber(**durable("tm.job.task.>", consumer=unique("receiver"), ordered=False, deliver_new=True))
    async def on_task(event: TaskExited) -> None:
        seen.append(f"{event.node_id}:{event.job_id}")

    await connect(receiver)
    await receiver.start()
    genuine = exited(unique("j"), node_id="n2")
    attacker = await as_agent(server, "n1")
    decoy = genuine.model_copy(update={"node_id": "n1"})  # legal on its own subject, with the id n2 will use
    for msg_id in (genuine.event_id, f"{genuine.subject}#{genuine.event_id}"):
        await attacker.nc.jetstream().publish(
            decoy.subject, decoy.model_dump_json().encode(), headers={"Nats-Msg-Id": msg_id}
        )
    agent = make_broker(server.nats_url, name="agent-n2", creds=agent_creds(server, "n2"))
    await connect(agent, declare=False)
    await publish(agent, genuine)
    for _ in range(50):
        if f"n2:{genuine.job_id}" in seen:
            break
        await asyncio.sleep(0.1)
    await agent.stop()
    await receiver.stop()
    await attacker.nc.close()
    assert f"n2:{genuine.job_id}" in seen


class Watcher:
    """The operator listening on platform subjects: whatever anyone publishes there, it sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def open(self, server: Stack, *subjects: str) -> "Watcher":
        self.nc = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))

        async def record(msg) -> None:
            self.seen.append((msg.subject, msg.data))

        for subject in subjects:
            await self.nc.subscribe(subject, cb=record)
        await self.nc.flush()
        return self


PLATFORM = ("tm.job.status.Completed.Completed", "tm.node.cmd.n2.stop")


async def test_an_agent_cannot_have_a_service_answer_its_event_onto_a_platform_subject(server):
    """FastStream answers a stream message's `reply_to` header: the monitor would publish there with its rights."""
    watcher = await Watcher().open(server, *PLATFORM)
    handled: list[str] = []
    monitor = make_broker(server.nats_url, name="monitor", creds=server.identities.creds("monitor"))

    @monitor.subscriber(**durable("tm.job.>", consumer="monitor-jobs", ordered=False))  # as declared: it binds
    async def on_job_event(event: dict) -> None:
        handled.append(event["job_id"])

    await connect(monitor)
    await monitor.start()
    agent = await as_agent(server, "n1")
    events = [exited(unique("j"), node_id="n1") for _ in PLATFORM]
    for event, reply in zip(events, PLATFORM):
        await agent.nc.jetstream().publish(event.subject, event.model_dump_json().encode(), headers={"reply_to": reply})
    for _ in range(50):
        if {e.job_id for e in events} <= set(handled):
            break
        await asyncio.sleep(0.1)
    await watcher.nc.flush()
    await asyncio.sleep(0.3)
    await monitor.stop()
    await agent.nc.close()
    await watcher.nc.close()
    assert {e.job_id for e in events} <= set(handled)  # the events are handled (after older ones), never answered
    assert watcher.seen == []


async def test_a_request_aimed_at_a_platform_subject_is_neither_answered_nor_permitted(server):
    watcher = await Watcher().open(server, *PLATFORM)
    asked: list[dict] = []
    billing = make_broker(server.nats_url, name="billing", creds=server.identities.creds("billing"))

    @billing.subscriber(bus.RPC_QUOTAS)
    async def quotas(query: dict) -> dict:
        asked.append(query)
        return {"project_id": "p"}

    await connect(billing)
    await billing.start()
    await billing.config.connection_state.connection.flush()  # its subscription is the server's before anyone asks
    submitter = await Client().open(server, server.identities.creds("submitter"), inbox=busroles.inbox("submitter"))
    for reply in PLATFORM:  # the service's code refuses the request
        await submitter.nc.publish(bus.RPC_QUOTAS, b'{"project_id": "p"}', reply=reply)
    answer = await submitter.nc.request(bus.RPC_QUOTAS, b'{"project_id": "p"}', timeout=5)  # an honest one
    assert answer.data == b'{"project_id":"p"}' and asked == [{"project_id": "p"}]
    await billing.stop()

    raw = await Client().open(server, server.identities.creds("billing"), inbox=busroles.inbox("billing"))

    async def answer_anywhere(msg) -> None:  # a service that answers whatever it is given: the server refuses
        await raw.nc.publish(msg.reply, b"{}")

    await raw.nc.subscribe(bus.RPC_QUOTAS, cb=answer_anywhere)
    await raw.nc.flush()
    answer = await honest_request(submitter, raw, bus.RPC_QUOTAS)  # its inbox: allowed (and it is subscribed)
    assert answer.data == b"{}"
    for reply in PLATFORM:
        await submitter.nc.publish(bus.RPC_QUOTAS, b"{}", reply=reply)
    await submitter.nc.flush()
    errors = await raw.settle()

    for _ in range(50):  # nats-py hands each -ERR to its callback in a task of its own: wait for them, bounded
        if all(any(f'publish to "{s.lower()}"' in e for e in errors) for s in PLATFORM):
            break
        await asyncio.sleep(0.1)
    await watcher.nc.flush()
    for client in (raw, submitter):
        await client.nc.close()
    await watcher.nc.close()
    assert watcher.seen == []
    assert all(any(f'publish to "{s.lower()}"' in e for e in errors) for s in PLATFORM), errors


# The bus is the platform's: a service reads its own consumers, it does not define them (nor the streams).
async def consumer_create(client: Client, subject: str, config: ConsumerConfig) -> None:
    """A raw `$JS.API.CONSUMER.CREATE` request (the body carries the config the server takes), refused by the
    server's permissions: no consumer is created."""
    body = json.dumps({"stream_name": subject.split(".")[4], "config": config.as_dict()}).encode()
    await client.refused(subject, lambda: client.nc.request(subject, body, timeout=5))


async def test_a_service_cannot_make_its_consumer_push_a_stream_onto_another_subject(server):
    """A push consumer's `deliver_subject` is in the request body: the server would publish the stream's messages
    there on the account's behalf, past the service's own publish permissions (here, as a request to the monitor).
    The whole-stream form of the request names no filter: the body chose one too."""
    foreign = "tm.rpc.monitor.terminate"
    watcher = await Watcher().open(server, foreign)
    estimator = await Client().open(server, server.identities.creds("estimator"), inbox=busroles.inbox("estimator"))
    for name, subject in (("estimator-placed", "tm.job.placed"), ("estimator-jobs", "")):
        push = ConsumerConfig(
            name=name, durable_name=name, deliver_subject=foreign, filter_subject=subject or "tm.job.placed"
        )
        await consumer_create(
            estimator, f"$JS.API.CONSUMER.CREATE.TM_JOBS.{name}{'.' + subject if subject else ''}", push
        )
    operator = make_broker(server.nats_url, name="operator", creds=server.admin_creds())
    await connect(operator)
    await publish(operator, placed(unique("j")))
    await operator.stop()
    await asyncio.sleep(0.5)
    await estimator.nc.close()
    await watcher.nc.close()
    assert watcher.seen == []


async def test_placement_cannot_read_a_nodes_commands_through_a_consumer_it_creates(server):
    """Placement made rented nodes' command consumers with its own credentials: the same right let it make one
    pushed into its own inbox and read every node's commands (and the job secrets in them)."""
    command = await command_for(server, "n2")
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    inbox = f"{busroles.inbox('placement')}.spy"
    leaked: list[bytes] = []

    async def record(msg) -> None:
        leaked.append(msg.data)

    await placement.nc.subscribe(inbox, cb=record)
    spy = ConsumerConfig(
        name="agent-spy", durable_name="agent-spy", deliver_subject=inbox, filter_subject="tm.node.cmd.n2.>"
    )
    await consumer_create(placement, "$JS.API.CONSUMER.CREATE.TM_NODE_CMD.agent-spy.tm.node.cmd.n2.>", spy)
    await asyncio.sleep(0.5)
    await placement.nc.close()
    assert not any(command.job_id.encode() in data for data in leaked)


async def test_a_service_cannot_change_a_stream(server):
    """STREAM.UPDATE could drop every job's events (retention, limits, subjects): only the operator declares."""
    billing = await Client().open(server, server.identities.creds("billing"), inbox=busroles.inbox("billing"))
    before = await stream_config(server, "TM_JOBS")
    shrunk = before.evolve(max_msgs=1, subjects=["tm.job.nothing"])
    try:
        await billing.refused(
            "$JS.API.STREAM.UPDATE.TM_JOBS", lambda: billing.nc.jetstream(timeout=5).update_stream(config=shrunk)
        )
    finally:
        await billing.nc.close()
        after = await stream_config(server, "TM_JOBS")
        if after != before:  # the attack went through: give the module's other tests their stream back
            operator = await Client().open(server, server.admin_creds())
            await operator.nc.jetstream().update_stream(config=before)
            await operator.nc.close()
    assert after == before


async def stream_config(server: Stack, name: str) -> StreamConfig:
    operator = await Client().open(server, server.admin_creds())
    info = await operator.nc.jetstream().stream_info(name)
    await operator.nc.close()
    return info.config
