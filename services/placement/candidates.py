"""A dry run as the RPC answers it: the policy's offers for a job (policy/dryrun.py), the one it would take first,
and the allowed kinds that could never host the job (pure)."""

from collections.abc import Mapping

from shared.rpc import Candidate, CandidatesReply
from services.placement.policy import ClusterState, JobRequest, Node, PolicyConfig
from services.placement.policy.dryrun import Offer, offers
from services.placement.policy.engine import Constraint
from services.placement.policy.hosting import could_rent, hosts_by_kind
from services.placement.policy.models import KINDS_FOR_ALLOWED


def candidates(
    state: ClusterState,
    job: JobRequest,
    *,
    now: float,
    config: PolicyConfig,
    known: tuple[Node, ...],
    source: str,
    constraint: Constraint | None = None,
    constraints: Mapping[str, Constraint] | None = None,
) -> CandidatesReply:
    """Where the job could go and at what price, priced as the policy prices what it decides, the one the engine
    would take now first (a job without GPUs and no room anywhere now: the cheapest first); a kind is unplaceable
    when no `known` node (lost ones included: they may come back) nor instance type could ever host it."""
    found = offers(state, job, now=now, config=config, constraint=constraint, constraints=constraints)
    hosts = hosts_by_kind((n for n in known if constraint is None or constraint.allows(n)), job)
    rentable = (constraint is None or constraint.rents) and any(could_rent(job, it) for it in state.catalogue)
    unplaceable = {
        kind: f"no {kind} node can host {job.gpu_count} GPU(s) of at least {job.min_gpu_memory_gb:g} GB "
        f"with {job.cpu:g} CPUs and {_memory_text(job)}"
        for kind in KINDS_FOR_ALLOWED[job.allowed]
        if hosts.get(kind, 0) < job.node_count and not (kind == "on_demand" and rentable)
    }
    nodes = {n.id: n for n in state.nodes}
    return CandidatesReply(candidates=[_candidate(o, job, source, nodes) for o in found], unplaceable_kinds=unplaceable)


def memory_given(offer: Offer, job: JobRequest, nodes: dict[str, Node]) -> float | None:
    """Host memory per node the job gets with this offer: the least its nodes give (as placement launches it)."""
    if offer.instance is not None:
        return job.memory_on(offer.instance.memory_gb, offer.instance.gpus)
    shares = [job.memory_on(nodes[i].memory_gb, nodes[i].gpu_count) for i in offer.node_ids if i in nodes]
    return min(shares) if shares else None


def _candidate(offer: Offer, job: JobRequest, source: str, nodes: dict[str, Node]) -> Candidate:
    memory = memory_given(offer, job, nodes)
    return Candidate(
        node_kind=offer.kind,
        node_id=offer.node_ids[0] if offer.node_ids else None,
        instance_type=offer.instance.name if offer.instance else None,
        gpu_model=offer.gpu_model,
        gpus=job.gpu_count,
        memory_gb=None if memory is None else round(memory, 3),
        price_per_hour=round(offer.price_per_hour, 6),
        predicted_duration_s=round(offer.duration_s, 1),
        duration_source=source,
        expected_cost=round(offer.cost, 6),
        free_now=offer.free_now,
        startup_delay_s=offer.instance.startup_delay_s if offer.instance else 0,
    )


def _memory_text(job: JobRequest) -> str:
    return (
        "its GPUs' share of host memory" if job.memory_gb is None and job.gpu_count else f"{job.memory_on(0, 0):g} GB"
    )
