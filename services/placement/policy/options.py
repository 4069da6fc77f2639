"""Candidate placements for one job and the two rules that pick among them (time- and cost-sensitive)."""
from dataclasses import dataclass

from services.placement.policy.capacity import CapacityIndex, NodeView
from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import KINDS_FOR_ALLOWED, OWNED_KINDS, InstanceType, JobRequest

KIND_RANK = {"local": 0, "reserved": 1, "on_demand": 2}


@dataclass(slots=True)
class Option:
    action: str  # "start" | "wait" | "provision"
    start_at: float
    finish: float
    cost: float
    paid: bool
    kind_rank: int
    duration: float
    picks: list[tuple[NodeView, tuple[int, ...]]] | None = None
    views: list[NodeView] | None = None
    instance: InstanceType | None = None


def job_kinds(job: JobRequest, enabled: frozenset[str]) -> tuple[str, ...]:
    return tuple(k for k in KINDS_FOR_ALLOWED[job.allowed] if k in enabled)


def share_per_hour(views: list[NodeView], gpus: int) -> float:
    """What the job's ranks cost per hour: the GPU share of each node's (amortised or on-demand) price."""
    return sum(v.node.price_per_hour * gpus / v.node.gpu_count for v in views)


def node_options(
    job: JobRequest, index: CapacityIndex, *, kinds: tuple[str, ...], config: PolicyConfig, wait: bool
) -> list[Option]:
    """Start-now options (and, if `wait`, earliest-availability options) on existing nodes, one per bucket."""
    now = index.now
    found: list[Option] = []
    for key in index.eligible(job, kinds):
        bucket = index.buckets[key]
        duration = job.duration_on(bucket.tflops, config.reference_tflops)
        paid = bucket.kind not in OWNED_KINDS
        picks = index.find_free(key, job, duration=duration, limit=config.max_nodes_scanned)
        if picks is not None:
            hourly = share_per_hour([v for v, _ in picks], job.gpu_count)
            if job.max_price_per_hour is None or hourly <= job.max_price_per_hour:
                found.append(
                    Option("start", now, now + duration, hourly * duration / 3600, paid, KIND_RANK[bucket.kind],
                           duration, picks=picks)
                )
        if not wait:
            continue
        soonest = index.earliest(key, job, limit=config.max_nodes_scanned)
        if soonest is None:
            continue
        at, views = soonest
        at = max(at, now + 1.0)
        hourly = share_per_hour(views, job.gpu_count)
        if job.max_price_per_hour is None or hourly <= job.max_price_per_hour:
            found.append(
                Option("wait", at, at + duration, hourly * duration / 3600, paid, KIND_RANK[bucket.kind], duration,
                       views=views)
            )
    return found


def fits(job: JobRequest, it: InstanceType) -> bool:
    return (
        it.gpus >= job.gpu_count
        and job.accepts_model(it.gpu_model)
        and it.gpu_memory_gb >= job.min_gpu_memory_gb
        and it.cpu >= job.cpu
        and it.memory_gb >= job.memory_gb
        and (job.max_price_per_hour is None or it.price_per_hour * job.node_count <= job.max_price_per_hour)
    )


def provision_options(
    job: JobRequest, catalogue: tuple[InstanceType, ...], *, now: float, config: PolicyConfig
) -> list[Option]:
    found = []
    for it in catalogue:
        if not fits(job, it):
            continue
        duration = job.duration_on(it.tflops, config.reference_tflops)
        start = now + it.startup_delay_s
        cost = it.price_per_hour * job.node_count * (it.startup_delay_s + duration) / 3600
        found.append(Option("provision", start, start + duration, cost, True, KIND_RANK["on_demand"], duration,
                            instance=it))
    return found


def cheapest_instance(job: JobRequest, catalogue: tuple[InstanceType, ...]) -> InstanceType | None:
    """The lowest hourly price that fits, whatever its speed (the `burst` baseline's choice)."""
    fitting = [it for it in catalogue if fits(job, it)]
    return min(fitting, key=lambda it: (it.price_per_hour, -it.tflops)) if fitting else None


def pick_time_sensitive(options: list[Option], *, now: float, config: PolicyConfig) -> Option:
    """Earliest finish; finishes within the tolerance are equal and then owned, then cheaper, wins."""
    if config.pay_only_to_avoid_waiting:
        owned_now = [o for o in options if o.action == "start" and not o.paid]
        options = owned_now or options
    best = min(o.finish for o in options)
    tolerance = max(config.finish_tolerance_s, config.finish_tolerance_frac * (best - now))
    near = [o for o in options if o.finish <= best + tolerance]
    return min(near, key=lambda o: (o.paid, o.cost, o.finish, o.kind_rank))


def pick_cost_sensitive(options: list[Option], job: JobRequest) -> Option:
    """Cheapest expected total cost that meets the deadline; if none can, the earliest finish."""
    on_time = [o for o in options if job.deadline is None or o.finish <= job.deadline]
    if not on_time:
        return min(options, key=lambda o: (o.finish, o.cost))
    return min(on_time, key=lambda o: (o.cost, o.finish, o.kind_rank))
