"""A node's registration against its record: the cluster file's entry (or a rented node's) caps what it claims."""

import tomllib

import pytest

from shared.noderecords import admitted, capped, limits_from_entry
from shared.nodes import MEASURED_SLACK, Gpu, NodeInfo, datasheet_tflops
from services.agent.resources import node_from_config
from services.placement.adapter import reference_tflops
from tests.factories import node

ENTRY = tomllib.loads("""
[[nodes]]
id = "ws-1"
kind = "reserved"
cpu_count = 16
memory_gb = 64
price_per_hour = 1.6
gpus = [{ model = "A100-40GB", memory_gb = 40, tflops = 312, count = 1 }]
labels = { region = "eu-west" }
""")["nodes"][0]


def test_an_honest_registration_is_its_record_unchanged():
    honest = node_from_config(ENTRY, virtual=True)
    node_info, refused = capped(honest, limits_from_entry(ENTRY))
    assert node_info == honest and refused == {}


def test_row_5_eight_big_gpus_local_and_free_are_capped_to_the_record():
    honest = node_from_config(ENTRY, virtual=True)
    forged = honest.model_copy(
        update={
            "kind": "local",
            "price_per_hour": 0.0,
            "cpu_count": 256,
            "labels": {},
            "gpus": tuple(Gpu(index=i, model="A100-80GB", memory_gb=80, tflops=624) for i in range(8)),
        }
    )
    node_info, refused = capped(forged, limits_from_entry(ENTRY))
    assert (node_info.kind, node_info.price_per_hour, node_info.cpu_count, len(node_info.gpus)) == (
        "reserved",
        1.6,
        16,
        1,
    )
    assert node_info.gpus[0] == Gpu(index=0, model="A100-40GB", memory_gb=40, tflops=312)
    assert node_info.labels == honest.labels
    assert set(refused) == {
        "kind",
        "price_per_hour",
        "cpu_count",
        "labels",
        "gpus",
        "gpus[0].model",
        "gpus[0].memory_gb",
        "gpus[0].tflops",
    }
    assert refused["gpus"] == "claimed 8, record 1"


def test_fewer_or_smaller_is_taken_as_said():
    claimed = node_from_config(ENTRY, virtual=True).model_copy(update={"gpus": (), "memory_gb": 8})
    node_info, refused = capped(claimed, limits_from_entry(ENTRY))
    assert (node_info.gpus, node_info.memory_gb, refused) == ((), 8, {})


def test_an_entry_without_gpu_figures_allows_max_gpus_read_through_nvml_and_else_none():
    nvml = node(node_id="box", gpus=2, gpu_memory_gb=80, tflops=989, price=0.0, cpu=4)
    h100 = tuple(g.model_copy(update={"model": "NVIDIA H100 80GB HBM3"}) for g in nvml.gpus)
    nvml = nvml.model_copy(update={"labels": {"pool": "default"}, "gpus": h100})
    entry = {"id": "box", "kind": "local", "max_gpus": 2}
    assert capped(nvml, limits_from_entry(entry)) == (nvml, {})
    none_allowed, refused = capped(nvml, limits_from_entry({"id": "box", "kind": "local"}))
    assert none_allowed.gpus == () and refused["gpus"] == "claimed 2, record 0"


def test_a_node_without_a_record_is_refused():
    assert admitted(node(node_id="stranger"), None) == (None, {"node": "no record of this node"})


def test_a_node_read_through_nvml_claims_no_more_than_its_gpus_datasheet():
    """A record without GPU figures (`max_gpus`) let a node claim any speed; the fleet's median TFLOPS, which scales
    every job's planned duration, took it in."""
    entry = {"id": "box", "kind": "local", "max_gpus": 2}
    forged = node(node_id="box", gpus=2, gpu_memory_gb=80, price=0.0).model_copy(
        update={
            "labels": {"pool": "default"},
            "gpus": (
                Gpu(index=0, model="NVIDIA H100 80GB HBM3", memory_gb=80, tflops=90_000, measured_tflops=90_000),
                Gpu(index=1, model="Mystery-9000", memory_gb=80, tflops=5000),
            ),
        }
    )
    kept, refused = capped(forged, limits_from_entry(entry))
    assert [(g.tflops, g.measured_tflops) for g in kept.gpus] == [(989.0, round(989 * MEASURED_SLACK, 1)), (0.0, None)]
    assert set(refused) == {"gpus[0].tflops", "gpus[0].measured_tflops", "gpus[1].tflops"}
    honest = node(node_id="ws", gpus=4, tflops=312)
    fleet = [honest, kept, kept.model_copy(update={"node_id": "box-2"})]
    assert reference_tflops(fleet) <= 989 * MEASURED_SLACK  # 90,000 before


MIXED = tomllib.loads("""
[[nodes]]
id = "mixed"
gpus = [
  { model = "A100-80GB", memory_gb = 80, tflops = 312, count = 2 },
  { model = "T4", memory_gb = 16, tflops = 65, count = 2 },
]
""")["nodes"][0]


def test_a_mixed_record_caps_each_model_by_its_own_group():
    record = limits_from_entry(MIXED)
    honest = node_from_config(MIXED, virtual=True)
    reordered = honest.model_copy(
        update={"gpus": tuple(g.model_copy(update={"index": i}) for i, g in enumerate(reversed(honest.gpus)))}
    )
    assert capped(reordered, record) == (reordered, {})  # T4s first, as NVML may number them
    t4_as_fast = honest.model_copy(
        update={
            "gpus": honest.gpus[:2]
            + tuple(g.model_copy(update={"tflops": 312, "memory_gb": 80}) for g in honest.gpus[2:])
        }
    )
    kept, refused = capped(t4_as_fast, record)
    assert [(g.model, g.memory_gb, g.tflops) for g in kept.gpus] == [("A100-80GB", 80, 312)] * 2 + [("T4", 16, 65)] * 2
    assert set(refused) == {"gpus[2].memory_gb", "gpus[2].tflops", "gpus[3].memory_gb", "gpus[3].tflops"}
    all_a100 = honest.model_copy(
        update={"gpus": tuple(Gpu(index=i, model="A100-80GB", memory_gb=80, tflops=312) for i in range(4))}
    )
    kept, refused = capped(all_a100, record)
    assert [g.model for g in kept.gpus] == ["A100-80GB", "A100-80GB", "T4", "T4"] and kept.gpus[3].tflops == 65
    assert refused["gpus[2].model"] == "claimed A100-80GB, record T4"


def test_a_mixed_record_matches_nvml_names_to_the_groups_they_fit_in_any_order():
    """NVML names are not the record's ("NVIDIA A100-SXM4-80GB" for "A100-80GB"): matched in order to the first
    open group, an honest node's A100s were capped to the T4s' 16 GB when its T4s came first (found by review)."""
    nvml = (
        Gpu(index=0, model="Tesla T4", memory_gb=15.0, tflops=65),
        Gpu(index=1, model="Tesla T4", memory_gb=15.0, tflops=65),
        Gpu(index=2, model="NVIDIA A100-SXM4-80GB", memory_gb=79.6, tflops=312),
        Gpu(index=3, model="NVIDIA A100-SXM4-80GB", memory_gb=79.6, tflops=312),
    )
    honest = node_from_config(MIXED, virtual=True).model_copy(update={"gpus": nvml})
    kept, refused = capped(honest, limits_from_entry(MIXED))
    assert [(g.memory_gb, g.tflops) for g in kept.gpus] == [(15.0, 65), (15.0, 65), (79.6, 312), (79.6, 312)]
    assert [g.model for g in kept.gpus] == ["Tesla T4", "Tesla T4", "A100-80GB", "A100-80GB"]  # "T4" is "Tesla T4"
    assert set(refused) == {"gpus[2].model", "gpus[3].model"}


def test_groups_of_one_model_take_the_gpus_whose_claims_they_cover():
    entry = {
        "id": "twins",
        "gpus": [{"model": "A100", "memory_gb": 40, "tflops": 312}, {"model": "A100", "memory_gb": 80, "tflops": 312}],
    }
    big_first = node_from_config(entry, virtual=True).model_copy(
        update={
            "gpus": (
                Gpu(index=0, model="A100", memory_gb=80, tflops=312),
                Gpu(index=1, model="A100", memory_gb=40, tflops=312),
            )
        }
    )
    assert capped(big_first, limits_from_entry(entry)) == (big_first, {})


def test_an_unknown_gpus_measurement_is_not_refused_and_an_l40_is_no_l4():
    entry = {"id": "box", "kind": "local", "max_gpus": 1}
    for model, table, measured in (("NVIDIA A40", 0.0, 140.0), ("NVIDIA L40", 181.0, 170.0)):
        gpu = Gpu(index=0, model=model, memory_gb=44.5, tflops=datasheet_tflops(model), measured_tflops=measured)
        honest = node(node_id="box", gpus=0, price=0.0).model_copy(
            update={"labels": {"pool": "default"}, "gpus": (gpu,)}
        )
        assert gpu.tflops == table and capped(honest, limits_from_entry(entry)) == (honest, {})
    assert [datasheet_tflops(n) for n in ("NVIDIA RTX A1000", "NVIDIA T400", "NVIDIA H100 PCIE", "NVIDIA A10G")] == [
        0.0,
        0.0,
        756.0,
        70.0,
    ]


def test_a_static_node_is_reached_where_its_record_says_and_a_rented_one_where_it_reaches_the_bus_from():
    """A node's address is where every other rank of a distributed job connects (the master); each rented node
    said 127.0.0.1 (its entry names none), so a job over two rented machines looked for its master on itself."""
    from services.agent.resources import bus_side_address, describe_node

    entry = {"id": "box", "kind": "local", "address": "10.0.0.5"}
    claimed = node(node_id="box").model_copy(update={"address": "10.9.9.9", "labels": {"pool": "default"}})
    kept, refused = capped(claimed, limits_from_entry(entry))
    assert kept.address == "10.0.0.5" and refused["address"] == "claimed 10.9.9.9, record 10.0.0.5"
    unnamed = limits_from_entry({"id": "od-1", "kind": "on_demand"})
    assert unnamed.address is None
    rented = claimed.model_copy(update={"node_id": "od-1", "kind": "on_demand", "address": "192.0.2.7"})
    assert capped(rented, unnamed)[0].address == "192.0.2.7"
    assert bus_side_address("nats://127.0.0.1:4222") == "127.0.0.1" and bus_side_address(None) == "127.0.0.1"
    described = describe_node(
        {"id": "od-1", "kind": "on_demand"}, use_nvml=False, virtual=False, bus_url="nats://127.0.0.1:1"
    )
    assert described.address == "127.0.0.1"
    assert describe_node(entry, use_nvml=False, virtual=False, bus_url="nats://127.0.0.1:1").address == "10.0.0.5"
    with pytest.raises(ValueError):
        NodeInfo.model_validate({**node(node_id="x").model_dump(), "address": "a b\nc"})
