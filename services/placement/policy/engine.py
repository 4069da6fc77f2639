"""The placement service's pass: `schedule` for the queue, then the jobs with a constraint of their own, each by the
same policy on the nodes it may use, then the jobs that need no GPU (pure).

A constraint narrows where one job may go: `only` the nodes kept for it (a pull-back's owned target, or nodes rented
for it), never the nodes it is moving away from (`exclude`, after a move or a slow or reclaimed attempt), only its
`pool`'s nodes (`Node.pool`: the node's "pool" label, else "default", as GET /v2/pools groups them). A job kept to
nodes or to a pool rents nothing.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from services.placement.policy.config import PolicyConfig
from services.placement.policy.cpu import place_cpu_jobs
from services.placement.policy.decisions import Decision, Provision, PullBack, Release, Start, Wait
from services.placement.policy.models import ClusterState, JobRequest, Node
from services.placement.policy.registry import schedule


@dataclass(frozen=True, slots=True)
class Constraint:
    only: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()
    pool: str | None = None

    @property
    def rents(self) -> bool:
        return not self.only and self.pool is None

    def allows(self, node: Node) -> bool:
        return (
            (not self.only or node.id in self.only)
            and node.id not in self.exclude
            and (self.pool is None or node.pool == self.pool)
        )


def place(
    state: ClusterState, now: float, config: PolicyConfig, constraints: Mapping[str, Constraint] | None = None
) -> list[Decision]:
    """Decisions for the whole queue; with no constraint and no GPU-less job, exactly `schedule`'s."""
    constraints = constraints or {}
    kept = {node_id for c in constraints.values() for node_id in c.only}
    free = tuple(j for j in state.queue if j.gpu_count and j.id not in constraints)
    main = dataclasses.replace(state, queue=free, nodes=tuple(n for n in state.nodes if n.id not in kept))
    decisions = schedule(main, now, config)  # also renting, releasing and pulling back
    nodes = taken(state.nodes, decisions, state)
    for job in sorted((j for j in state.queue if j.gpu_count and j.id in constraints), key=_order):
        constraint = constraints[job.id]
        others = tuple(n for n in nodes if n.id not in kept or n.id in constraint.only)  # kept for another job
        mine = one_job(state, job, constraint, nodes=others, now=now, config=config)
        decisions += mine
        nodes = taken(nodes, mine, state)
    allows = lambda job, node: job.id not in constraints or constraints[job.id].allows(node)  # noqa: E731
    decisions += place_cpu_jobs(nodes, [j for j in state.queue if not j.gpu_count], now=now, allows=allows)
    started = {node_id for d in decisions if isinstance(d, Start) for node_id in d.node_ids}
    releases = [d for d in decisions if isinstance(d, Release) and d.node_id not in started]
    return [d for d in decisions if not isinstance(d, Release)] + releases


def one_job(
    state: ClusterState,
    job: JobRequest,
    constraint: Constraint,
    *,
    nodes: tuple[Node, ...],
    now: float,
    config: PolicyConfig,
) -> list[Decision]:
    """The policy's decision for one job on the nodes its constraint leaves it (and the catalogue, if it rents)."""
    sub = dataclasses.replace(
        state,
        queue=(job,),
        nodes=tuple(n for n in nodes if constraint.allows(n)),
        catalogue=state.catalogue if constraint.rents else (),
    )
    return [d for d in schedule(sub, now, config) if isinstance(d, (Start, Provision, Wait)) and d.job_id == job.id]


def taken(nodes: tuple[Node, ...], decisions: list[Decision], state: ClusterState) -> tuple[Node, ...]:
    """`nodes` with the GPUs, CPU and memory that `decisions` start (or pull back) on them no longer free."""
    jobs = {j.id: j for j in state.queue} | {r.job.id: r.job for r in state.running}
    used: dict[str, list] = {}
    by_id = {n.id: n for n in nodes}
    for d in decisions:
        if isinstance(d, Start):
            for node_id, gpus in zip(d.node_ids, d.gpu_indices, strict=True):
                _use(used, node_id, gpus, jobs.get(d.job_id), by_id.get(node_id))
        elif isinstance(d, PullBack):
            _use(used, d.to_node_id, d.gpu_indices, jobs.get(d.job_id), by_id.get(d.to_node_id))
    if not used:
        return nodes
    out = []
    for node in nodes:
        if node.id not in used:
            out.append(node)
            continue
        gpus, cpu, memory = used[node.id]
        out.append(
            dataclasses.replace(
                node,
                free_gpu_indices=tuple(i for i in node.free_gpu_indices if i not in gpus),
                free_cpu=max(0.0, node.free_cpu - cpu),
                free_memory_gb=max(0.0, node.free_memory_gb - memory),
                reserved_for=None,
            )
        )
    return tuple(out)


def _use(used: dict[str, list], node_id: str, gpus: tuple[int, ...], job: JobRequest | None, node: Node | None) -> None:
    entry = used.setdefault(node_id, [set(), 0.0, 0.0])
    entry[0].update(gpus)
    if job is not None:
        entry[1] += job.cpu_on(node.cpu, node.gpu_count) if node else job.cpu
        entry[2] += job.memory_on(node.memory_gb, node.gpu_count) if node else 0.0


def _order(job: JobRequest) -> tuple:
    return (job.priority != "time", job.submitted_at, job.id)
