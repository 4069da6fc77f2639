"""The rentable catalogue's data file: its columns, its errors naming line and column, spot entries."""

from pathlib import Path

import pytest

from shared.cluster import ClusterFile
from services.placement.adapter import catalogue_from
from services.placement.catalogue import DATA_DIR, catalogue_entries, offered, read_gpus, read_offers

GPUS = "accelerator,tflops,memory_gib,note\nA10G,125,24,x\nH100,989,80,y\n"
HEADER = "instance_type,accelerator,accelerator_count,vcpus,memory_gib,price,spot_price,region,zone,startup_s\n"


def test_the_shipped_file_reads_and_every_gpu_has_its_tflops():
    offers = read_offers((DATA_DIR / "catalogue.csv").read_text(), read_gpus((DATA_DIR / "gpus.csv").read_text()))
    assert len(offers) >= 10
    assert all(o.tflops > 0 and o.gpu_memory_gb > 0 and o.price > 0 for o in offers)
    p5 = next(o for o in offers if o.instance_type == "p5.48xlarge")
    assert (p5.accelerator, p5.count, p5.tflops) == ("H100", 8, 989)


def test_one_entry_per_type_at_its_cheapest_zone_and_a_spot_twin():
    text = HEADER + (
        "g5.xlarge,A10G,1,4,16,1.0,0.45,us-east-1,us-east-1a,90\n"
        "g5.xlarge,A10G,1,4,16,1.0,0.40,us-east-1,us-east-1b,90\n"
        "g5.xlarge,A10G,1,4,16,1.3,0.50,eu-west-1,eu-west-1a,90\n"
        "c5.xlarge,,0,4,8,0.17,,us-east-1,us-east-1a,60\n"
    )
    entries = offered(read_offers(text, read_gpus(GPUS)), provider="ec2", region="us-east-1", spot=True)
    assert [e["name"] for e in entries] == ["g5.xlarge", "g5.xlarge.spot"]  # no GPU: not rented by placement
    on_demand, spot = entries
    assert on_demand["price_per_hour"] == 1.0 and on_demand["market"] == "on_demand"
    assert spot["price_per_hour"] == 0.40 and spot["market"] == "spot" and spot["cloud_type"] == "g5.xlarge"
    assert spot["zones"] == ["us-east-1b", "us-east-1a"]
    [instance, _] = catalogue_from(entries)
    assert (instance.gpu_model, instance.tflops, instance.gpu_memory_gb) == ("A10G", 125, 24)


@pytest.mark.parametrize(
    "row, message",
    [
        ("g5.xlarge,A10G,1,4,16,abc,0.4,us-east-1,a,90", "line 2: price must be a number"),
        ("g5.xlarge,B200,1,4,16,1,0.4,us-east-1,a,90", "line 2: accelerator 'B200' is not in the GPU table"),
        ('g5"x,A10G,1,4,16,1,0.4,us-east-1,a,90', "line 2: instance_type"),
        ("g5.xlarge,A10G,1,4,16,-1,0.4,us-east-1,a,90", "line 2: price must be a finite number >= 0"),
        ("g5.xlarge,A10G,1,4,16,inf,0.4,us-east-1,a,90", "line 2: price must be a finite number >= 0"),
    ],
)
def test_a_bad_row_names_its_line_and_column(row, message):
    with pytest.raises(ValueError, match=message):
        read_offers(HEADER + row + "\n", read_gpus(GPUS))


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="missing columns .*spot_price"):
        read_offers("instance_type,accelerator,accelerator_count,vcpus,memory_gib,price\n", read_gpus(GPUS))


def test_a_cluster_file_selects_rows_and_its_entries_name_their_provider(tmp_path: Path):
    (tmp_path / "mine.csv").write_text(HEADER + "p5.48xlarge,H100,8,192,2048,98.3,39.3,us-east-1,us-east-1a,300\n")
    (tmp_path / "gpus.csv").write_text(GPUS)
    cluster = ClusterFile(
        instance_types=({"name": "a10g.1x", "gpus": 1},),
        catalogue={"file": "mine.csv", "gpus_file": "gpus.csv", "provider": "ec2", "spot": True},
    )
    entries = catalogue_entries(cluster, base=tmp_path)
    assert [(e["name"], e["provider"], e["market"]) for e in entries] == [
        ("a10g.1x", "local-process", "on_demand"),
        ("p5.48xlarge", "ec2", "on_demand"),
        ("p5.48xlarge.spot", "ec2", "spot"),
    ]


def test_an_entry_name_that_cannot_be_a_node_id_part_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="instance_types: name"):
        catalogue_entries(ClusterFile(instance_types=({"name": 'x" ]\n[evil'},)), base=tmp_path)
