"""Whether a node or an instance type could ever host a job (what one rank pays for its part of a node is
`shared.pricing.rank_price_per_hour`, the rule billing charges by)."""

from collections.abc import Iterable

from services.placement.policy.models import KINDS_FOR_ALLOWED, InstanceType, JobRequest, Node
from services.placement.policy.options import fits


def could_host(node: Node, job: JobRequest) -> bool:
    """Whether `node`, empty, could run one rank of `job`: its kind, GPUs, GPU memory and model, CPU and memory."""
    gpus_fit = job.gpu_count == 0 or (
        node.gpu_count >= job.gpu_count
        and node.gpu_memory_gb >= job.min_gpu_memory_gb
        and job.accepts_model(node.gpu_model)
    )
    return (
        node.kind in KINDS_FOR_ALLOWED[job.allowed]
        and gpus_fit
        and node.cpu >= job.cpu
        and node.memory_gb >= job.memory_on(node.memory_gb, node.gpu_count)
    )


def could_rent(job: JobRequest, instance: InstanceType) -> bool:
    """Whether renting `instance` could run the job (placement rents GPU nodes, for GPU jobs only)."""
    return job.gpu_count > 0 and "on_demand" in KINDS_FOR_ALLOWED[job.allowed] and fits(job, instance)


def hosts_by_kind(nodes: Iterable[Node], job: JobRequest) -> dict[str, int]:
    """How many of `nodes` could ever host one rank of the job, per kind."""
    counts: dict[str, int] = {}
    for node in nodes:
        if could_host(node, job):
            counts[node.kind] = counts.get(node.kind, 0) + 1
    return counts


def ever_placeable(nodes: Iterable[Node], catalogue: Iterable[InstanceType], job: JobRequest) -> bool:
    """Some kind has enough nodes for every rank, or some instance type could be rented for it."""
    if any(count >= job.node_count for count in hosts_by_kind(nodes, job).values()):
        return True
    return any(could_rent(job, it) for it in catalogue)


def largest(nodes: Iterable[Node], job: JobRequest) -> str:
    """What the biggest node this job may use offers, to explain why it fits nowhere."""
    usable = [n for n in nodes if n.kind in KINDS_FOR_ALLOWED[job.allowed]]
    if not usable:
        return f"no {job.allowed} node is registered"
    gpu = max((n.gpu_memory_gb for n in usable if n.gpu_count), default=0)
    memory = max(n.memory_gb for n in usable)
    return f"the largest node offers {gpu:g} GB per GPU and {memory:g} GB host memory"


OOM_HEADROOM = 1.25  # after running out of GPU memory, a job asks this much more than its recorded peak


def gpu_memory_after_oom(*, asked_gb: float, had_gb: float, peak_gb: float | None, largest_gb: float) -> float:
    """The GPU memory the next attempt of a job that ran out of it asks for: more than the GPU it had and, with a
    recorded peak, OOM_HEADROOM times that peak, though never more than the largest GPU there is for that part
    (past the GPU it had even there, it fits nowhere and fails)."""
    need = max(asked_gb, had_gb + 0.001)
    if peak_gb is not None and peak_gb > 0:
        need = max(need, min(peak_gb * OOM_HEADROOM, largest_gb))
    return need


def as_node(instance: InstanceType) -> Node:
    """An instance type as the idle node it would become (to weigh it as a host)."""
    return Node(
        id=f"catalogue-{instance.name}",
        kind="on_demand",
        gpu_model=instance.gpu_model,
        gpu_count=instance.gpus,
        gpu_memory_gb=instance.gpu_memory_gb,
        tflops=instance.tflops,
        cpu=instance.cpu,
        memory_gb=instance.memory_gb,
        price_per_hour=instance.price_per_hour,
        free_gpu_indices=tuple(range(instance.gpus)),
        free_cpu=instance.cpu,
        free_memory_gb=instance.memory_gb,
        instance_type=instance.name,
    )
