"""Who may publish and subscribe what on the bus: the README's subject tables as server-enforced permissions.

A durable consumer is read through the JetStream API, not through a subscription, so reading a stream is granted
as that role's own consumers (info, fetch, ack) and nothing else: no other consumer, no STREAM.MSG.GET, no
DIRECT.GET. Nobody but the operator creates or changes a consumer or a stream (`shared.bustopology` declares them).
"""

from shared import bus, minting
from shared.buscreds import NAME, Permissions
from shared.bustopology import CONSUMERS as DECLARED

SERVICES = ("submitter", "placement", "monitor", "estimator", "billing")

# role: (durable consumer, filter subject) it reads; the stream follows from the subject (the consumers the
# operator declares for it, `shared.bustopology.CONSUMERS`).
CONSUMERS: dict[str, tuple[tuple[str, str], ...]] = {
    role: tuple((s["durable"], s["subject"]) for s in subscriptions) for role, subscriptions in DECLARED.items()
}
PUBLISHES: dict[str, tuple[str, ...]] = {
    "submitter": (
        "tm.job.submitted",
        "tm.job.terminate",
        "tm.job.deleted",
        "tm.job.migrate",
        bus.RPC_NODES,
        bus.RPC_TERMINATE,
        bus.RPC_MIGRATE,
        bus.RPC_USAGE,
        bus.RPC_ADMIT,
        bus.RPC_QUOTAS,
        bus.RPC_CANDIDATES,
        bus.RPC_CATALOGUE,
        bus.RPC_METRICS,
        bus.RPC_PREDICT,
        bus.RPC_HEALTH.format(service=">"),
    ),
    "placement": (
        "tm.job.placed",
        "tm.job.migrate",
        "tm.job.unplaceable",
        "tm.node.evt.provisioned",
        "tm.node.evt.released",
        "tm.notify.*",
        bus.RPC_ADMIT,
        bus.RPC_PREDICT,
        bus.RPC_METRICS,  # a job's recorded GPU memory peak, when it ran out of GPU memory
        *minting.SUBJECTS,  # a rented node's identities, asked of the minter: placement holds no signing key
    ),
    # the monitor alone commands agents: it starts the ranks of a placement it accepts, and stops them
    "monitor": (
        "tm.job.status.*.*",
        # statuses the version before wrote to a job's outbox (their subject stored with them) and had not relayed
        # when it stopped: relayed where they were written, for one version (`JobStatusChanged.legacy_subject`)
        "tm.job.status",
        "tm.job.node_lost",
        "tm.node.cmd.*.start",
        "tm.node.cmd.*.stop",
        # it drops a lost node's waiting starts (shared.bus.forget_starts); the purge request names the stream,
        # not the node, so this reaches every node's commands: the monitor issues all of them anyway
        f"$JS.API.STREAM.PURGE.{bus.NODE_COMMANDS.name}",
        "tm.node.evt.state",
        "tm.notify.*",
        bus.NODE_CADENCE,
    ),
    "estimator": ("tm.eta.*",),
    "billing": ("tm.notify.*",),
}
ANSWERS: dict[str, tuple[str, ...]] = {
    "submitter": (bus.RPC_SECRETS.format(node_id="*"),),
    "placement": (bus.RPC_CANDIDATES, bus.RPC_CATALOGUE),
    "monitor": (bus.RPC_NODES, bus.RPC_TERMINATE, bus.RPC_MIGRATE),
    "estimator": (bus.RPC_METRICS, bus.RPC_PREDICT),
    "billing": (bus.RPC_USAGE, bus.RPC_ADMIT, bus.RPC_QUOTAS),
}

# Core NATS subjects a process reads as they come (no stream): the monitor, every node's heartbeat; an agent, the
# heartbeat interval the monitor announces.
LISTENS: dict[str, tuple[str, ...]] = {"monitor": (bus.HEARTBEATS,), "agent": (bus.NODE_CADENCE,)}

# Where a service answers agents (each agent reads only its own node's part of that space).
ANSWERS_AGENTS: dict[str, tuple[str, ...]] = {"submitter": (f"{bus.SECRETS_INBOX.format(node_id='*')}.>",)}


def inbox(identity: str) -> str:
    """The identity's own reply-subject space: nobody else can subscribe to its replies."""
    return f"_INBOX_{identity}"


def reads(consumer: str, filter_subject: str) -> tuple[str, ...]:
    """The JetStream API subjects to read one durable consumer the operator declared: its info, fetch and ack;
    its messages are delivered into the reader's own inbox. No create: a create request carries the consumer's
    config in its body (a push consumer's `deliver_subject`, other filters), where no permission reaches."""
    stream = bus.stream_of(filter_subject)
    return (
        f"$JS.API.CONSUMER.INFO.{stream.name}.{consumer}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{consumer}",
        f"$JS.ACK.{stream.name}.{consumer}.>",
    )


def stream_info() -> tuple[str, ...]:
    """Reading the config and state of trainmaster's streams (never creating, changing or deleting one)."""
    return tuple(f"$JS.API.STREAM.INFO.{s.name}" for s in (*bus.STREAMS, bus.LEASES))


def leads(role: str) -> tuple[str, ...]:
    """Taking, renewing and reading back its own leader lease (shared/lease.py), no other service's."""
    if role not in bus.SERVICES:
        return ()
    key = f"$KV.{bus.LEASE_BUCKET}.{role}"
    return key, f"$JS.API.DIRECT.GET.{bus.LEASES.name}.{key}"


OPERATOR = "admin"  # the operator's own tools (a bench's probe of the monitor's health) ask from `_INBOX_admin`


def asked_by(role: str) -> tuple[str, ...]:
    """Who may ask this role something: the services one of whose requests it answers (its health included), and
    the operator."""
    asked = (*ANSWERS[role], bus.RPC_HEALTH.format(service=role))
    services = tuple(r for r in SERVICES if any(bus.subjects_overlap(p, a) for p in PUBLISHES[r] for a in asked))
    return (*services, OPERATOR)


def service(role: str) -> Permissions:
    """A service's permissions. It answers into the inboxes of the services that may ask it, and nowhere else: no
    response permission, which would let a requester aim its answer at any subject (`tm.job.status`)."""
    consumed = tuple(s for consumer, subject in CONSUMERS[role] for s in reads(consumer, subject))
    answers = tuple(f"{inbox(r)}.>" for r in asked_by(role))
    return Permissions(
        publish=(*PUBLISHES[role], *consumed, *stream_info(), *leads(role), *answers, *ANSWERS_AGENTS.get(role, ())),
        subscribe=(*ANSWERS[role], *LISTENS.get(role, ()), bus.RPC_HEALTH.format(service=role)),
        inbox=inbox(role),
        responses=False,
    )


def agent(node_id: str, *, own_key: bool = False, secrets: bool = True) -> Permissions:
    """An agent: its own node's events, its tasks' events and output, its own commands (a consumer made for it).
    It answers its health probe by response permission (once, to the reply subject the submitter gave), not by a
    right to publish into the submitter's inbox, where the submitter's own stream deliveries arrive. A node's start
    identity may ask to trade itself for a key the agent made (`shared.minting.RekeyAgent`); that key's identity
    (`own_key`) may only say it is connected (`RekeyConfirmed`); both read the minter's answers for their node.
    `secrets`: whether it may ask the submitter for the secrets of the tasks placed on its node; a rented node's start
    identity may not (it travelled in user data any task of the node can read from the metadata service, and a
    Secret): only the key its agent made itself, and a static node's identity, kept on the node, ask for them."""
    if not NAME.match(node_id):
        raise ValueError(f"param[node_id] invalid: {node_id!r} is not a bus token ({NAME.pattern})")
    consumer, subject = bus.agent_consumer(node_id)
    events = (
        *(bus.NODE_EVENT.format(node_id=node_id, event=e) for e in ("registered", "heartbeat", "interrupted")),
        *(
            bus.TASK_EVENT.format(node_id=node_id, event=e)
            for e in ("preparing", "started", "exited", "hung", "resumed")
        ),
        bus.LOG_SUBJECT.format(node_id=node_id, job_id="*"),
        bus.TELEMETRY_SUBJECT.format(node_id=node_id, job_id="*"),
    )
    trade = (minting.REKEYED_AGENT if own_key else minting.REKEY_AGENT).format(node_id=node_id)
    asks = (bus.RPC_SECRETS.format(node_id=node_id),) if secrets else ()
    answers = (f"{bus.SECRETS_INBOX.format(node_id=node_id)}.>",) if secrets else ()
    return Permissions(
        publish=(*events, *reads(consumer, subject), trade, *asks),
        subscribe=(
            bus.RPC_HEALTH.format(service=f"agent.{node_id}"),
            *LISTENS["agent"],
            f"{minting.REKEY_INBOX.format(node_id=node_id)}.>",
            *answers,
        ),
        inbox=inbox(f"agent-{node_id}"),
    )


def consumer_maker(node_id: str) -> Permissions:
    """The short-lived identity placement mints to create a rented node's command consumer (its config fixed by
    `bus.agent_consumer_config`): that one create request, nothing else."""
    if not NAME.match(node_id):
        raise ValueError(f"param[node_id] invalid: {node_id!r} is not a bus token ({NAME.pattern})")
    consumer, subject = bus.agent_consumer(node_id)
    return Permissions(
        publish=(f"$JS.API.CONSUMER.CREATE.{bus.NODE_COMMANDS.name}.{consumer}.{subject}",),
        subscribe=(),
        inbox=inbox(f"consumer-maker-{node_id}"),
        responses=False,
    )


MINTER = "minter"


def minter() -> Permissions:
    """The minter process: it answers placement's (and the operator's) requests for rented nodes' identities, into
    their inboxes, and agents' trades of their start identities into the space kept for those answers (each node's
    agent reads its own node's there), nowhere else."""
    return Permissions(
        publish=(*(f"{inbox(r)}.>" for r in ("placement", OPERATOR)), f"{minting.REKEY_INBOX.format(node_id='*')}.>"),
        subscribe=(*minting.SUBJECTS, *minting.REKEY_SUBJECTS),
        inbox=inbox(MINTER),
        responses=False,
    )


def admin() -> Permissions:
    """The operator's own identity (the stack's set-up, tests): everything."""
    return Permissions(publish=(">",), subscribe=(">",), inbox=inbox(OPERATOR))


def account_updater(account: str) -> Permissions:
    """A system-account user that may only push the application account's new JWT (revocations) to the server."""
    return Permissions(
        publish=(f"$SYS.REQ.ACCOUNT.{account}.CLAIMS.UPDATE",),
        subscribe=(),
        inbox=inbox("account-updater"),
        responses=False,
    )
