"""The minter's grants as pure decisions, and an older data dir's placement minter moved to it."""

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from shared import busroles
from shared.buscreds import (
    STATIC_REVOCATIONS,
    Minter,
    StaticRevocations,
    decode_claims,
    new_seed,
    public_key,
    write_secret,
)
from shared.minting import CONSUMER_MAKER_TTL_S, MintAgent, MintConsumerMaker, RevokeNode
from services.minter.bucket import TokenBucket
from services.minter.rules import (
    Limits,
    Refused,
    may_make_consumer,
    mint_agent,
    mint_consumer_maker,
    revoke_node,
    unlaunched,
)
from services.stack.identities import Identities, write
from tests.unit.test_bus_roles import minter
from tests.unit.test_stack_restart import stack_of

STATIC = frozenset({"n1"})


def limits(*, max_rented_nodes: int = 64, burst: int = 64, per_minute: float = 12) -> Limits:
    return Limits(static=STATIC, max_rented_nodes=max_rented_nodes, bucket=TokenBucket(burst, per_minute))


def agent(m: Minter, node_id: str, *, within: Limits | None = None, now: float = 1_000.0) -> tuple[str, str]:
    return mint_agent(m, MintAgent(node_id=node_id), limits=within or limits(), now=now, monotonic=now)


def consumer_maker(m: Minter, node_id: str, *, within: Limits | None = None, now: float = 1_000.0) -> tuple[str, str]:
    allowed = may_make_consumer(m, MintConsumerMaker(node_id=node_id), limits=within or limits(), monotonic=now)
    return mint_consumer_maker(m, allowed, now=now)


def claims_of(creds: str) -> dict:
    return decode_claims(creds.split("USER JWT-----\n")[1].split("\n")[0])


def test_an_agent_is_minted_with_the_agent_role_of_its_node_alone_and_recorded_for_its_revocation():
    m = minter()
    user, creds = agent(m, "od-1", now=1_234.5)
    assert claims_of(creds)["nats"]["pub"]["allow"] == list(busroles.agent("od-1", secrets=False).publish)
    # a start identity asks for no secrets of its node's tasks (any task of the node can read it from user data)
    assert "tm.rpc.submitter.secrets.od-1" not in claims_of(creds)["nats"]["pub"]["allow"]
    assert "_INBOX_secrets.od-1.>" not in claims_of(creds)["nats"]["sub"]["allow"]
    assert "exp" not in claims_of(creds) and m.minted == {"od-1": [user]} and m.minted_at == {"od-1": 1_234}


def test_a_static_node_gets_no_identity_nor_consumer_maker_from_the_minter():
    with pytest.raises(Refused, match="cluster file"):
        agent(minter(), "n1")
    with pytest.raises(Refused, match="cluster file"):
        consumer_maker(minter(), "n1")


def test_a_consumer_maker_expires_and_is_not_kept():
    m = minter()
    agent(m, "od-1")
    kept = dict(m.minted)
    _, creds = consumer_maker(m, "od-1", now=1_000)
    assert claims_of(creds)["exp"] == 1_000 + CONSUMER_MAKER_TTL_S and m.minted == kept


def test_a_second_agent_identity_for_a_node_with_a_live_one_is_refused():
    """The minter minted one per request: a second user with the same permissions read the node's command stream
    (job secrets included) beside the real agent."""
    m = minter()
    first, _ = agent(m, "od-1")
    with pytest.raises(Refused, match="live agent identity already"):
        agent(m, "od-1")
    assert m.minted == {"od-1": [first]}


def test_a_node_whose_identity_was_revoked_gets_none_again():
    """Revoking a live node's identity and minting it a new one would take the node's place on its commands."""
    m = minter()
    agent(m, "od-1")
    revoke_node(m, RevokeNode(node_id="od-1"))
    with pytest.raises(Refused, match="never another"):
        agent(m, "od-1")
    assert m.minted == {} and set(m.retired) == {"od-1"}


def test_a_consumer_maker_only_for_a_node_with_a_live_agent_identity():
    """Any node id got one: a consumer for a node no agent reads, or for one revoked."""
    m = minter()
    with pytest.raises(Refused, match="no live agent identity"):
        consumer_maker(m, "od-invented")
    agent(m, "od-1")
    revoke_node(m, RevokeNode(node_id="od-1"))
    with pytest.raises(Refused, match="no live agent identity"):
        consumer_maker(m, "od-1")


def test_invented_nodes_past_the_cap_get_no_identity_and_the_refusal_names_the_cap():
    """Any number of node ids got an identity each."""
    m, capped = minter(), limits(max_rented_nodes=3)
    for i in range(3):
        agent(m, f"od-{i}", within=capped)
    with pytest.raises(Refused, match=r"at most 3 \(TRAINMASTER_MAX_RENTED_NODES\)"):
        agent(m, "od-3", within=capped)
    revoke_node(m, RevokeNode(node_id="od-0"))  # a release makes room
    agent(m, "od-3", within=capped)
    assert len(m.minted) == 3


def test_no_identity_is_minted_once_the_account_carries_its_most_revocations():
    """Every release adds one to the account JWT, never removed (agent identities carry no expiry): past what the
    server's max_payload takes, the account update fails and no identity can be revoked any more."""
    m, bounded = minter(), Limits(static=STATIC, max_rented_nodes=64, bucket=TokenBucket(64, 12), max_revocations=2)
    for node_id in ("od-1", "od-2"):
        agent(m, node_id, within=bounded)
        revoke_node(m, RevokeNode(node_id=node_id))
    with pytest.raises(Refused, match=r"at most 2 \(TRAINMASTER_MAX_REVOCATIONS\)"):
        agent(m, "od-3", within=bounded)
    assert len(m.revocations) == 2 and m.minted == {}


def test_the_static_identities_revocations_count_against_the_accounts_most():
    m, bounded = minter(), Limits(static=STATIC, max_rented_nodes=64, bucket=TokenBucket(64, 12), max_revocations=2)
    agent(m, "od-1", within=bounded)
    revoke_node(m, RevokeNode(node_id="od-1"))
    m.static = StaticRevocations(revoked={public_key(new_seed("user")): 1_000}, issued_at=1_001)
    with pytest.raises(Refused, match=r"carries 2 revocations, at most 2"):
        agent(m, "od-2", within=bounded)


def test_mints_past_the_burst_are_refused_naming_the_rate_until_the_bucket_refills():
    m, rate = minter(), limits(burst=3, per_minute=6)
    agent(m, "od-1", within=rate, now=100)
    consumer_maker(m, "od-1", within=rate, now=100)  # consumer makers count too
    agent(m, "od-2", within=rate, now=100)
    with pytest.raises(Refused, match=r"at most 3 mints at once, then 6 a minute"):
        agent(m, "od-3", within=rate, now=105)
    with pytest.raises(Refused, match="rate limit"):
        consumer_maker(m, "od-2", within=rate, now=105)
    assert "od-3" not in m.minted
    agent(m, "od-3", within=rate, now=110)  # one token every 10 s


def test_a_refused_request_takes_no_token():
    m, rate = minter(), limits(burst=1)
    agent(m, "od-1", within=rate)
    revoke_node(m, RevokeNode(node_id="od-1"))
    for refused in ("n1", "od-1"):
        with pytest.raises(Refused):
            agent(m, refused, within=limits(burst=1))
    fresh = limits(burst=1)
    with pytest.raises(Refused, match="never another"):
        agent(m, "od-1", within=fresh)
    agent(m, "od-2", within=fresh)


def test_the_bucket_refills_at_its_rate_up_to_its_capacity():
    bucket = TokenBucket(capacity=2, per_minute=60)
    assert [bucket.take(0), bucket.take(0), bucket.take(0.5), bucket.take(1.0)] == [True, True, False, True]
    assert [bucket.take(100), bucket.take(100), bucket.take(100)] == [True, True, False]


def test_a_revocation_revokes_what_was_minted_for_that_node_and_nothing_else():
    m = minter()
    first, _ = agent(m, "od-1")
    other, _ = agent(m, "od-2")
    m.minted["od-1"].append(second := public_key(new_seed("user")))  # an older data dir's second user of od-1
    account = revoke_node(m, RevokeNode(node_id="od-1"))
    assert set(decode_claims(account)["nats"]["revocations"]) == {first, second}
    issued = m.issued_at
    again = revoke_node(m, RevokeNode(node_id="od-1"))  # a push that failed is made again, newer
    assert decode_claims(again)["nats"]["revocations"] == decode_claims(account)["nats"]["revocations"]
    assert m.issued_at > issued and m.minted == {"od-2": [other]} and set(m.minted_at) == {"od-2"}


def test_identities_past_the_grace_that_no_launched_instance_carries_are_due_for_revocation():
    m = minter()
    agent(m, "od-old", now=1_000)
    agent(m, "od-launched", now=1_000)
    agent(m, "od-young", now=1_250)
    m.minted["od-upgraded"] = [public_key(new_seed("user"))]  # moved from an older data dir: no mint time
    ec2 = frozenset({"ec2"})
    assert unlaunched(m, launched=None, now=1_300, grace_s=100, providers=ec2) == {
        "ec2": ["od-launched", "od-old", "od-upgraded"]
    }
    assert unlaunched(m, launched={"ec2": {"od-launched": {"i-1"}}}, now=1_300, grace_s=100, providers=ec2) == {
        "ec2": ["od-old", "od-upgraded"]
    }
    assert unlaunched(m, launched=None, now=1_300, grace_s=100, providers=frozenset()) == {}  # it asks no cloud


@pytest.mark.parametrize("own_server", [False, True])
def test_placements_old_minter_file_moves_to_the_minter_with_its_revocations_and_live_rented_users(
    tmp_path, own_server
):
    """Placement kept the account and operator signing keys (`bus/placement/minter.json`): moved at start, placement's
    copy deleted; the users it minted for nodes still rented are revoked at their release. A stack that configures
    its own server replaces both keys (the account re-issued newer); one whose server is configured elsewhere keeps
    them (its server trusts them)."""
    identities = Identities(tmp_path / "bus", retire_moved_keys=own_server)
    keys = identities.stored_keys()
    old = Minter(
        account=public_key(keys["account"]),
        account_signer_seed=keys["account_signer"],
        operator_signer_seed=keys["operator_signer"],
        account_name="trainmaster",
        system_creds="",
        revocations={"UOLD": 7},
        issued_at=9,
    ).to_json()
    old = json.loads(old)
    old.pop("minted")  # the old file has no such field
    write_secret(identities.placement_minter_file, json.dumps(old))
    live = public_key(new_seed("user"))
    write_secret(tmp_path / "provisioned" / "od-1.user", live)

    moved = identities.minter()
    assert (moved.revocations, moved.minted) == ({"UOLD": 7}, {"od-1": [live]})
    assert not identities.placement_minter_file.exists() and identities.minter_file.stat().st_mode & 0o777 == 0o600
    assert "UOLD" in decode_claims(identities.minter().account_jwt())["nats"]["revocations"]
    signers = (moved.account_signer_seed, moved.operator_signer_seed)
    assert (signers == (keys["account_signer"], keys["operator_signer"])) is not own_server
    assert (moved.issued_at > 9) is own_server
    now = identities.keys()
    assert (now["account_signer"], now["operator_signer"]) == signers and now["account"] == keys["account"]


def test_make_run_gives_placement_no_key_and_the_minter_its_file(tmp_path):
    stack = stack_of(tmp_path)
    placement, minting = stack.env_of("placement"), stack.env_of(busroles.MINTER)
    assert placement["TRAINMASTER_NATS_MINTER"] == "true" and "TRAINMASTER_MINTER_FILE" not in placement
    assert minting["TRAINMASTER_MINTER_FILE"] == str(stack.identities.minter_file)
    assert "TRAINMASTER_ADMIN_TOKEN" not in minting and "MONGO_URL" not in minting


def test_the_stack_starts_the_minter_again_when_it_exits(tmp_path, monkeypatch):
    stack = stack_of(tmp_path)
    started = []
    monkeypatch.setattr(stack, "start_minter", lambda: started.append(busroles.MINTER))
    assert stack.restart(busroles.MINTER) and started == [busroles.MINTER]


def bus_folders(service: dict) -> list[str]:
    """The folders of the `bus` volume (keys, creds, the minter's file) a compose service mounts."""
    mounts = [m for m in service.get("volumes", ()) if isinstance(m, dict) and m.get("source") == "bus"]
    return [m["volume"]["subpath"] for m in mounts]


def test_under_compose_only_the_minter_mounts_its_keys_and_placement_only_its_own_creds():
    """Placement's containers mounted `placement/` of the bus volume: the account's and the operator's signing keys."""
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())["services"]
    assert bus_folders(compose["placement"]) == ["creds/placement"]
    assert compose["placement"]["environment"]["TRAINMASTER_NATS_MINTER"] == "true"
    assert bus_folders(compose[busroles.MINTER]) == ["creds/minter", "minter"]
    holders = [
        name for name, service in compose.items() if "minter" in bus_folders(service) or "bus:/bus" in str(service)
    ]
    assert holders == ["bus-keys", busroles.MINTER]


def test_compose_bus_keys_writes_the_minters_creds_and_can_retire_the_keys_placement_held(tmp_path):
    identities = Identities(tmp_path / "bus", retire_moved_keys=True)
    held = identities.stored_keys()["account_signer"]
    old = json.loads(identities.new_minter().to_json())
    old.pop("minted")
    write_secret(identities.placement_minter_file, json.dumps(old))

    write(identities, node_ids=["n1"], resolver_dir=tmp_path / "accounts", admin_uid=None)
    assert (tmp_path / "bus" / "creds" / busroles.MINTER / "nats.creds").exists()
    assert not identities.placement_minter_file.exists()
    auth = (tmp_path / "bus" / "server" / "auth.conf").read_text()
    account = next(t for t in re.findall(r'"(ey[^"]+)"', auth) if decode_claims(t)["sub"] == old["account"])
    assert decode_claims(account)["nats"]["signing_keys"] == [public_key(identities.keys()["account_signer"])]
    assert public_key(held) not in auth


def test_a_write_told_to_revokes_the_static_identities_earlier_creds_and_every_account_the_minter_pushes_carries_it(
    tmp_path, monkeypatch
):
    """Compose's bus-keys runs at every `up` beside running containers, whose connections a revocation would close
    for good: it revokes only when told (`--revoke-earlier`); `make run` does at every start (nothing runs yet)."""
    identities = Identities(tmp_path / "bus")
    creds = tmp_path / "bus" / "creds" / "agent-n1" / "nats.creds"
    static_file = identities.minter_file.parent / STATIC_REVOCATIONS
    monkeypatch.setattr("time.time", lambda: 1_000.5)
    write(identities, node_ids=["n1"], resolver_dir=tmp_path / "accounts", admin_uid=None)
    first = claims_of(creds.read_text())
    minter_file = identities.minter_file.read_text()
    monkeypatch.setattr("time.time", lambda: 1_002.5)
    write(identities, node_ids=["n1"], resolver_dir=tmp_path / "accounts", admin_uid=None)
    assert not static_file.exists()  # a plain write revokes nothing
    monkeypatch.setattr("time.time", lambda: 1_005.5)
    write(identities, node_ids=["n1"], resolver_dir=tmp_path / "accounts", admin_uid=None, revoke_earlier=True)
    second = claims_of(creds.read_text())

    static = StaticRevocations.load(identities.minter_file.parent / STATIC_REVOCATIONS)
    seeds = sorted((tmp_path / "bus" / "users").glob("*.seed"))
    assert static.revoked == {public_key(f.read_text().strip()): 1_004 for f in seeds}  # every static identity
    assert second["sub"] == first["sub"] and first["iat"] <= 1_004 < second["iat"]  # the user stays, re-issued
    assert identities.minter_file.read_text() == minter_file  # the minter's own file is the minter's alone
    auth = (tmp_path / "bus" / "server" / "auth.conf").read_text()
    application = public_key(identities.keys()["account"])
    account = next(t for t in re.findall(r'"(ey[^"]+)"', auth) if decode_claims(t)["sub"] == application)
    assert decode_claims(account)["nats"]["revocations"] == static.revoked
    assert decode_claims(account)["iat"] == static.issued_at >= 1_005

    m = Minter.load(identities.minter_file)  # as the minter reads it at each request
    rented, _ = agent(m, "od-1")
    pushed = decode_claims(revoke_node(m, RevokeNode(node_id="od-1")))
    assert pushed["nats"]["revocations"] == {**static.revoked, rented: 1_005}
    assert pushed["iat"] > static.issued_at  # newer than what the server was started with, or it is ignored
    assert "static" not in json.loads(m.to_json())

    monkeypatch.setattr("time.time", lambda: 1_001.5)  # the clock stepped back: a restarted process is not refused
    assert claims_of(identities.creds("agent-n1").read_text())["iat"] == 1_005


def test_one_minter_at_a_time_on_a_minter_file(tmp_path):
    """Two would each write what they minted over the other's record: a user missing from it is never revoked."""
    from services.minter.app import hold_alone

    first = hold_alone(tmp_path / "minter" / "minter.json")
    with pytest.raises(SystemExit, match="another minter runs"):
        hold_alone(tmp_path / "minter" / "minter.json")
    os.close(first)
    os.close(hold_alone(tmp_path / "minter" / "minter.json"))  # given back with its process


def test_a_minter_without_its_cluster_file_does_not_start(tmp_path):
    """It would not know the static nodes, so it would mint an identity for one (reading its commands)."""
    from shared.cluster import ClusterFileError
    from services.minter.app import MinterProcess, MinterSettings

    with pytest.raises(ClusterFileError, match="missing.toml"):
        MinterProcess(MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=tmp_path / "missing.toml"))


async def test_a_request_the_minter_fails_on_is_answered_at_once_with_the_failure(tmp_path):
    """An unreadable minter file (a newer version's, a full disk) used to leave the request unanswered: placement
    waited its whole timeout and learned nothing."""
    from shared.minting import MINT_AGENT, MinterAnswer
    from services.minter.app import MinterProcess, MinterSettings

    cluster = tmp_path / "cluster.toml"
    cluster.write_text("")
    (tmp_path / "minter.json").write_text("{not json")
    process = MinterProcess(MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=cluster))
    answers: list[bytes] = []

    class Request:
        subject, reply, data = MINT_AGENT, f"{busroles.inbox('placement')}.x1", b'{"node_id": "od-1"}'

        async def respond(self, data: bytes) -> None:
            answers.append(data)

    await process.on_request(Request())
    assert "the minter failed" in (MinterAnswer.model_validate_json(answers[0]).error or "")


def test_an_agents_own_key_is_signed_for_its_node_by_the_signer_of_the_identity_it_replaces():
    from shared.minting import RekeyAgent
    from services.minter.rules import Compromised, confirm_rekey, drop_replaced, rekey_agent, replaced_due

    m, within = minter(), limits()
    start, _ = agent(m, "od-1")
    other, _ = agent(m, "od-2")
    own = public_key(new_seed("user"))

    def rekey(node: str, key: str, *, asked_for: str = "od-1", now: float = 2_000.0):
        return rekey_agent(m, RekeyAgent(node_id=node, user=key), asked_for=asked_for, limits=within, now=now)

    with pytest.raises(Refused, match="asked on od-2's subject"):
        rekey("od-1", own, asked_for="od-2")
    for known in (start, other):  # its own start key, another node's
        with pytest.raises(Refused, match="signed or revoked before"):
            rekey("od-1", known)
    with pytest.raises(Refused, match="no live agent identity"):
        rekey("od-3", own, asked_for="od-3")
    with pytest.raises(Refused, match="node of the cluster file"):
        rekey("n1", own, asked_for="n1")
    with pytest.raises(Refused, match="traded no start identity"):
        confirm_rekey(m, "od-1", asked_for="od-1", static=STATIC, now=2_000.0)
    token = rekey("od-1", own)
    claims = decode_claims(token)
    assert claims["sub"] == own and claims["nats"]["pub"]["allow"] == list(busroles.agent("od-1", own_key=True).publish)
    assert "tm.rpc.submitter.secrets.od-1" in claims["nats"]["pub"]["allow"]  # the key it made: its tasks' secrets
    assert "tm.rpc.minter.rekey.od-1" not in claims["nats"]["pub"]["allow"]  # the own key trades nothing further
    assert m.minted["od-1"] == [start, own] and m.signed_by[own] == m.signed_by[start]
    again = rekey("od-1", own)  # its answer lost: the same key signed again, nothing else changes
    assert decode_claims(again)["sub"] == own and m.minted["od-1"] == [start, own]
    with pytest.raises(Compromised, match="traded for another key"):
        rekey("od-1", public_key(new_seed("user")))
    m.minted_at["od-1"] = 1_000

    def due(now: float, *, since: float = 0.0) -> dict:
        return replaced_due(m, now=now, hold_s=1_800, unconfirmed_s=3_600, since=since)

    assert due(2_500.0) == {}  # within the node's hold (a second trade is still seen), and not confirmed
    # unconfirmed for an hour after the trade, or after the minter's own start where that is later
    assert due(5_601.0) == {"od-1": [start]} and due(5_601.0, since=3_000.0) == {}
    confirm_rekey(m, "od-1", asked_for="od-1", static=STATIC, now=2_100.0)
    assert due(2_700.0) == {} and due(2_801.0) == {"od-1": [start]}  # confirmed: once the hold is over
    assert drop_replaced(m, "od-1", [start]) is not None and m.minted["od-1"] == [own] and start in m.revocations
    assert drop_replaced(m, "od-1", [start]) is None and due(9_999.0) == {}
    revoke_node(m, RevokeNode(node_id="od-1"))
    assert own in m.revocations and "od-1" not in m.rekeyed and "od-1" not in m.confirmed
