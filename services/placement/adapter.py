"""The placement service's view of the fleet and the queue, as the pure policy's inputs (no I/O)."""
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.nodes import NodeInfo
from services.placement.fit import Usage
from services.placement.policy import ClusterState, InstanceType, JobRequest, Node, RunningJob

# A job that states no expected duration is planned as one hour (the estimator's prediction replaces it).
DEFAULT_DURATION_S = 3600.0


@dataclass(frozen=True)
class NodeView:
    """A node as placement tracks it: what it offers, whether it can take work, and its on-demand life."""

    info: NodeInfo
    ready: bool = True
    ready_at: float | None = None
    idle_since: float | None = None
    reserved_for: str | None = None
    instance_type: str | None = None


@dataclass(frozen=True)
class JobView:
    job_id: str
    user_name: str
    submitted_at: float
    allowed: str
    priority: str
    gpu_count: int
    min_gpu_memory_gb: float
    gpu_models: frozenset[str]
    node_count: int
    cpu: float
    memory_gb: float
    expected_duration_s: float | None
    predicted_duration_s: float | None = None
    max_price_per_hour: float | None = None
    deadline: float | None = None
    duration_sigma: float = 0.0
    exchange_rate: float | None = None
    checkpoint_interval_s: float | None = None


def reference_tflops(nodes: Iterable[NodeInfo]) -> float:
    """Owners' expected durations are taken to mean a typical GPU of the fleet (its median TFLOPS)."""
    values = [g.tflops for n in nodes for g in n.gpus if g.tflops > 0]
    return statistics.median(values) if values else 100.0


def policy_node(view: NodeView, used: Usage) -> Node | None:
    """The policy's node, or None for a node without GPUs (the policy places GPU jobs only)."""
    info = view.info
    if not info.gpus:
        return None
    gpus = sorted(info.gpus, key=lambda g: g.index)
    return Node(
        id=info.node_id,
        kind=info.kind,
        gpu_model=gpus[0].model,
        gpu_count=len(gpus),
        gpu_memory_gb=min(g.memory_gb for g in gpus),
        tflops=statistics.fmean(g.tflops for g in gpus) or 1e-3,
        cpu=info.cpu_count,
        memory_gb=info.memory_gb,
        price_per_hour=info.price_per_hour,
        free_gpu_indices=tuple(i for i, g in enumerate(gpus) if g.index not in used.gpus),
        free_cpu=max(0.0, info.cpu_count - used.cpu),
        free_memory_gb=max(0.0, info.memory_gb - used.memory_gb),
        labels=info.labels,
        instance_type=view.instance_type,
        ready_at=view.ready_at,
        idle_since=view.idle_since,
        reserved_for=view.reserved_for,
    )


def job_request(job: JobView) -> JobRequest:
    return JobRequest(
        id=job.job_id, user=job.user_name, submitted_at=job.submitted_at,
        expected_duration_s=job.expected_duration_s or DEFAULT_DURATION_S,
        allowed=job.allowed, priority=job.priority, gpu_count=job.gpu_count,
        min_gpu_memory_gb=job.min_gpu_memory_gb, gpu_models=job.gpu_models, node_count=job.node_count,
        max_price_per_hour=job.max_price_per_hour, deadline=job.deadline,
        predicted_duration_s=job.predicted_duration_s, cpu=job.cpu, memory_gb=job.memory_gb,
        duration_sigma=job.duration_sigma, exchange_rate=job.exchange_rate,
        checkpoint_interval_s=job.checkpoint_interval_s,
    )


def cluster_state(
    *,
    nodes: Iterable[NodeView],
    usage: Mapping[str, Usage],
    queue: Iterable[JobView],
    running: Iterable[tuple[JobView, tuple[str, ...], tuple[tuple[int, ...], ...], float, float]],
    catalogue: Iterable[InstanceType],
    usage_by_user: Mapping[str, float],
) -> ClusterState:
    """Snapshot for one pass; `running` is (job, node ids, GPU indices per rank, started at, expected end)."""
    policy_nodes = tuple(n for v in nodes if (n := policy_node(v, usage.get(v.info.node_id, Usage()))))
    known = {n.id for n in policy_nodes}
    return ClusterState(
        nodes=policy_nodes,
        queue=tuple(job_request(j) for j in queue),
        running=tuple(RunningJob(job=job_request(j), node_ids=ids, gpu_indices=gpus, started_at=start,
                                 expected_end_at=end)
                      for j, ids, gpus, start, end in running if set(ids) <= known),
        catalogue=tuple(catalogue),
        usage_by_user=dict(usage_by_user),
    )


def catalogue_from(entries: Iterable[Mapping]) -> tuple[InstanceType, ...]:
    """The on-demand catalogue of a cluster file's [[instance_types]]."""
    return tuple(
        InstanceType(name=e["name"], gpus=int(e["gpus"]), gpu_model=e["gpu_model"],
                     gpu_memory_gb=float(e["gpu_memory_gb"]), tflops=float(e["tflops"]), cpu=float(e["cpu"]),
                     memory_gb=float(e["memory_gb"]), price_per_hour=float(e["price_per_hour"]),
                     startup_delay_s=float(e.get("startup_delay_s", 60)), spot=e.get("market") == "spot")
        for e in entries
    )
