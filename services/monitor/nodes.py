"""Node liveness as pure functions: heartbeats in, ready/lost verdicts out."""

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from shared.events import GpuReading, NodeStateChanged, TaskRef
from shared.nodes import NodeInfo

MEMORY_SLACK_GB = 0.1  # a GPU's recorded memory is NVML's total rounded to 0.1 GB


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    info: NodeInfo | None = None
    boot_id: str = ""
    silences: int = 0  # as the node last reported them: what its starts carry (StartTask.silences)
    last_seen: datetime
    state: Literal["ready", "lost", "released"] = "ready"
    running: tuple[TaskRef, ...] = ()
    gpu_utilization: float | None = None
    gpus: tuple[GpuReading, ...] = Field((), description="Each recorded GPU as the last heartbeat read it.")
    claims_refused: dict[str, str] = Field(
        default_factory=dict,
        description="What the node's last registration "
        "claimed beyond its record (shared/noderecords.py), for the admin.",
    )


class Seen(TypedDict):
    """What a registration or heartbeat says of its node: the keyword arguments of `sighted` past the node id."""

    boot_id: str
    at: datetime
    silences: NotRequired[int]
    info: NotRequired[NodeInfo | None]
    running: NotRequired[tuple[TaskRef, ...] | None]
    gpu_utilization: NotRequired[float | None]
    gpus: NotRequired[tuple[GpuReading, ...]]
    claims_refused: NotRequired[dict[str, str] | None]


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
    silences: int = 0,
    info: NodeInfo | None = None,
    running: tuple[TaskRef, ...] | None = None,
    gpu_utilization: float | None = None,
    gpus: tuple[GpuReading, ...] = (),
    claims_refused: dict[str, str] | None = None,
) -> Sighting:
    """A node spoke: refresh it, note an agent restart (new boot id), bring a lost node back."""
    if node is not None and node.state == "released":
        return Sighting(node=node)  # a given-back node's last words
    same_boot = node is not None and boot_id == node.boot_id
    if node is not None and same_boot and at < node.last_seen:
        return Sighting(node=told(node, silences=silences, info=info, claims_refused=claims_refused))
    update: dict[str, Any] = {"boot_id": boot_id, "last_seen": at, "state": "ready"}
    update["silences"] = max(node.silences, silences) if node is not None and same_boot else silences
    if info is not None:
        update["info"] = info
    if claims_refused is not None:
        update["claims_refused"] = claims_refused
    if running is not None:
        update["running"] = running
        update["gpu_utilization"] = gpu_utilization
        update["gpus"] = believed(gpus, (info or (node.info if node else None)))
    if node is None:
        return Sighting(node=NodeRecord(node_id=node_id, **update), event=_state(node_id, "ready", at))
    restarted = bool(node.boot_id) and node.boot_id != boot_id
    event = _state(node_id, "ready", at) if node.state == "lost" else None
    return Sighting(node=node.model_copy(update=update), restarted=restarted, event=event)


def told(
    node: NodeRecord, *, silences: int, info: NodeInfo | None, claims_refused: dict[str, str] | None
) -> NodeRecord:
    """What a sighting of the node's current boot says whatever its time (a registration stored before a heartbeat
    the monitor received, on two clocks, is no older news): the boot's record, its refused claims, and its count of
    silences, which only grows within a boot. Liveness (last_seen, state) and what runs stay the newer sighting's."""
    update: dict[str, Any] = {"silences": max(node.silences, silences)}
    if info is not None:
        update |= {"info": info, "gpus": believed(node.gpus, info)}
    if claims_refused is not None:
        update["claims_refused"] = claims_refused
    return node.model_copy(update=update)


def believed(gpus: tuple[GpuReading, ...], info: NodeInfo | None) -> tuple[GpuReading, ...]:
    """The readings of GPUs the node's record has, each within that GPU's recorded memory; the rest dropped."""
    memory = {g.index: g.memory_gb for g in info.gpus} if info else {}
    return tuple(g for g in gpus if g.index in memory and g.memory_used_gb <= memory[g.index] + MEMORY_SLACK_GB)


def record_of(doc: Mapping[str, Any]) -> NodeRecord:
    """A stored node, with the coarse `last_seen_s` (Unix seconds, written in bulk) when it is the newer."""
    node = NodeRecord.model_validate(doc)
    seen_s = doc.get("last_seen_s")
    if isinstance(seen_s, int | float) and seen_s > node.last_seen.timestamp():
        return node.model_copy(update={"last_seen": datetime.fromtimestamp(seen_s, UTC)})
    return node


def changed(stored: NodeRecord | None, node: NodeRecord) -> bool:
    """Whether a sighting changed more than the liveness clock (last_seen, GPU readings): those go to the
    database at once, with their events; a plain heartbeat does not."""
    if stored is None:
        return True
    return (
        node.model_copy(
            update={"last_seen": stored.last_seen, "gpu_utilization": stored.gpu_utilization, "gpus": stored.gpus}
        )
        != stored
    )


def stale(stored_last_seen: datetime | None, last_seen: datetime, *, every_s: float) -> bool:
    """Whether the stored last_seen lags the one in memory by `every_s` or more (written in the next bulk)."""
    return stored_last_seen is None or (last_seen - stored_last_seen).total_seconds() >= every_s


def overdue(heard: Mapping[str, float], ready: Iterable[str], *, caught_up_at: float, timeout_s: float) -> list[str]:
    """Ready nodes last heard more than the timeout before the moment the monitor had read every heartbeat that
    had reached it (monotonic seconds): a monitor behind its heartbeats never takes the backlog for silence."""
    limit = caught_up_at - timeout_s
    return [node_id for node_id in ready if heard.get(node_id, limit) < limit]


def silent(nodes: list[NodeRecord], *, now: datetime, timeout_s: float) -> list[NodeRecord]:
    """Ready nodes not heard from within the timeout."""
    limit = now - timedelta(seconds=timeout_s)
    return [n for n in nodes if n.state == "ready" and n.last_seen < limit]


def declare_lost(node: NodeRecord) -> tuple[NodeRecord, NodeStateChanged]:
    return (
        node.model_copy(update={"state": "lost", "running": (), "gpus": ()}),  # no figure of a silent node
        _state(node.node_id, "lost", node.last_seen),
    )


def _state(node_id: str, state: Literal["ready", "lost"], at: datetime) -> NodeStateChanged:
    return NodeStateChanged(
        event_id=f"{node_id}:{state}:{at.timestamp():.3f}", node_id=node_id, state=state, last_seen=at
    )
