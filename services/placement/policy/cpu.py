"""Jobs that need no GPU: every rank on its own node of one kind, where all ranks together cost least.

Such a rank is billed its whole node (`shared.pricing`), so the cheapest node that has the CPU and memory
free wins (a CPU-only node before a GPU node of the same price, owned before rented on ties). Nothing is rented for
them: the catalogue holds GPU nodes. Oldest first; a job that fits nowhere now waits and lets later ones go.
"""

from collections.abc import Callable, Iterable

from shared.pricing import rank_price_per_hour
from services.placement.policy.decisions import Decision, Start, Wait
from services.placement.policy.models import KINDS_FOR_ALLOWED, JobRequest, Node
from services.placement.policy.options import KIND_RANK

Allows = Callable[[JobRequest, Node], bool]


def rank_price(node: Node, job: JobRequest) -> float:
    return rank_price_per_hour(node.price_per_hour, gpus=job.gpu_count, node_gpus=node.gpu_count)


def cheapest_hosts(
    nodes: Iterable[Node],
    job: JobRequest,
    *,
    now: float,
    free: dict[str, tuple[float, float]] | None,
    allows: Allows | None = None,
) -> list[Node] | None:
    """The nodes (one per rank, one kind) that would cost the job least; with `free` (node -> free CPU, memory) only
    those that have room now, else any that could ever host it."""
    best: tuple[float, int, list[Node]] | None = None
    for kind in KINDS_FOR_ALLOWED[job.allowed]:
        hosts = sorted(
            (
                n
                for n in nodes
                if n.kind == kind and _room(n, job, now=now, free=free) and (allows is None or allows(job, n))
            ),
            key=lambda n: (rank_price(n, job), n.gpu_count, n.id),
        )[: job.node_count]
        if len(hosts) < job.node_count:
            continue
        key = (sum(rank_price(n, job) for n in hosts), KIND_RANK[kind], hosts)
        if best is None or key[:2] < best[:2]:
            best = key
    return best[2] if best else None


def place_cpu_jobs(
    nodes: Iterable[Node], jobs: Iterable[JobRequest], *, now: float, allows: Allows | None = None
) -> list[Decision]:
    """Start or Wait for each job of `gpu_count` 0; `allows(job, node)` narrows where a job may go."""
    nodes = list(nodes)
    free = {n.id: (n.free_cpu, n.free_memory_gb) for n in nodes}
    decisions: list[Decision] = []
    for job in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        hosts = cheapest_hosts(nodes, job, now=now, free=free, allows=allows)
        if hosts is None:
            decisions.append(Wait(job.id, "no node has the CPU and memory free"))
            continue
        for node in hosts:
            cpu, memory = free[node.id]
            free[node.id] = (cpu - job.cpu, memory - job.memory_on(node.memory_gb, node.gpu_count))
        decisions.append(Start(job.id, tuple(n.id for n in hosts), tuple(() for _ in hosts)))
    return decisions


def _room(node: Node, job: JobRequest, *, now: float, free: dict[str, tuple[float, float]] | None) -> bool:
    needs = job.memory_on(node.memory_gb, node.gpu_count)
    if node.cpu < job.cpu or node.memory_gb < needs or not job.may_run_on(spot=node.spot):
        return False
    if free is None:
        return True
    if not node.is_ready(now) or (node.reserved_for is not None and node.reserved_for != job.id):
        return False
    cpu, memory = free[node.id]
    return cpu + 1e-9 >= job.cpu and memory + 1e-9 >= needs
