"""The policy's inputs from placement's records: jobs as the policy sees them, running work, capacity given out,
each queued job's constraint (nodes kept for it, nodes it moves away from, its pool), GPU numbering."""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from shared.clock import utcnow
from shared.events import Assignment
from shared.jobs import Parameter, Resource, Spec, task_cpus
from shared.nodes import NodeInfo
from services.placement.adapter import DEFAULT_DURATION_S, Usage
from services.placement.estimates import Estimate, Estimates, fallback, query_for
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.policy import ClusterState, JobRequest, PolicyConfig, RunningJob
from services.placement.policy.engine import Constraint
from services.placement.queue import QueueItem
from services.placement.tradeoff import Tradeoff


@dataclass
class PolicyInputs:
    """Estimates, the exchange rate per project and fair share: what turns a queue item into a policy job."""

    fleet: Fleet
    config: PolicyConfig = field(default_factory=PolicyConfig)
    fair: FairShare = field(default_factory=FairShare)
    tradeoff: Tradeoff = field(default_factory=Tradeoff)
    estimates: Estimates = field(default_factory=lambda: Estimates(broker=None))
    expected_end: dict[str, float] = field(default_factory=dict)  # job -> unix time, from the estimator's ETA

    def job_request(self, item: QueueItem) -> JobRequest:
        """A queue item (QueueItem) as the policy's job: the estimator's duration when it has one."""
        estimate = self.estimates.cached(query_for(item.algorithm.parameters, item.needs, ""))
        job = self._request(
            item.spec,
            item.needs,
            job_id=item.job_id,
            user_name=item.user_name,
            project_id=item.project_id,
            submitted_at=item.submitted_at.timestamp(),
            estimate=estimate or fallback(item.spec.placement.expected_duration_s),
        )
        if item.queued_at is not None:
            job = dataclasses.replace(job, queued_at=item.queued_at.timestamp(), waited_before_s=item.waited_s)
        return job

    def spec_request(
        self, spec: Spec, *, project_id: str, user_name: str, now: float, parameters: Sequence[Parameter] = ()
    ) -> tuple[JobRequest, str]:
        """A job not submitted yet (a dry run) as the policy's job, and where its duration comes from: the
        estimator's answer when it has one (`refresh_one` asked it), as for a queued job."""
        estimate = self.estimates.cached(query_for(parameters, spec.resource, ""), now=now) or fallback(
            spec.placement.expected_duration_s
        )
        job = self._request(
            spec,
            spec.resource,
            job_id="dry-run",
            user_name=user_name,
            project_id=project_id,
            submitted_at=now,
            estimate=estimate,
        )
        return job, estimate.source

    def _request(
        self,
        spec: Spec,
        needs: Resource,
        *,
        job_id: str,
        user_name: str,
        project_id: str,
        submitted_at: float,
        estimate: Estimate,
    ) -> JobRequest:
        prefs = spec.placement
        return JobRequest(
            id=job_id,
            user=user_name,
            submitted_at=submitted_at,
            expected_duration_s=prefs.expected_duration_s or DEFAULT_DURATION_S,
            allowed=prefs.allowed,
            priority=prefs.priority,
            gpu_count=needs.gpu_count,
            min_gpu_memory_gb=needs.min_gpu_memory_gb,
            gpu_models=frozenset(prefs.gpu_models),
            node_count=needs.node_count,
            cpu=needs.cpu_count,
            cpus_at_gpu_share=True,  # as the agent gives it (shared.jobs.task_cpus)
            memory_gb=needs.memory_gb,
            predicted_duration_s=estimate.duration_s,
            duration_sigma=estimate.sigma,
            exchange_rate=self.tradeoff.rate_for(project_id),
            max_price_per_hour=prefs.max_price_per_hour,
            checkpoint_interval_s=prefs.checkpoint_interval_s,
            deadline=prefs.deadline.timestamp() if prefs.deadline else None,
        )

    async def refresh_one(self, spec: Spec, parameters: Sequence[Parameter], now: float) -> None:
        """Ask the estimator about a job not submitted yet (a dry run), unless asked lately (bounded wait)."""
        if query := query_for(parameters, spec.resource, ""):
            await self.estimates.refresh([query], now=now)

    async def refresh(self, items: Iterable, now: float) -> None:
        """Ask the estimator about queued jobs it has not been asked about lately (bounded wait)."""
        queries = [q for i in items if (q := query_for(i.algorithm.parameters, i.needs, ""))]
        await self.estimates.refresh(queries, now=now)

    def config_now(self) -> PolicyConfig:
        """The config with durations read at the fleet's median GPU speed."""
        return dataclasses.replace(self.config, reference_tflops=self.fleet.reference_tflops())

    def state(self, queued: Iterable, placed: Iterable, now: float) -> ClusterState:
        """One pass's snapshot: the fleet with what placed jobs hold, the queue, running GPU work, fair share."""
        placed = list(placed)
        nodes = self.fleet.policy_nodes(usage(placed, self.fleet.registration))
        known = {n.id for n in nodes}
        running = tuple(
            RunningJob(
                job=self.job_request(i),
                node_ids=ids,
                gpu_indices=tuple(self.positions(a) for a in i.assignments),
                started_at=self.started(i, now),
                expected_end_at=self.ends_at(i, now),
                moving=i.moving,
            )
            for i in placed
            if i.needs.gpu_count > 0 and set(ids := tuple(a.node_id for a in i.assignments)) <= known
        )
        return ClusterState(
            nodes=nodes,
            queue=tuple(self.job_request(i) for i in queued),
            running=running,
            catalogue=self.fleet.rentable(now),
            usage_by_user=self.fair.decayed(now),
        )

    def constraints(self, queued: Iterable) -> dict[str, Constraint]:
        """Queued jobs that may go only to nodes kept for them, must avoid nodes they left, or keep to a pool."""
        mine: dict[str, set[str]] = {}
        for node in self.fleet.live():  # a reservation on a lost or released node holds nothing
            if node.reserved_for:
                mine.setdefault(node.reserved_for, set()).add(node.node_id)
        found = {}
        now = utcnow()
        for item in queued:
            lapsed = item.exclude_until is not None and now >= item.exclude_until
            constraint = Constraint(
                only=frozenset(mine.get(item.job_id, ())),
                exclude=frozenset(() if lapsed else item.exclude),
                pool=item.needs.pool_id,
            )
            if constraint != Constraint():
                found[item.job_id] = constraint
        return found

    def hours(self, item: QueueItem) -> float:
        return (item.spec.placement.expected_duration_s or DEFAULT_DURATION_S) / 3600

    def started(self, item: QueueItem, now: float) -> float:
        return item.started_at.timestamp() if item.started_at else now

    def ends_at(self, item: QueueItem, now: float) -> float:
        if item.job_id in self.expected_end:
            return self.expected_end[item.job_id]
        return self.started(item, now) + (item.spec.placement.expected_duration_s or DEFAULT_DURATION_S)

    def positions(self, assignment: Assignment) -> tuple[int, ...]:
        """GPU indices as positions in the node's GPU list (the policy's numbering)."""
        node = self.fleet.nodes.get(assignment.node_id)
        order = [g.index for g in sorted(node.info.gpus, key=lambda g: g.index)] if node and node.info else []
        return tuple(order.index(i) for i in assignment.gpu_indices if i in order)

    def gpu_ids(self, node_id: str, positions: tuple[int, ...]) -> tuple[int, ...]:
        info = self.fleet.info(node_id)
        order = [g.index for g in sorted(info.gpus, key=lambda g: g.index)]
        return tuple(order[p] for p in positions)


def usage(placed: Iterable, nodes: Callable[[str], NodeInfo | None] = lambda _: None) -> dict[str, Usage]:
    """Capacity placed jobs hold, per node: each rank's CPUs as its node's agent gives them (at least its GPUs'
    share of the node's, `shared.jobs.task_cpus`; what the job asked where `nodes` does not know the node)."""
    found: dict[str, Usage] = {}
    for item in placed:
        for a in item.assignments:
            used = found.setdefault(a.node_id, Usage())
            used.gpus.update(a.gpu_indices)
            info = nodes(a.node_id)
            asked = item.needs.cpu_count
            used.cpu += (
                asked
                if info is None
                else task_cpus(asked, gpus=len(a.gpu_indices), node_cpus=info.cpu_count, node_gpus=len(info.gpus))
            )
            used.memory_gb += item.given_memory_gb
    return found
