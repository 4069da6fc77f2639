"""A rented node is pinned to the machine that carried it at its first check (an EC2 instance id, a Pod's uid):
anyone who may create Pods in the namespace, or launch tagged instances, could otherwise keep a node id alive or
revive it with a machine of their own carrying its labels or tags once the real one is gone."""

import json

import pytest

from shared.buscreds import Minter, write_secret
from shared.cloudtags import TAG_CLUSTER, TAG_NODE
from shared.minting import MINT_CONSUMER_MAKER, RevokeNode
from services.minter.cloud import instances_by_node
from services.minter.pods import launched_pods
from services.minter.rules import Refused, carrier, pin_found, revoke_node, unlaunched
from tests.unit.test_bus_roles import minter
from tests.unit.test_minter_cloud_waits import EC2, FakeCloud, process_with
from tests.unit.test_minter_clouds import pod, rent

CONSUMER = MINT_CONSUMER_MAKER
OD1 = b'{"node_id": "od-1"}'


def test_the_pinned_machine_vouches_whatever_else_carries_the_id_and_before_a_pin_only_one():
    assert carrier("od-1", {"i-own", "i-theirs"}, pinned="i-own") == "i-own"
    assert carrier("od-1", {"i-theirs"}, pinned="i-own") is None
    assert carrier("od-1", set(), pinned="i-own") is None
    assert carrier("od-1", {"i-only"}, pinned=None) == "i-only"
    assert carrier("od-1", set(), pinned=None) is None
    with pytest.raises(Refused, match="od-1 is carried by 2 machines .*ambiguous"):
        carrier("od-1", {"i-a", "i-b"}, pinned=None)


def test_a_pinned_node_whose_machine_is_gone_is_due_whatever_else_carries_its_id():
    m = minter()
    for node_id in ("od-own", "od-replaced", "od-unpinned"):
        rent(m, node_id, "ec2", providers=EC2)
    m.machine_of.update({"od-own": "i-own", "od-replaced": "i-first"})
    launched = {"ec2": {"od-own": {"i-own", "i-x"}, "od-replaced": {"i-second"}, "od-unpinned": {"i-a", "i-b"}}}
    assert unlaunched(m, launched=launched, now=2_000, grace_s=100, providers=EC2) == {"ec2": ["od-replaced"]}
    revoke_node(m, RevokeNode(node_id="od-replaced"))
    assert m.machine_of == {"od-own": "i-own"}


def test_a_sweep_pins_the_nodes_it_asked_about_that_one_machine_carries():
    """A file written before pins: its nodes may never ask for a consumer maker again."""
    m = minter()
    for node_id in ("od-one", "od-two", "od-none", "od-young", "od-pinned"):
        rent(m, node_id, "ec2", providers=EC2)
    m.machine_of["od-pinned"] = "i-p"
    launched = {"ec2": {"od-one": {"i-1"}, "od-two": {"i-a", "i-b"}, "od-young": {"i-y"}, "od-pinned": {"i-q"}}}
    asked = {"od-one", "od-two", "od-none", "od-pinned"}
    assert pin_found(m, launched=launched, providers=EC2, among=asked) == ["od-one"]
    assert m.machine_of == {"od-pinned": "i-p", "od-one": "i-1"}


def test_pods_and_instances_are_answered_with_the_ids_of_the_machines_carrying_each_node():
    no_uid = pod("od-no-uid")
    del no_uid["metadata"]["uid"]
    assert launched_pods([pod("od-1"), no_uid, pod("od-2", uid=7)], cluster="c1") == {"od-1": {"uid-od-1"}}
    tags = [{"Key": TAG_CLUSTER, "Value": "c1"}, {"Key": TAG_NODE, "Value": "od-1"}]
    instances = [
        {"InstanceId": "i-1", "Tags": tags},
        {"InstanceId": "i-2", "Tags": tags},
        {"InstanceId": "i-3", "Tags": [{"Key": TAG_NODE, "Value": "od-2"}]},
        {"Tags": [{"Key": TAG_NODE, "Value": "od-3"}]},  # no id: no machine to pin
        {"InstanceId": "i-5", "Tags": None},
        {"InstanceId": "i-6", "Tags": [{"Key": TAG_NODE, "Value": 6}]},
    ]
    assert instances_by_node(instances) == {"od-1": {"i-1", "i-2"}, "od-2": {"i-3"}}


async def test_a_node_is_pinned_at_its_first_consumer_maker_and_another_machine_under_its_id_gets_none(tmp_path):
    """The real Pod deleted, a new one named tm-<node> with its labels: the old minter granted it and its sweep kept
    the node alive."""
    cloud = FakeCloud(running={"od-1"}, machines={"od-1": {"uid-real"}})
    process, pushes = process_with(tmp_path, cloud, "od-1", patience_s=0.6)
    assert (await process.handle(CONSUMER, OD1)).creds
    assert Minter.load(tmp_path / "minter.json").machine_of == {"od-1": "uid-real"}
    assert (await process.handle(CONSUMER, OD1)).creds  # its own machine again: granted
    cloud.machines["od-1"] = {"uid-revived"}
    with pytest.raises(Refused, match="no pending or running instance .*its own, uid-real, pinned .* is gone"):
        await process.handle(CONSUMER, OD1)
    assert await process.sweep() == ["od-1"] and pushes.sent


async def test_two_machines_under_one_id_before_a_pin_are_refused_and_after_it_the_pinned_one_counts(tmp_path):
    cloud = FakeCloud(running={"od-1", "od-2"}, machines={"od-1": {"i-a", "i-b"}, "od-2": {"i-c"}})
    process, _ = process_with(tmp_path, cloud, "od-1", "od-2")
    with pytest.raises(Refused, match="ambiguous"):
        await process.handle(CONSUMER, OD1)
    assert "od-1" not in Minter.load(tmp_path / "minter.json").machine_of
    assert (await process.handle(CONSUMER, b'{"node_id": "od-2"}')).creds
    cloud.machines["od-2"] = {"i-c", "i-d"}  # a second instance tagged with its id
    assert (await process.handle(CONSUMER, b'{"node_id": "od-2"}')).creds
    assert await process.sweep() == []


async def test_a_file_written_before_pins_loads_and_its_nodes_are_pinned_at_their_next_check(tmp_path):
    cloud = FakeCloud(running={"od-1", "od-2"})
    process, _ = process_with(tmp_path, cloud, "od-1", "od-2")
    older = json.loads((tmp_path / "minter.json").read_text())
    del older["machine_of"]
    write_secret(tmp_path / "minter.json", json.dumps(older))
    assert (await process.handle(CONSUMER, OD1)).creds
    assert Minter.load(tmp_path / "minter.json").machine_of == {"od-1": "i-od-1"}
    assert await process.sweep() == []  # od-2 never asks again: the sweep pins it
    assert Minter.load(tmp_path / "minter.json").machine_of == {"od-1": "i-od-1", "od-2": "i-od-2"}
    cloud.machines["od-2"] = {"i-revived"}
    assert await process.sweep() == ["od-2"]
