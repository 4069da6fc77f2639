"""Node liveness as pure functions: heartbeats in, ready/lost verdicts out."""
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.events import NodeStateChanged, TaskRef
from shared.nodes import NodeInfo


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    info: NodeInfo | None = None
    boot_id: str = ""
    last_seen: datetime
    state: Literal["ready", "lost", "released"] = "ready"
    running: tuple[TaskRef, ...] = ()
    gpu_utilization: float | None = None


class Sighting(BaseModel):
    """What one registration or heartbeat tells about a node."""

    model_config = ConfigDict(frozen=True)

    node: NodeRecord
    restarted: bool = False
    event: NodeStateChanged | None = None


def sighted(
    node: NodeRecord | None,
    *,
    node_id: str,
    boot_id: str,
    at: datetime,
    info: NodeInfo | None = None,
    running: tuple[TaskRef, ...] | None = None,
    gpu_utilization: float | None = None,
) -> Sighting:
    """A node spoke: refresh it, note an agent restart (new boot id), bring a lost node back."""
    if node is not None and node.state == "released":
        return Sighting(node=node)  # a given-back node's last words
    if node is not None and at < node.last_seen and boot_id == node.boot_id:
        return Sighting(node=node if info is None or node.info else node.model_copy(update={"info": info}))
    update = {"boot_id": boot_id, "last_seen": at, "state": "ready"}
    if info is not None:
        update["info"] = info
    if running is not None:
        update["running"] = running
        update["gpu_utilization"] = gpu_utilization
    if node is None:
        return Sighting(node=NodeRecord(node_id=node_id, **update), event=_state(node_id, "ready", at))
    restarted = bool(node.boot_id) and node.boot_id != boot_id
    event = _state(node_id, "ready", at) if node.state == "lost" else None
    return Sighting(node=node.model_copy(update=update), restarted=restarted, event=event)


def silent(nodes: list[NodeRecord], *, now: datetime, timeout_s: float) -> list[NodeRecord]:
    """Ready nodes not heard from within the timeout."""
    limit = now - timedelta(seconds=timeout_s)
    return [n for n in nodes if n.state == "ready" and n.last_seen < limit]


def declare_lost(node: NodeRecord) -> tuple[NodeRecord, NodeStateChanged]:
    return node.model_copy(update={"state": "lost", "running": ()}), _state(node.node_id, "lost", node.last_seen)


def _state(node_id: str, state: Literal["ready", "lost"], at: datetime) -> NodeStateChanged:
    return NodeStateChanged(
        event_id=f"{node_id}:{state}:{at.timestamp():.3f}", node_id=node_id, state=state, last_seen=at
    )
