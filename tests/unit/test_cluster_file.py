"""The cluster file, parsed in one place: every process reads the same nodes, engines and sections from it."""

from pathlib import Path

import pytest

from shared.cluster import ClusterFile, ClusterFileError, parse_cluster, read_cluster
from shared.noderecords import capped, limits_from_entry, limits_from_file, limits_of
from services.agent.resources import agent_node_ids, load_cluster, node_from_config

REPO_FILE = Path(__file__).parents[2] / "cluster.toml"


def test_the_shipped_file_gives_every_reader_the_same_nodes():
    cluster = read_cluster(REPO_FILE)
    assert (
        set(limits_of(cluster))
        == set(load_cluster(REPO_FILE))
        == set(agent_node_ids(REPO_FILE))
        == {e.id for e in cluster.nodes}
        and cluster.nodes
    )
    assert "pytorch" in cluster.engines_by_name() and cluster.storage["allowed_urls"]


def test_an_honest_agent_describes_its_node_as_its_record_allows_labels_that_are_not_text_included():
    entry = parse_cluster(
        '[[nodes]]\nid = "ws"\ncpu_count = 8\nmemory_gb = 32\nlabels = { rack = 3 }\n'
        'gpus = [{ model = "L4", memory_gb = 24, count = 2 }]\n'
    ).nodes[0]
    described = node_from_config(entry, virtual=True)
    assert described.labels == {"rack": "3", "pool": "default"}
    assert capped(described, limits_from_entry(entry)) == (described, {})


def test_what_this_version_does_not_know_is_kept_and_a_wrong_shape_is_refused_naming_the_file(tmp_path):
    cluster = parse_cluster('future = 1\n[[nodes]]\nid = "n"\nrack = "b2"\n')
    assert cluster.model_extra == {"future": 1} and cluster.nodes[0].model_extra == {"rack": "b2"}
    broken = tmp_path / "cluster.toml"
    broken.write_text('[[nodes]]\nid = "n"\ngpus = [{ model = "L4" }]\n')  # no memory_gb
    with pytest.raises(ClusterFileError, match="cluster.toml"):
        read_cluster(broken)
    assert limits_from_file(broken) == {}  # a service then holds no node records: every registration is refused


def test_a_missing_file_is_an_error_unless_the_reader_may_do_without_it(tmp_path):
    with pytest.raises(ClusterFileError):
        read_cluster(tmp_path / "none.toml")
    assert read_cluster(tmp_path / "none.toml", missing_ok=True) == ClusterFile()


def test_the_agent_needs_an_id_on_every_entry(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('[[nodes]]\nid = "a"\n[[nodes]]\nkind = "local"\n')
    with pytest.raises(ClusterFileError, match="needs an id"):
        load_cluster(path)
    assert list(limits_from_file(path)) == ["a"]  # the records of those that have one stand
