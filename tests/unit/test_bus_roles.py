"""Bus identities as pure data: JWTs, each role's permissions, the subject check receivers apply."""

import re
from pathlib import Path

import pytest

from shared import bus, busroles, replies
from shared.buscreds import Minter, decode_claims, new_seed, public_key
from shared.events import NodeRegistered
from tests.factories import exited, node, started

SERVICES_DIR = Path(__file__).resolve().parents[2] / "services"
DURABLE = re.compile(r'durable\(\s*([A-Z_]+|"[^"]+")\s*,\s*consumer="([^"]+)"')


def minter() -> Minter:
    return Minter(
        account=public_key(new_seed("account")),
        account_signer_seed=new_seed("account"),
        operator_signer_seed=new_seed("operator"),
        account_name="t",
        system_creds="",
    )


def test_every_durable_consumer_of_a_service_is_in_its_roles_permissions():
    declared = {(c, s) for role in busroles.CONSUMERS.values() for c, s in role}
    found = set()
    for path in SERVICES_DIR.glob("*/handlers.py"):
        for subject, consumer in DURABLE.findall(path.read_text()):
            found.add((consumer, getattr(bus, subject) if subject.isupper() else subject.strip('"')))
    assert found and found <= declared, found - declared
    for role, consumers in busroles.CONSUMERS.items():
        assert all(c.startswith(f"{role}-") for c, _ in consumers)


def test_an_agent_publishes_only_subjects_carrying_its_node():
    permissions = busroles.agent("n1")
    subjects = [s for s in permissions.publish if not s.startswith("$JS.")]
    assert subjects and all(".n1." in s for s in subjects)
    # its own health probe, and the heartbeat interval the monitor announces to every agent
    assert permissions.subscribe == ("tm.rpc.health.agent.n1", "tm.node.cadence")
    assert permissions.inbox == "_INBOX_agent-n1"
    assert not any("CREATE" in s or "STREAM" in s or "DIRECT" in s for s in permissions.publish)
    claims = permissions.claims()
    assert claims["sub"]["allow"] == ["tm.rpc.health.agent.n1", "tm.node.cadence", "_INBOX_agent-n1.>"]


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
    assert bus.implied_subject(honest.model_dump(mode="json")) == "tm.job.task.n1.exited"
    assert bus.implied_subject({"type": "TaskExited", "node_id": "n2"}) is None  # unparseable: the handler decides
    assert bus.implied_subject({"no": "type"}) is None and bus.implied_subject([1]) is None


def test_a_service_answers_only_into_the_inboxes_of_those_that_may_ask_it():
    for role in busroles.SERVICES:
        claims = busroles.service(role).claims()
        assert "resp" not in claims  # no answer to whatever reply subject a request names
        inboxes = [s for s in claims["pub"]["allow"] if s.startswith("_INBOX")]
        assert inboxes == [f"{busroles.inbox(r)}.>" for r in busroles.asked_by(role)]
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
