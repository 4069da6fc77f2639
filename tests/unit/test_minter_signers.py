"""Revocations pruned: rented agents are signed by rental signing keys, each signing `per_signer` agents; once none
of an older key's agents is live the key leaves the account, and its agents' revocations with it (the server
trusts no user it signed any more)."""

import random

import pytest

from shared.buscreds import Minter, decode_claims, public_key, write_secret
from shared.minting import MINT_AGENT, MintAgent, RevokeNode
from services.minter.app import MinterProcess, MinterSettings
from services.minter.bucket import TokenBucket
from services.minter.rules import Limits, mint_agent, mint_consumer_maker, revoke_node
from tests.unit.test_bus_roles import minter


def limits(per_signer: int) -> Limits:
    return Limits(
        static=frozenset({"n1"}), max_rented_nodes=64, bucket=TokenBucket(10**9, 10**9), per_signer=per_signer
    )


def rent(m, node_id: str, *, per_signer: int = 2) -> dict:
    _, creds = mint_agent(m, MintAgent(node_id=node_id), limits=limits(per_signer), now=1.0, monotonic=1.0)
    return decode_claims(creds.split("USER JWT-----\n")[1].split("\n")[0])


def account(m) -> dict:
    return decode_claims(m.account_jwt())["nats"]


def test_rented_agents_are_signed_by_rental_signers_the_account_trusts_a_new_one_after_per_signer():
    m = minter()
    issuers = [rent(m, f"od-{i}")["iss"] for i in range(5)]
    assert issuers[0] == issuers[1] != issuers[2] == issuers[3] != issuers[4]
    assert public_key(m.account_signer_seed) not in issuers  # the stack's own signing key signs no rented agent
    assert account(m)["signing_keys"] == [public_key(m.account_signer_seed), *dict.fromkeys(issuers)]
    _, maker = mint_consumer_maker(m, "od-0", now=1.0)
    assert decode_claims(maker.split("USER JWT-----\n")[1].split("\n")[0])["iss"] == public_key(m.account_signer_seed)


def test_an_older_signer_whose_agents_are_all_revoked_leaves_the_account_with_their_revocations():
    m = minter()
    first = [rent(m, f"od-{i}")["sub"] for i in range(3)]  # od-0, od-1 by the first signer, od-2 by the second
    revoke_node(m, RevokeNode(node_id="od-0"))
    assert first[0] in account(m)["revocations"] and len(account(m)["signing_keys"]) == 3  # od-1 still live
    revoke_node(m, RevokeNode(node_id="od-1"))
    carried = account(m)
    assert not {first[0], first[1]} & set(carried.get("revocations", {}))
    assert carried["signing_keys"] == [public_key(m.account_signer_seed), public_key(m.rental_signers[-1])]
    revoke_node(m, RevokeNode(node_id="od-2"))  # the newest signer stays (it signs the next), with its revocation
    assert first[2] in account(m)["revocations"] and len(m.rental_signers) == 1


def test_the_revocations_the_account_carries_stay_bounded_however_many_nodes_were_rented():
    """They grew by one per node ever released, for ever: past TRAINMASTER_MAX_REVOCATIONS nothing was minted."""
    m, rng, live, per_signer, most = minter(), random.Random(7), [], 5, 0
    for i in range(200):
        rent(m, f"od-{i}", per_signer=per_signer)
        live.append(f"od-{i}")
        if len(live) > 8 or rng.random() < 0.3:
            revoke_node(m, RevokeNode(node_id=live.pop(rng.randrange(len(live)))))
        most = max(most, len(m.revocations))
    assert most <= per_signer * (8 + 2) < 190 < len(m.retired)  # each release kept one, for ever


async def test_a_new_signer_whose_push_failed_signs_no_later_agent(tmp_path):
    """The server may not trust a key whose account update failed: an agent it signed later could never connect."""
    (tmp_path / "cluster.toml").write_text("")
    write_secret(tmp_path / "minter.json", minter().to_json())
    settings = MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=tmp_path / "cluster.toml")
    process, pushed = MinterProcess(settings), []

    async def unreachable(m, account) -> None:
        raise TimeoutError("the server did not answer")

    async def push(m, account) -> None:
        pushed.append(decode_claims(account)["nats"]["signing_keys"])

    process.push = unreachable  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        await process.handle(MINT_AGENT, b'{"node_id": "od-1"}')
    kept = Minter.load(tmp_path / "minter.json")
    assert kept.rental_signers == [] and "od-1" in kept.minted  # revoked at its release, as a lost answer is
    process.push = push  # type: ignore[method-assign]
    answer = await process.handle(MINT_AGENT, b'{"node_id": "od-2"}')
    assert pushed and decode_claims(answer.creds.split("USER JWT-----\n")[1].split("\n")[0])["iss"] in pushed[-1]
