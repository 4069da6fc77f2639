"""What the policy would do for one job now, deciding nothing: the quote is the decision. The job is queued behind
the jobs already waiting and the configured policy's engine (`engine.place`, with every queued job's constraint)
decides for the whole queue; the offer shown first is that decision, priced as billing charges it. The other
offers (per allowed kind the option the policy's rules would take on that kind's nodes, and every instance type it
could rent) weigh the job against the cluster as it is; and a faster node for a slow job.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from services.placement.policy.capacity import CapacityIndex
from services.placement.policy.config import PolicyConfig
from services.placement.policy.cpu import cheapest_hosts, rank_price
from services.placement.policy.decisions import Decision, Provision, Start, Wait
from services.placement.policy.engine import Constraint, place
from services.placement.policy.market import pick_market
from services.placement.policy.models import ClusterState, InstanceType, JobRequest, Node
from services.placement.policy.options import (
    Option,
    burst_finish,
    job_kinds,
    node_options,
    pick,
    provision_options,
    rent_cost,
    share_per_hour,
)
from services.placement.policy.passes import ALL_KINDS, OWNED_ONLY
from services.placement.policy.spot import spot_duration

OWNED_POLICIES = ("wait-local", "local-fifo")
KINDS = ("local", "reserved", "on_demand")


@dataclass(frozen=True, slots=True)
class Offer:
    """One place the job could go: existing nodes (`node_ids`) or a rental (`instance`), for all its ranks."""

    kind: str
    node_ids: tuple[str, ...]
    instance: InstanceType | None
    gpu_model: str
    price_per_hour: float
    duration_s: float
    cost: float
    free_now: bool
    start_at: float
    chosen: bool = False


def offers(
    state: ClusterState,
    job: JobRequest,
    *,
    now: float,
    config: PolicyConfig,
    constraint: Constraint | None = None,
    constraints: Mapping[str, Constraint] | None = None,
) -> list[Offer]:
    """First (`chosen`) what the engine decides for the job queued behind `state.queue` (whose own constraints are
    `constraints`), then per allowed kind the option the policy would take on that kind's nodes and every instance
    type it could rent; [] when nothing could host the job now."""
    nodes = tuple(n for n in state.nodes if constraint is None or constraint.allows(n))
    if not job.gpu_count:
        return _cpu_offers(nodes, job, now=now, config=config)
    kinds = job_kinds(job, OWNED_ONLY if config.policy in OWNED_POLICIES else ALL_KINDS)
    index = _index(state, nodes, job, now=now)
    options = node_options(job, index, kinds=kinds, config=config, wait=True)
    if "on_demand" in kinds and (constraint is None or constraint.rents):
        options += provision_options(job, state.catalogue, now=now, config=config)
    if not options:
        return []
    decision = decided(state, job, now=now, config=config, constraint=constraint, constraints=constraints)
    chosen = _decided_offer(decision, state, job, now=now, config=config)
    bar = burst_finish(options)  # the job's, as the engine weighs it, whichever of its options are picked from
    if chosen is None:  # no reservation (blocked, or past the pass's bounds): what it would wait for, as weighed now
        waits = [o for o in options if o.action != "provision"] if isinstance(decision, Wait) else options
        chosen = _offer(pick_market(waits or options, job, now=now, config=config, bar=bar), job, chosen=True)
    shown = [
        pick(mine, job, now=now, config=config, bar=bar)
        for kind in kinds
        if (mine := [o for o in options if o.instance is None and _kind(o) == kind])
    ]
    shown += [o for o in options if o.instance is not None]
    rest = [
        offer
        for o in sorted(shown, key=lambda o: (o.cost, o.duration))
        if (offer := _offer(o, job)).node_ids != chosen.node_ids or offer.instance != chosen.instance
    ]
    return [chosen] + rest


def decided(
    state: ClusterState,
    job: JobRequest,
    *,
    now: float,
    config: PolicyConfig,
    constraint: Constraint | None = None,
    constraints: Mapping[str, Constraint] | None = None,
) -> Decision | None:
    """The engine's decision for `job` submitted now behind the queue (None: the pass left it undecided)."""
    mine = dict(constraints or {}) | ({job.id: constraint} if constraint is not None else {})
    for decision in place(dataclasses.replace(state, queue=state.queue + (job,)), now, config, mine):
        if isinstance(decision, (Start, Provision, Wait)) and decision.job_id == job.id:
            return decision
    return None


def _decided_offer(
    decision: Decision | None, state: ClusterState, job: JobRequest, *, now: float, config: PolicyConfig
) -> Offer | None:
    """The decision as an offer, priced by the rule billing charges (the nodes' share, or the rental's hours)."""
    if isinstance(decision, Provision):
        it = next((i for i in state.catalogue if i.name == decision.instance_type), None)
        if it is None:
            return None
        duration = job.duration_on(it.tflops, config.reference_tflops)
        if it.spot:
            duration = spot_duration(duration, checkpoint_interval_s=job.checkpoint_interval_s)
        return Offer(
            kind="on_demand",
            node_ids=(),
            instance=it,
            gpu_model=it.gpu_model,
            price_per_hour=it.price_per_hour * job.node_count,
            duration_s=duration,
            cost=rent_cost(job, it, duration),
            free_now=False,
            start_at=now + it.startup_delay_s,
            chosen=True,
        )
    if not isinstance(decision, (Start, Wait)) or not decision.node_ids:
        return None
    by_id = {n.id: n for n in state.nodes}
    nodes = [by_id[i] for i in decision.node_ids if i in by_id]
    if len(nodes) != len(decision.node_ids):
        return None
    duration = job.duration_on(min(n.tflops for n in nodes), config.reference_tflops)
    hourly = sum(n.price_per_hour * job.gpu_count / n.gpu_count for n in nodes)
    start = decision.until if isinstance(decision, Wait) and decision.until is not None else now
    return Offer(
        kind=nodes[0].kind,
        node_ids=tuple(decision.node_ids),
        instance=None,
        gpu_model=nodes[0].gpu_model,
        price_per_hour=hourly,
        duration_s=duration,
        cost=hourly * duration / 3600,
        free_now=isinstance(decision, Start),
        start_at=start,
        chosen=True,
    )


def faster_node(
    state: ClusterState,
    job: JobRequest,
    *,
    away_from: frozenset[str],
    tflops_now: float,
    now: float,
    config: PolicyConfig,
    factor: float = 1.2,
) -> str | None:
    """A node free now, none of `away_from`, where the job's GPUs would have more than `factor` times `tflops_now`."""
    if not job.gpu_count:
        return None
    nodes = tuple(n for n in state.nodes if n.id not in away_from)
    index = _index(state, nodes, job, now=now)
    for option in node_options(job, index, kinds=job_kinds(job, ALL_KINDS), config=config, wait=False):
        if sum(view.node.tflops * len(gpus) for view, gpus in option.picks) > factor * tflops_now:
            return option.picks[0][0].node.id
    return None


def _index(state: ClusterState, nodes: tuple[Node, ...], job: JobRequest, *, now: float) -> CapacityIndex:
    """The capacity the job could use now; nodes kept for queued jobs stay theirs."""
    return CapacityIndex(dataclasses.replace(state, nodes=nodes, queue=state.queue + (job,)), now=now, kinds=ALL_KINDS)


def _kind(option: Option) -> str:
    views = [view for view, _ in option.picks] if option.picks else option.views
    return views[0].node.kind


def _offer(option: Option, job: JobRequest, *, chosen: bool = False) -> Offer:
    it = option.instance
    if it is not None:
        return Offer(
            kind="on_demand",
            node_ids=(),
            instance=it,
            gpu_model=it.gpu_model,
            price_per_hour=it.price_per_hour * job.node_count,
            duration_s=option.duration,
            cost=option.cost,
            free_now=False,
            start_at=option.start_at,
            chosen=chosen,
        )
    views = [view for view, _ in option.picks] if option.picks else option.views
    return Offer(
        kind=views[0].node.kind,
        node_ids=tuple(v.node.id for v in views),
        instance=None,
        gpu_model=views[0].node.gpu_model,
        price_per_hour=share_per_hour(views, job.gpu_count),
        duration_s=option.duration,
        cost=option.cost,
        free_now=option.action == "start",
        start_at=option.start_at,
        chosen=chosen,
    )


def _cpu_offers(nodes: tuple[Node, ...], job: JobRequest, *, now: float, config: PolicyConfig) -> list[Offer]:
    """A job without GPUs: per kind the cheapest hosts free now (else the cheapest that could ever host it); the one
    `cpu.place_cpu_jobs` would start now is `chosen`."""
    duration = job.duration_on(config.reference_tflops, config.reference_tflops)
    free = {n.id: (n.free_cpu, n.free_memory_gb) for n in nodes}
    decided = cheapest_hosts(nodes, job, now=now, free=free)
    found = []
    for kind in KINDS:
        in_kind = [n for n in nodes if n.kind == kind]
        room_now = cheapest_hosts(in_kind, job, now=now, free=free)
        hosts = room_now or cheapest_hosts(in_kind, job, now=now, free=None)
        if hosts is None:
            continue
        hourly = sum(rank_price(n, job) for n in hosts)
        found.append(
            Offer(
                kind=kind,
                node_ids=tuple(n.id for n in hosts),
                instance=None,
                gpu_model=hosts[0].gpu_model,
                price_per_hour=hourly,
                duration_s=duration,
                cost=hourly * duration / 3600,
                free_now=room_now is not None,
                start_at=now,
                chosen=decided is not None and hosts == decided,
            )
        )
    return sorted(found, key=lambda o: (not o.chosen, o.cost, o.duration_s))
