"""Which queued job goes where, as pure functions over free capacity (the service's first policy)."""
from dataclasses import dataclass, field

from shared.events import Assignment
from shared.jobs import Resource
from shared.nodes import Gpu, NodeInfo


@dataclass(frozen=True)
class Candidate:
    """A job waiting for capacity, as the policy sees it."""

    job_id: str
    resource: Resource
    allowed: str
    priority: str
    submitted_at: float
    exclude: frozenset[str] = frozenset()


@dataclass
class Usage:
    """Capacity already given out on one node."""

    gpus: set[int] = field(default_factory=set)
    cpu: float = 0.0
    memory_gb: float = 0.0


def free_gpus(node: NodeInfo, used: Usage, *, min_memory_gb: float) -> list[int]:
    return [g.index for g in node.gpus if g.index not in used.gpus and g.memory_gb >= min_memory_gb]


def fits(node: NodeInfo, used: Usage, resource: Resource) -> tuple[int, ...] | None:
    """The GPU indices this node would give one rank, or None if it cannot host it now."""
    if used.cpu + resource.cpu_count > node.cpu_count + 1e-9:
        return None
    if used.memory_gb + resource.memory_gb > node.memory_gb + 1e-9:
        return None
    gpus = free_gpus(node, used, min_memory_gb=resource.min_gpu_memory_gb)
    if len(gpus) < resource.gpu_count:
        return None
    return tuple(gpus[: resource.gpu_count])


def could_ever_fit(node: NodeInfo, resource: Resource) -> bool:
    return fits(node, Usage(), resource) is not None


def preference(node: NodeInfo, priority: str) -> tuple:
    """Sort key: time-sensitive jobs want fast GPUs, cost-sensitive ones cheap nodes; owned first on ties."""
    tflops = sum(g.tflops for g in node.gpus)
    owned = 0 if node.kind == "local" else 1 if node.kind == "reserved" else 2
    if priority == "cost":
        return (node.price_per_hour, owned, -tflops, node.node_id)
    return (-tflops, owned, node.price_per_hour, node.node_id)


def choose(
    candidate: Candidate, nodes: list[NodeInfo], usage: dict[str, Usage]
) -> tuple[Assignment, ...] | None:
    """All ranks on distinct nodes of one kind, or nothing."""
    eligible = sorted((n for n in nodes if n.allows(candidate.allowed) and n.node_id not in candidate.exclude),
                      key=lambda n: preference(n, candidate.priority))
    by_kind: dict[str, list[tuple[NodeInfo, tuple[int, ...]]]] = {}
    for node in eligible:
        gpus = fits(node, usage.setdefault(node.node_id, Usage()), candidate.resource)
        if gpus is not None:
            by_kind.setdefault(node.kind, []).append((node, gpus))
    count = candidate.resource.node_count
    for node in eligible:  # the kind of the most preferred node that completes the gang
        hosts = by_kind.get(node.kind, [])
        if len(hosts) >= count:
            return tuple(Assignment(rank=r, node_id=n.node_id, gpu_indices=g) for r, (n, g) in enumerate(hosts[:count]))
    return None


def schedule(
    queue: list[Candidate], nodes: list[NodeInfo], usage: dict[str, Usage]
) -> list[tuple[str, tuple[Assignment, ...]]]:
    """Place queued jobs oldest first; a job that does not fit now lets smaller ones behind it go."""
    decisions = []
    for candidate in sorted(queue, key=lambda c: c.submitted_at):
        assignments = choose(candidate, nodes, usage)
        if assignments is None:
            continue
        for a in assignments:
            used = usage[a.node_id]
            used.gpus.update(a.gpu_indices)
            used.cpu += candidate.resource.cpu_count
            used.memory_gb += candidate.resource.memory_gb
        decisions.append((candidate.job_id, assignments))
    return decisions


def largest(nodes: list[NodeInfo], resource: Resource, allowed: str) -> str:
    """What the biggest node this job may use offers, to explain why it fits nowhere."""
    usable = [n for n in nodes if n.allows(allowed)]
    if not usable:
        return f"no {allowed} node is registered"
    gpu = max((g.memory_gb for n in usable for g in n.gpus), default=0)
    memory = max(n.memory_gb for n in usable)
    return f"the largest node offers {gpu:g} GB per GPU and {memory:g} GB host memory"


def catalogue_node(instance) -> NodeInfo:
    """An on-demand instance type as the node it would become (to ask whether a job could ever fit)."""
    return NodeInfo(node_id=f"catalogue-{instance.name.replace('.', '-')}"[:64], kind="on_demand",
                    cpu_count=instance.cpu, memory_gb=instance.memory_gb, price_per_hour=instance.price_per_hour,
                    gpus=tuple(Gpu(index=i, model=instance.gpu_model, memory_gb=instance.gpu_memory_gb,
                                   tflops=instance.tflops) for i in range(instance.gpus)))
