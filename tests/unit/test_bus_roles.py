"""Bus identities as pure data: JWTs, each role's permissions, the subject check receivers apply."""

import importlib

import pytest

from shared import bus, busroles, bustopology, replies
from shared.buscreds import Minter, decode_claims, new_seed, public_key
from shared.events import NodeRegistered
from tests.factories import exited, node, started


def minter() -> Minter:
    return Minter(
        account=public_key(new_seed("account")),
        account_signer_seed=new_seed("account"),
        operator_signer_seed=new_seed("operator"),
        account_name="t",
        system_creds="",
    )


def created_by(subscriber) -> dict:
    """The consumer nats-py's `pull_subscribe` would create for a service's subscriber if it were missing."""
    name, subject = subscriber.config.durable_name, subscriber.subject.broker_address
    return {
        "stream": subscriber.stream.name,
        **bus.created_config(subscriber.config, name=name, subject=subject).as_dict(),
    }


@pytest.mark.parametrize("role", busroles.SERVICES)
def test_the_platform_declares_every_consumer_of_a_service_exactly_as_its_handlers_read_it(role):
    """A service binds to what the operator declared; were a consumer missing or different, it would read
    another filter than its handler table names, or (were it allowed to) make its own."""
    router = importlib.import_module(f"services.{role}.handlers").router
    subscribed = {
        s.config.durable_name: created_by(s) for s in router.subscribers if getattr(s, "stream", None) is not None
    }
    declared = {
        s["durable"]: {"stream": bus.stream_of(s["subject"]).name, **bus.consumer_config(s).as_dict()}
        for s in bustopology.CONSUMERS[role]
    }
    assert subscribed and subscribed == declared
    assert all(c.startswith(f"{role}-") for c in declared)
    assert busroles.CONSUMERS[role] == tuple((s["durable"], s["subject"]) for s in bustopology.CONSUMERS[role])


# What makes or changes a stream or a consumer (a create request's body is out of any permission's reach).
MAKERS = (
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.API.STREAM.CREATE.>",
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
)


@pytest.mark.parametrize("identity", [*busroles.SERVICES, "agent-n1"])
def test_no_service_or_agent_may_create_or_change_a_stream_or_a_consumer(identity):
    """The body of a create request (a push consumer's deliver_subject, its filters) is out of any permission's
    reach; a stream update could drop every job's events. Every grant is checked: `$JS.>` or `>` would reach them."""
    role = busroles.agent("n1") if identity.startswith("agent-") else busroles.service(identity)
    reaching = [(s, m) for s in role.publish for m in MAKERS if bus.subjects_overlap(s, m)]
    assert reaching == []
    api = [s for s in role.publish if s.startswith("$JS.API.")]
    assert not any(">" in s or "*" in s for s in api), api  # each names its stream and consumer
    purges = [s for s in api if ".PURGE." in s]
    assert purges == ([f"$JS.API.STREAM.PURGE.{bus.NODE_COMMANDS.name}"] if identity == "monitor" else [])


@pytest.mark.parametrize("grant", [">", "$JS.>", "$JS.*.>", "$JS.API.CONSUMER.*.TM_JOBS.x", "$JS.API.STREAM.>"])
def test_a_wildcard_grant_reaches_what_makes_consumers_or_streams(grant):
    assert any(bus.subjects_overlap(grant, m) for m in MAKERS)


def test_the_identity_that_makes_a_rented_nodes_consumer_may_create_that_one_and_expires():
    maker = busroles.consumer_maker("od-1")
    assert maker.publish == ("$JS.API.CONSUMER.CREATE.TM_NODE_CMD.agent-od-1.tm.node.cmd.od-1.>",)
    assert maker.subscribe == () and "resp" not in maker.claims()
    _, creds = minter().mint(name="consumer-maker-od-1", permissions=maker, expires_at=2_000_000_000)
    assert decode_claims(creds.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0])["exp"] == 2_000_000_000
    config = bus.agent_consumer_config("od-1")  # fixed by code: a pull consumer of that node's commands only
    assert config.deliver_subject is None and config.filter_subject == "tm.node.cmd.od-1.>"
    assert config.name == config.durable_name == "agent-od-1" and not config.filter_subjects
    with pytest.raises(ValueError, match=r"param\[node_id\]"):
        busroles.consumer_maker("od.>")


def test_an_agent_publishes_only_subjects_carrying_its_node():
    permissions = busroles.agent("n1")
    subjects = [s for s in permissions.publish if not s.startswith("$JS.")]
    assert subjects and all(".n1." in s or s.endswith(".n1") for s in subjects)  # its rekey: tm.rpc.minter.rekey.n1
    # its own health probe, the heartbeat interval the monitor announces to every agent, the minter's and the
    # submitter's answers to its node
    assert permissions.subscribe == (
        "tm.rpc.health.agent.n1",
        "tm.node.cadence",
        "_INBOX_rekey.n1.>",
        "_INBOX_secrets.n1.>",
    )
    assert permissions.inbox == "_INBOX_agent-n1"
    assert "tm.rpc.submitter.secrets.n1" in permissions.publish  # its own node's secrets request only
    assert not any("CREATE" in s or "STREAM" in s or "DIRECT" in s for s in permissions.publish)
    claims = permissions.claims()
    assert claims["sub"]["allow"] == [
        "tm.rpc.health.agent.n1",
        "tm.node.cadence",
        "_INBOX_rekey.n1.>",
        "_INBOX_secrets.n1.>",
        "_INBOX_agent-n1.>",
    ]


def test_only_the_submitter_answers_agents_secrets_requests_and_only_into_the_nodes_space():
    for role in (*bus.SERVICES, "submitter"):
        permissions = busroles.service(role)
        answers = "_INBOX_secrets.*.>" in permissions.publish
        asked = "tm.rpc.submitter.secrets.*" in permissions.subscribe
        assert answers == asked == (role == "submitter"), role


@pytest.mark.parametrize("node_id", ["a.b", "*", ">", "n 1", "", "x" * 65])
def test_a_node_id_that_is_not_one_subject_token_gets_no_identity(node_id):
    with pytest.raises(ValueError, match=r"param\[node_id\]"):
        busroles.agent(node_id)


def test_an_agents_events_land_on_subjects_its_permissions_allow():
    allowed = busroles.agent("n1").publish
    for event in (started("j", node_id="n1"), exited("j", node_id="n1")):
        assert event.subject in allowed
    registered = bus.NODE_EVENT.format(node_id="n1", event="registered")
    assert NodeRegistered(event_id="e", node=node(node_id="n1"), boot_id="b").subject == registered


def test_a_minted_user_is_signed_by_the_accounts_signing_key_and_revocation_reissues_the_account():
    m = minter()
    user, creds = m.mint(name="agent-n1", permissions=busroles.agent("n1"))
    token = creds.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0]
    claims = decode_claims(token)
    assert claims["sub"] == user and claims["iss"] == public_key(m.account_signer_seed)
    assert claims["nats"]["issuer_account"] == m.account and claims["nats"]["type"] == "user"
    first = decode_claims(m.account_jwt())
    second = decode_claims(m.revoke(user))
    third = decode_claims(m.revoke(user))
    assert "revocations" not in first["nats"] and user in second["nats"]["revocations"]
    assert third["iat"] > second["iat"]  # the server takes only a newer account JWT


def test_an_event_is_checked_against_the_subject_its_payload_implies():
    honest = exited("j", node_id="n1")
    assert bus.parse_event(honest.model_dump(mode="json")).subject == "tm.job.task.n1.exited"
    assert bus.parse_event({"type": "TaskExited", "node_id": "n2"}) is None  # unparseable: the handler decides
    assert bus.parse_event({"no": "type"}) is None and bus.parse_event([1]) is None


def test_a_service_answers_only_into_the_inboxes_of_those_that_may_ask_it():
    for role in busroles.SERVICES:
        claims = busroles.service(role).claims()
        assert "resp" not in claims  # no answer to whatever reply subject a request names
        inboxes = [s for s in claims["pub"]["allow"] if s.startswith("_INBOX")]
        agents = list(busroles.ANSWERS_AGENTS.get(role, ()))  # the submitter: each node's own secrets space
        assert inboxes == [f"{busroles.inbox(r)}.>" for r in busroles.asked_by(role)] + agents
        assert "_INBOX_submitter.>" in inboxes and not any("agent" in s for s in inboxes)
    assert busroles.asked_by("billing") == busroles.asked_by("estimator") == ("submitter", "placement", "admin")
    assert busroles.asked_by("monitor") == ("submitter", "admin")  # the operator's tools too, from _INBOX_admin
    assert "resp" in busroles.agent("n1").claims()  # once, to the reply subject of its health probe only


@pytest.mark.parametrize(
    "subject, inbox",
    [
        ("_INBOX_submitter.Xy12.ab", True),
        ("_INBOX_agent-n1.abc", True),
        ("_INBOX_placement.a.b.c", True),
        ("tm.job.status", False),
        ("tm.node.cmd.n2.stop", False),
        ("_INBOX.abc", False),
        ("_INBOX_submitter", False),
        ("_INBOX_submitter.>", False),
        ("_INBOX_submitter.*", False),
        ("$KV.tm_leaders.monitor", False),
        ("_INBOX_sub.mitter..x", False),
        ("_INBOX_x.a b", False),
        ("", False),
    ],
)
def test_an_inbox_is_an_identitys_own_reply_space(subject, inbox):
    assert replies.is_inbox(subject) is inbox


@pytest.mark.parametrize("subject", ["tm.job.status.Running.Running", "tm.job.status"])
def test_only_the_monitor_publishes_statuses_on_their_subjects_and_on_the_one_before(subject):
    """A status's subject names its phase; the monitor keeps the subject every status had before for one version:
    statuses the version before wrote to a job's outbox (with their subject) and had not relayed when it stopped
    go out where they were written, or they and every later event of their job would wait behind a refusal."""
    for identity, permissions in [
        *((role, busroles.service(role)) for role in busroles.SERVICES),
        ("agent-n1", busroles.agent("n1")),
    ]:
        allowed = any(bus.subjects_overlap(p, subject) for p in permissions.publish if not p.startswith("$"))
        assert allowed == (identity == "monitor"), identity
