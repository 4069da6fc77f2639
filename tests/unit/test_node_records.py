"""A node's registration against its record: the cluster file's entry (or a rented node's) caps what it claims."""

import tomllib

from shared.noderecords import admitted, capped, limits_from_entry
from shared.nodes import Gpu
from services.agent.resources import node_from_config
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
    nvml = nvml.model_copy(update={"labels": {"pool": "default"}})
    entry = {"id": "box", "kind": "local", "max_gpus": 2}
    assert capped(nvml, limits_from_entry(entry)) == (nvml, {})
    none_allowed, refused = capped(nvml, limits_from_entry({"id": "box", "kind": "local"}))
    assert none_allowed.gpus == () and refused["gpus"] == "claimed 2, record 0"


def test_a_node_without_a_record_is_refused():
    assert admitted(node(node_id="stranger"), None) == (None, {"node": "no record of this node"})
