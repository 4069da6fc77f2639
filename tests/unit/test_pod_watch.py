"""What a watch event on a Pod says about its node: only this cluster's node Pods, by their label and their name."""

from shared.cloudtags import pod_name
from services.placement.providers.podwatch import failed_node


def pod(
    *,
    node: str = "od-l4-1",
    cluster: str = "c1",
    name: str | None = None,
    phase: str = "Running",
    reason: str | None = None,
    deleting: bool = False,
) -> dict:
    meta = {
        "name": name or pod_name(node),
        "labels": {"trainmaster.io/cluster": cluster, "trainmaster.io/node-id": node},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T15:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, **({"reason": reason} if reason else {})}}


def verdict(kind: str, body: dict):
    return failed_node(kind, body, cluster="c1", name_of=pod_name)


def test_a_failed_ended_deleted_or_terminating_pod_is_its_node_gone():
    assert verdict("MODIFIED", pod(phase="Failed", reason="OOMKilled")) == ("od-l4-1", "pod failed (OOMKilled)")
    assert verdict("ADDED", pod(phase="Succeeded")) == ("od-l4-1", "pod succeeded")
    assert verdict("DELETED", pod()) == ("od-l4-1", "pod deleted")
    assert verdict("MODIFIED", pod(deleting=True, reason="Evicted")) == ("od-l4-1", "pod terminating (Evicted)")


def test_a_running_or_pending_pod_says_nothing():
    assert verdict("ADDED", pod(phase="Pending")) is None
    assert verdict("MODIFIED", pod(phase="Running")) is None


def test_a_pod_speaks_only_for_the_node_whose_pod_it_is():
    assert verdict("DELETED", pod(cluster="other")) is None  # another cluster sharing the namespace
    assert verdict("DELETED", pod(name="someones-pod")) is None  # labelled with our node's id, not its Pod
    assert verdict("DELETED", pod(node="od l4 *", name="tm-od l4 *")) is None  # no node id
    assert verdict("DELETED", {"metadata": {"labels": None}}) is None and verdict("DELETED", {}) is None


def test_a_reason_that_is_not_the_apis_word_is_not_repeated():
    assert verdict("MODIFIED", pod(phase="Failed", reason="x\n[forged] log line")) == ("od-l4-1", "pod failed")
