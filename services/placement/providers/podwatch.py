"""What a watch event on a Pod says about its node: gone (failed, ended, being deleted) or nothing. Pure."""

import re
from collections.abc import Callable

from shared.buscreds import NAME
from shared.cloudtags import LABEL_CLUSTER, LABEL_NODE

ENDED = ("Failed", "Succeeded")  # restartPolicy Never: an agent that exited, for any reason, is not coming back
REASON = re.compile(r"^[A-Za-z]{1,64}$")  # the API's CamelCase reasons; anything else is not repeated


def failed_node(kind: str, pod: dict, *, cluster: str, name_of: Callable[[str], str]) -> tuple[str, str] | None:
    """(node id, why) when the event shows this cluster's node Pod gone or going; None for anything else.

    A Pod speaks for a node only if it carries this cluster's label and the name placement gives that node's Pod:
    a Pod labelled with another node's id (anyone may label their own Pods) says nothing about that node."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    node_id = labels.get(LABEL_NODE)
    if labels.get(LABEL_CLUSTER) != cluster or not isinstance(node_id, str) or not NAME.match(node_id):
        return None
    if meta.get("name") != name_of(node_id):
        return None
    status = pod.get("status") or {}
    reason = status.get("reason") if isinstance(status.get("reason"), str) and REASON.match(status["reason"]) else ""
    if kind == "DELETED":
        return node_id, "pod deleted"
    if status.get("phase") in ENDED:
        return node_id, f"pod {status['phase'].lower()}" + (f" ({reason})" if reason else "")
    if meta.get("deletionTimestamp"):
        return node_id, "pod terminating" + (f" ({reason})" if reason else "")
    return None
