"""Baselines to compare against: `local-fifo` (owned only, strict FCFS) and `burst` (owned now, else pay now)."""

from services.placement.policy.config import PolicyConfig
from services.placement.policy.decisions import Decision, Provision, Wait
from services.placement.policy.models import OWNED_KINDS, ClusterState
from services.placement.policy.options import cheapest_instance, job_kinds, node_options
from services.placement.policy.passes import ALL_KINDS, OWNED_ONLY, Pass, fifo


def schedule_local_fifo(state: ClusterState, now: float, config: PolicyConfig) -> list[Decision]:
    """First come, first served on owned nodes; the head blocks everyone behind it (no backfill)."""
    p = Pass(state, now=now, config=config, kinds=OWNED_ONLY)
    for job in fifo(state.queue):
        allowed = job_kinds(job, OWNED_ONLY)
        options = node_options(job, p.index, kinds=allowed, config=config, wait=False)
        if options:
            p.apply(job, min(options, key=lambda o: (o.finish, o.kind_rank)))
            continue
        buckets = p.index.eligible(job, allowed)
        if not any(p.index.earliest(key, job, limit=config.max_nodes_scanned) for key in buckets):
            p.wait(job, "no owned node can host this job")
            continue
        p.wait(job, "head of the FIFO queue waits for owned capacity")
        break
    return p.decisions


def schedule_burst(state: ClusterState, now: float, config: PolicyConfig) -> list[Decision]:
    """Owned capacity if free now, otherwise on-demand at once on the cheapest instance type that fits."""
    return _burst(state, now, config, after_s=0.0)


def schedule_burst_after(state: ClusterState, now: float, config: PolicyConfig) -> list[Decision]:
    """`burst`, but a job rents only once it has waited `config.burst_after_s`."""
    return _burst(state, now, config, after_s=config.burst_after_s)


def _burst(state: ClusterState, now: float, config: PolicyConfig, *, after_s: float) -> list[Decision]:
    p = Pass(state, now=now, config=config, kinds=ALL_KINDS)
    owned_full: set[tuple] = set()  # shapes no free owned node can host any more this pass
    for job in fifo(state.queue):
        allowed = job_kinds(job, ALL_KINDS)
        owned = tuple(k for k in allowed if k in OWNED_KINDS)
        shape = (
            owned,
            *job.needs,
            job.id in p.index.claimed,
        )
        options = [] if shape in owned_full else node_options(job, p.index, kinds=owned, config=config, wait=False)
        if options:
            p.apply(job, min(options, key=lambda o: (o.finish, o.kind_rank)))
            continue
        owned_full.add(shape)  # capacity only shrinks within a pass: the same shape fails again
        if "on_demand" not in allowed:
            p.wait(job, "owned capacity is busy")
            continue
        if now - job.submitted_at < after_s:
            retry = job.submitted_at + after_s
            p.decisions.append(Wait(job.id, "waiting for owned capacity before renting", retry_at=retry))
            continue
        idle = node_options(job, p.index, kinds=("on_demand",), config=config, wait=False)
        if idle:
            p.apply(job, min(idle, key=lambda o: (o.cost, o.finish)))
        elif job.id in p.index.claimed:
            p.wait(job, "on-demand node is booting")
        elif (it := cheapest_instance(job, state.catalogue)) is not None:
            p.decisions.append(Provision(it.name, job.node_count, job.id))
        else:
            p.wait(job, "no node or instance type can host this job")
    p.release_idle()
    return p.decisions
