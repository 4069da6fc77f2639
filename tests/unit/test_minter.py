"""The minter's grants as pure decisions, and an older data dir's placement minter moved to it."""

import json
import re
from pathlib import Path

import pytest
import yaml

from shared import busroles
from shared.buscreds import Minter, decode_claims, new_seed, public_key, write_secret
from shared.minting import CONSUMER_MAKER_TTL_S, MintAgent, MintConsumerMaker, RevokeNode
from services.minter.rules import Refused, mint_agent, mint_consumer_maker, revoke_node
from services.stack.identities import Identities, write
from tests.unit.test_bus_roles import minter
from tests.unit.test_stack_restart import stack_of

STATIC = frozenset({"n1"})


def claims_of(creds: str) -> dict:
    return decode_claims(creds.split("USER JWT-----\n")[1].split("\n")[0])


def test_an_agent_is_minted_with_the_agent_role_of_its_node_alone_and_recorded_for_its_revocation():
    m = minter()
    user, creds = mint_agent(m, MintAgent(node_id="od-1"), static=STATIC)
    assert claims_of(creds)["nats"]["pub"]["allow"] == list(busroles.agent("od-1").publish)
    assert "exp" not in claims_of(creds) and m.minted == {"od-1": [user]}


def test_a_static_node_gets_no_identity_nor_consumer_maker_from_the_minter():
    with pytest.raises(Refused, match="cluster file"):
        mint_agent(minter(), MintAgent(node_id="n1"), static=STATIC)
    with pytest.raises(Refused, match="cluster file"):
        mint_consumer_maker(minter(), MintConsumerMaker(node_id="n1"), static=STATIC, now=0)


def test_a_consumer_maker_expires_and_is_not_kept():
    m = minter()
    _, creds = mint_consumer_maker(m, MintConsumerMaker(node_id="od-1"), static=STATIC, now=1_000)
    assert claims_of(creds)["exp"] == 1_000 + CONSUMER_MAKER_TTL_S and m.minted == {}


def test_a_revocation_revokes_what_was_minted_for_that_node_and_nothing_else():
    m = minter()
    first, _ = mint_agent(m, MintAgent(node_id="od-1"), static=STATIC)
    second, _ = mint_agent(m, MintAgent(node_id="od-1"), static=STATIC)
    other, _ = mint_agent(m, MintAgent(node_id="od-2"), static=STATIC)
    account = revoke_node(m, RevokeNode(node_id="od-1"))
    assert set(decode_claims(account)["nats"]["revocations"]) == {first, second}
    issued = m.issued_at
    again = revoke_node(m, RevokeNode(node_id="od-1"))  # a push that failed is made again, newer
    assert decode_claims(again)["nats"]["revocations"] == decode_claims(account)["nats"]["revocations"]
    assert m.issued_at > issued and m.minted == {"od-2": [other]}


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
    ).__dict__
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
    old = identities.new_minter().__dict__
    old.pop("minted")
    write_secret(identities.placement_minter_file, json.dumps(old))

    write(identities, node_ids=["n1"], resolver_dir=tmp_path / "accounts", admin_uid=None)
    assert (tmp_path / "bus" / "creds" / busroles.MINTER / "nats.creds").exists()
    assert not identities.placement_minter_file.exists()
    auth = (tmp_path / "bus" / "server" / "auth.conf").read_text()
    account = next(t for t in re.findall(r'"(ey[^"]+)"', auth) if decode_claims(t)["sub"] == old["account"])
    assert decode_claims(account)["nats"]["signing_keys"] == [public_key(identities.keys()["account_signer"])]
    assert public_key(held) not in auth
