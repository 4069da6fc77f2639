"""What a node may be: its record (the cluster file's entry of a static node, or the entry placement wrote when it
rented one) against what its agent claims when it registers. The record wins: a registration that claims more
GPUs, more GPU memory or TFLOPS (table or measured: a measured figure at most MEASURED_SLACK times the record's),
more CPUs or memory, another kind, price or labels is capped to the record, and
what was refused is kept so the operator sees it. A record that lists GPUs of several models caps each model's
count and figures by its own group; one that lists none (`max_gpus`, read through NVML) caps each GPU's TFLOPS at
its model's datasheet figure (`shared.nodes.DATASHEET_TFLOPS`, what an honest agent reports). Pure functions,
shared by placement, the monitor and billing."""

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.cluster import ClusterFile, ClusterFileError, NodeEntry, node_entry, read_cluster
from shared.nodes import MEASURED_SLACK, Gpu, NodeInfo, NodeKind, datasheet_tflops

log = logging.getLogger(__name__)


class GpuLimit(BaseModel):
    """One group of a record's GPUs: `count` of one model, each at most this memory and TFLOPS."""

    model_config = ConfigDict(frozen=True)

    model: str
    memory_gb: float
    tflops: float
    count: int = Field(ge=0)


class NodeLimits(BaseModel):
    """The most a node may offer, and at what kind and price: from a cluster-file `[[nodes]]` entry."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    kind: NodeKind = "local"
    price_per_hour: float = Field(0.0, ge=0)
    gpus: int = Field(0, ge=0, description="GPUs at most: the entry's listed count, else its `max_gpus`, else 0.")
    gpu_models: tuple[str, ...] = Field((), description="The models the entry lists (none: any).")
    gpu_memory_gb: float | None = Field(None, description="Per GPU at most (None: the entry lists no figures).")
    tflops: float | None = None
    gpu_groups: tuple[GpuLimit, ...] = Field(
        (), description="The entry's GPU groups, each capping its own model (none: the figures above, for any)."
    )
    cpu_count: float | None = None
    memory_gb: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    address: str | None = Field(None, description="Where other ranks reach the node (None: the entry names none).")


def limits_from_entry(entry: NodeEntry | Mapping[str, Any]) -> NodeLimits:
    """A `[[nodes]]` entry as a record. An entry that lists no GPUs may name `max_gpus` for a machine whose GPUs
    the agent reads through NVML (any model and size, that many at most); without either, no GPUs."""
    entry = node_entry(entry)
    groups = entry.gpus
    return NodeLimits(
        node_id=entry.id,
        kind=entry.kind,
        price_per_hour=entry.price_per_hour,
        gpus=sum(g.count for g in groups) if groups else entry.max_gpus,
        gpu_models=tuple(g.model for g in groups),
        gpu_memory_gb=max((g.memory_gb for g in groups), default=None),
        tflops=max((g.tflops for g in groups), default=None),
        gpu_groups=tuple(
            GpuLimit(model=g.model, memory_gb=g.memory_gb, tflops=g.tflops, count=g.count) for g in groups
        ),
        cpu_count=entry.cpu_count,
        memory_gb=entry.memory_gb,
        labels=entry.all_labels(),
        address=entry.address,
    )


def limits_of(cluster: ClusterFile) -> dict[str, NodeLimits]:
    """The records of a cluster file's `[[nodes]]`, by id."""
    return {node_id: limits_from_entry(e) for node_id, e in cluster.nodes_by_id().items()}


def limits_from_file(path: Path) -> dict[str, NodeLimits]:
    """The static nodes' records of a cluster file, by id (none when it is missing or unusable: logged)."""
    try:
        return limits_of(read_cluster(path))
    except ClusterFileError as exc:
        log.error("no node records: %s", exc)
        return {}


def capped(claimed: NodeInfo, record: NodeLimits) -> tuple[NodeInfo, dict[str, str]]:
    """The node as its record allows it, and each claim refused (field -> what was claimed, what stands)."""
    refused: dict[str, str] = {}

    def refuse(name: str, said: Any, kept: Any) -> Any:
        refused[name] = f"claimed {said}, record {kept}"
        return kept

    update: dict[str, Any] = {}
    if claimed.kind != record.kind:
        update["kind"] = refuse("kind", claimed.kind, record.kind)
    if claimed.price_per_hour != record.price_per_hour:
        update["price_per_hour"] = refuse("price_per_hour", claimed.price_per_hour, record.price_per_hour)
    for name in ("cpu_count", "memory_gb"):
        limit = getattr(record, name)
        if limit is not None and getattr(claimed, name) > limit:
            update[name] = refuse(name, getattr(claimed, name), limit)
    if claimed.labels != record.labels:
        update["labels"] = refuse("labels", claimed.labels, record.labels)
    if record.address is not None and claimed.address != record.address:  # a distributed job's ranks go there
        update["address"] = refuse("address", claimed.address, record.address)
    gpus = _gpus(claimed.gpus, record, refuse)
    if gpus != claimed.gpus:
        update["gpus"] = gpus
    return (claimed.model_copy(update=update) if update else claimed), refused


def _gpus(claimed: tuple[Gpu, ...], record: NodeLimits, refuse: Any) -> tuple[Gpu, ...]:
    if len(claimed) > record.gpus:
        refuse("gpus", len(claimed), record.gpus)
    claimed = claimed[: record.gpus]
    groups = _matched(claimed, record.gpu_groups)
    kept = []
    for gpu, group in zip(claimed, groups, strict=True):
        update: dict[str, Any] = {}
        model, memory_cap, tflops_cap = gpu.model, record.gpu_memory_gb, record.tflops
        if group is not None:  # its own group's figures (a mixed record's T4 is no A100)
            limit = record.gpu_groups[group]
            model = gpu.model if same_model(gpu.model, limit.model) else limit.model
            memory_cap, tflops_cap = limit.memory_gb, limit.tflops
        elif record.gpu_models and gpu.model not in record.gpu_models:
            model = record.gpu_models[0]
        if model != gpu.model:
            update["model"] = refuse(f"gpus[{gpu.index}].model", gpu.model, model)
        if not tflops_cap:  # the record gives no speed: the datasheet's for the model it says it is
            tflops_cap = datasheet_tflops(gpu.model)
        if memory_cap is not None and gpu.memory_gb > memory_cap:
            update["memory_gb"] = refuse(f"gpus[{gpu.index}].memory_gb", gpu.memory_gb, memory_cap)
        if gpu.tflops > tflops_cap:
            update["tflops"] = refuse(f"gpus[{gpu.index}].tflops", gpu.tflops, tflops_cap)
        measured_cap = round(tflops_cap * MEASURED_SLACK, 1)  # none for a speed nothing knows (`Gpu.speed` ignores it)
        if tflops_cap > 0 and gpu.measured_tflops is not None and gpu.measured_tflops > measured_cap:
            update["measured_tflops"] = refuse(f"gpus[{gpu.index}].measured_tflops", gpu.measured_tflops, measured_cap)
        kept.append(gpu.model_copy(update=update) if update else gpu)
    return tuple(kept)


def same_model(claimed: str, listed: str) -> bool:
    """Whether a GPU name is a record's model, as NVML and people write it ("NVIDIA T4", "Tesla T4" and "t4")."""
    return _bare(claimed) == _bare(listed)


def _bare(model: str) -> str:
    name = " ".join(model.lower().split())
    for vendor in ("nvidia ", "tesla ", "geforce ", "amd "):
        name = name.removeprefix(vendor)
    return name


def _matched(claimed: tuple[Gpu, ...], groups: tuple[GpuLimit, ...]) -> list[int | None]:
    """The record's group each claimed GPU counts against (None for all when the record lists none). First each GPU
    that names a group's model takes a group of that model (one whose figures cover its claim, if any); then each
    other GPU, largest claims first, takes the smallest open group that covers it, else the largest open one (its
    model refused, its figures capped). No group holds more GPUs than its count, so a node claims no more of any
    model than its record has, whatever order or names it gives."""
    if not groups:
        return [None] * len(claimed)
    left = [g.count for g in groups]
    out: list[int | None] = [None] * len(claimed)

    def covers(i: int, gpu: Gpu) -> bool:
        return gpu.memory_gb <= groups[i].memory_gb and (not groups[i].tflops or gpu.tflops <= groups[i].tflops)

    for k, gpu in enumerate(claimed):  # named: a group of its model, one that covers its claim first
        named = [i for i, g in enumerate(groups) if left[i] > 0 and same_model(gpu.model, g.model)]
        if named:
            chosen = next((i for i in named if covers(i, gpu)), named[0])
            out[k] = chosen
            left[chosen] -= 1
    size = {i: (g.memory_gb, g.tflops) for i, g in enumerate(groups)}
    for k in sorted(range(len(claimed)), key=lambda k: (-claimed[k].memory_gb, -claimed[k].tflops)):
        if out[k] is None:  # unnamed, largest claims first: the smallest open group that covers it, else the largest
            open_groups = [i for i, n in enumerate(left) if n > 0]
            fitting = [i for i in open_groups if covers(i, claimed[k])]
            chosen = min(fitting, key=size.__getitem__) if fitting else max(open_groups, key=size.__getitem__)
            out[k] = chosen
            left[chosen] -= 1
    return out


def admitted(claimed: NodeInfo, record: NodeLimits | None) -> tuple[NodeInfo | None, dict[str, str]]:
    """A registration against its record: capped (and what was refused, logged), or None without a record."""
    if record is None:
        log.warning("registration of %s refused: no record of that node (cluster file or rented)", claimed.node_id)
        return None, {"node": "no record of this node"}
    node, refused = capped(claimed, record)
    if refused:
        log.warning(
            "registration of %s capped to its record: %s",
            claimed.node_id,
            "; ".join(f"{k}: {v}" for k, v in refused.items()),
        )
    return node, refused
