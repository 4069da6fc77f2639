"""The minter's record of retired node ids is bounded (it held every id ever revoked, rewritten with the minter file
at every request) and forgets none: older ids are folded into a fixed Bloom filter."""

import json

import pytest

from shared.buscreds import Minter, write_secret
from shared.minting import RevokeNode
from services.minter import retired
from services.minter.rules import Refused, revoke_node
from tests.unit.test_bus_roles import minter
from tests.unit.test_minter_clouds import rent

NONE = frozenset()


def test_past_the_exact_bound_the_oldest_ids_are_folded_and_none_is_minted_for_again(monkeypatch):
    monkeypatch.setattr(retired, "EXACT", 4)
    m = minter()
    released = [f"od-{i}" for i in range(11)]
    for node_id in released:
        rent(m, node_id, None, providers=NONE)
        revoke_node(m, RevokeNode(node_id=node_id))
        assert len(m.retired) <= 4
    assert m.retired_filter and set(m.retired) == set(released[-2:])  # folded to the newest 2 at the 5th, 8th, 11th
    for node_id in released:
        assert retired.is_retired(m, node_id)
        with pytest.raises(Refused, match="was revoked"):
            rent(m, node_id, None, providers=NONE)
    fresh = [f"od-fresh-{i}" for i in range(500)]
    assert not [n for n in fresh if retired.is_retired(m, n)]


def test_the_filter_is_a_fixed_size_whatever_is_folded(monkeypatch):
    monkeypatch.setattr(retired, "EXACT", 10)
    m = minter()
    for i in range(40):
        retired.retire(m, f"od-{i}", at=i)
    size = len(m.retired_filter)
    for i in range(40, 200):
        retired.retire(m, f"od-{i}", at=i)
    assert len(m.retired_filter) == size and len(m.retired) <= 10
    assert all(retired.is_retired(m, f"od-{i}") for i in range(200))


def test_a_minter_file_written_before_the_filter_loads_and_its_retired_ids_stay_refused(tmp_path):
    m = minter()
    rent(m, "od-1", None, providers=NONE)
    revoke_node(m, RevokeNode(node_id="od-1"))
    older = json.loads(m.to_json())
    del older["retired_filter"]
    write_secret(tmp_path / "minter.json", json.dumps(older))
    loaded = Minter.load(tmp_path / "minter.json")
    assert loaded.retired_filter == "" and retired.is_retired(loaded, "od-1")
    with pytest.raises(Refused, match="was revoked"):
        rent(loaded, "od-1", None, providers=NONE)
