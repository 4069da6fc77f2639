"""The policy's inputs from placement's records: jobs as the policy sees them, running work, GPU numbering."""
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.events import Assignment
from services.placement.adapter import DEFAULT_DURATION_S, JobView, cluster_state, reference_tflops
from services.placement.estimates import Estimates, fallback, query_for
from services.placement.fairshare import FairShare
from services.placement.fit import Usage
from services.placement.fleet import Fleet
from services.placement.policy import ClusterState, PolicyConfig
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

    def job_view(self, item) -> JobView:
        """A queue item (QueueItem) as the policy's job: the estimator's duration when it has one."""
        prefs, needs = item.spec.placement, item.needs
        estimate = self.estimates.cached(query_for(item.algorithm, needs, "")) or fallback(prefs.expected_duration_s)
        return JobView(job_id=item.job_id, user_name=item.user_name, submitted_at=item.submitted_at.timestamp(),
                       allowed=prefs.allowed, priority=prefs.priority, gpu_count=needs.gpu_count,
                       min_gpu_memory_gb=needs.min_gpu_memory_gb, gpu_models=frozenset(prefs.gpu_models),
                       node_count=needs.node_count, cpu=needs.cpu_count, memory_gb=needs.memory_gb,
                       expected_duration_s=prefs.expected_duration_s, predicted_duration_s=estimate.duration_s,
                       duration_sigma=estimate.sigma, exchange_rate=self.tradeoff.rate_for(item.project_id),
                       max_price_per_hour=prefs.max_price_per_hour,
                       checkpoint_interval_s=prefs.checkpoint_interval_s,
                       deadline=prefs.deadline.timestamp() if prefs.deadline else None)

    async def refresh(self, items: Iterable, now: float) -> None:
        """Ask the estimator about queued jobs it has not been asked about lately (bounded wait)."""
        await self.estimates.refresh([q for i in items if (q := query_for(i.algorithm, i.needs, ""))], now=now)

    def state(self, queued: list, placed: Iterable, usage: dict[str, Usage], now: float) -> tuple[ClusterState,
                                                                                                  PolicyConfig]:
        """One pass's snapshot and config (durations are read at the fleet's median GPU speed)."""
        config = dataclasses.replace(self.config, reference_tflops=reference_tflops(self.fleet.all_infos()))
        running = [(self.job_view(i), tuple(a.node_id for a in i.assignments),
                    tuple(self.positions(a) for a in i.assignments), self.started(i, now), self.ends_at(i, now))
                   for i in placed if i.needs.gpu_count > 0]
        state = cluster_state(nodes=self.fleet.views(), usage=usage, queue=[self.job_view(i) for i in queued],
                              running=running, catalogue=self.fleet.catalogue, usage_by_user=self.fair.decayed(now))
        return state, config

    def hours(self, item) -> float:
        return (item.spec.placement.expected_duration_s or DEFAULT_DURATION_S) / 3600

    def started(self, item, now: float) -> float:
        return item.started_at.timestamp() if item.started_at else now

    def ends_at(self, item, now: float) -> float:
        if item.job_id in self.expected_end:
            return self.expected_end[item.job_id]
        return self.started(item, now) + (item.spec.placement.expected_duration_s or DEFAULT_DURATION_S)

    def positions(self, assignment: Assignment) -> tuple[int, ...]:
        """GPU indices as positions in the node's GPU list (the policy's numbering)."""
        node = self.fleet.nodes.get(assignment.node_id)
        order = [g.index for g in sorted(node.info.gpus, key=lambda g: g.index)] if node and node.info else []
        return tuple(order.index(i) for i in assignment.gpu_indices if i in order)

    def gpu_ids(self, node_id: str, positions: tuple[int, ...]) -> tuple[int, ...]:
        info = self.fleet.nodes[node_id].info
        order = [g.index for g in sorted(info.gpus, key=lambda g: g.index)]
        return tuple(order[p] for p in positions)
