"""Placement's records as the pure policy's inputs: nodes, capacity given out, the catalogue (no I/O)."""

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.nodes import NodeInfo
from services.placement.policy import InstanceType, Node

# A job that states no expected duration is planned as one hour (the estimator's prediction replaces it).
DEFAULT_DURATION_S = 3600.0


@dataclass
class Usage:
    """Capacity already given out on one node (by placed jobs)."""

    gpus: set[int] = field(default_factory=set)
    cpu: float = 0.0
    memory_gb: float = 0.0


def reference_tflops(nodes: Iterable[NodeInfo]) -> float:
    """Owners' expected durations are taken to mean a typical GPU of the fleet (its median speed: `Gpu.speed`)."""
    values = [g.speed for n in nodes for g in n.gpus if g.speed > 0]
    return statistics.median(values) if values else 100.0


def policy_node(
    info: NodeInfo,
    used: Usage | None = None,
    *,
    ready_at: float | None = None,
    idle_since: float | None = None,
    reserved_for: str | None = None,
    instance_type: str | None = None,
    spot: bool = False,
) -> Node:
    """The policy's node: GPUs numbered by position in index order; a node without GPUs has none to give."""
    used = used or Usage()
    gpus = sorted(info.gpus, key=lambda g: g.index)
    return Node(
        id=info.node_id,
        kind=info.kind,
        gpu_model=gpus[0].model if gpus else "",
        gpu_count=len(gpus),
        gpu_memory_gb=min((g.memory_gb for g in gpus), default=0.0),
        tflops=(statistics.fmean(g.speed for g in gpus) or 1e-3) if gpus else 0.0,
        cpu=info.cpu_count,
        memory_gb=info.memory_gb,
        price_per_hour=info.price_per_hour,
        free_gpu_indices=tuple(i for i, g in enumerate(gpus) if g.index not in used.gpus),
        free_cpu=max(0.0, info.cpu_count - used.cpu),
        free_memory_gb=max(0.0, info.memory_gb - used.memory_gb),
        labels=info.labels,
        pool=info.labels.get("pool", "default"),
        instance_type=instance_type,
        ready_at=ready_at,
        idle_since=idle_since,
        reserved_for=reserved_for,
        spot=spot,
    )


def catalogue_from(entries: Iterable[Mapping]) -> tuple[InstanceType, ...]:
    """The on-demand catalogue of a cluster file's [[instance_types]]."""
    return tuple(
        InstanceType(
            name=e["name"],
            gpus=int(e["gpus"]),
            gpu_model=e["gpu_model"],
            gpu_memory_gb=float(e["gpu_memory_gb"]),
            tflops=float(e["tflops"]),
            cpu=float(e["cpu"]),
            memory_gb=float(e["memory_gb"]),
            price_per_hour=float(e["price_per_hour"]),
            startup_delay_s=float(e.get("startup_delay_s", 60)),
            spot=e.get("market") == "spot",
        )
        for e in entries
    )
