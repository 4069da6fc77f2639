"""One scheduling pass: the capacity index, the decisions made so far and the queue order."""

import heapq
from collections.abc import Iterator, Mapping

from services.placement.policy.capacity import CapacityIndex
from services.placement.policy.choice import Option
from services.placement.policy.config import PolicyConfig
from services.placement.policy.decisions import Decision, Provision, Release, Start, Wait
from services.placement.policy.models import ClusterState, JobRequest
from services.placement.policy.options import fits, job_kinds
from services.placement.policy.order import rank, usage_of

ALL_KINDS = frozenset({"local", "reserved", "on_demand"})
OWNED_ONLY = frozenset({"local", "reserved"})


class Pass:
    def __init__(self, state: ClusterState, *, now: float, config: PolicyConfig, kinds: frozenset[str]):
        self.state = state
        self.now = now
        self.config = config
        self.kinds = kinds
        self.index = CapacityIndex(state, now=now, kinds=kinds)
        self.decisions: list[Decision] = []
        self.waiting = 0
        self.reservations = 0
        self._rents: dict[tuple, bool] = {}  # a job's shape -> whether some instance type could host it

    def rents(self, job: JobRequest) -> bool:
        """Whether the job may rent and some type of the catalogue could host it: a job that asks for a GPU model (or
        memory, or GPUs) no rental has waits for owned capacity as an owned-only job does, and is counted as one (the
        contention charge, make room); its `allowed` alone would have it rent."""
        if "on_demand" not in job_kinds(job, self.kinds):
            return False
        key = (
            *job.needs,
            job.checkpoint_interval_s is not None,
        )
        found = self._rents.get(key)
        if found is None:
            found = self._rents[key] = any(fits(job, it) for it in self.state.catalogue)
        return found

    def apply(self, job: JobRequest, option: Option) -> None:
        if option.action == "start":
            end = self.now + option.duration
            for view, indices in option.picks:
                self.index.start(view, indices, end=end, job=job)
            node_ids = tuple(view.node.id for view, _ in option.picks)
            self.decisions.append(Start(job.id, node_ids, tuple(indices for _, indices in option.picks), option.why))
        elif option.action == "provision":
            if option.instance is None:
                raise ValueError("an option to provision names no instance type")
            self.decisions.append(Provision(option.instance.name, job.node_count, job.id))
        else:
            if self.reservations < self.config.reservation_depth:
                for view in option.views:
                    view.reserve(job.gpu_count, start=option.start_at, end=option.finish)
                self.reservations += 1
            ids = tuple(view.node.id for view in option.views)
            self.wait(
                job,
                f"waiting for {option.views[0].node.kind} node {', '.join(ids)}",
                until=option.start_at,
                node_ids=ids,
            )

    def wait(self, job: JobRequest, reason: str, *, until: float | None = None, node_ids: tuple[str, ...] = ()) -> None:
        self.decisions.append(Wait(job.id, reason, until, node_ids=node_ids))
        self.waiting += 1

    def release_idle(self) -> None:
        """Release unclaimed on-demand nodes that no job used this pass and that have idled past the grace period."""
        for node in self.index.nodes.values():
            if (
                node.kind == "on_demand"
                and node.idle_since is not None
                and self.now - node.idle_since >= self.config.idle_release_s
                and node.is_ready(self.now)
                and not (view := self.index.member(node.id)).touched
                and view.claimed_for is None
                and len(view.free) == node.gpu_count
            ):
                self.decisions.append(Release(node.id))


class FairQueue:
    """Time-sensitive before cost-sensitive, then jobs only local nodes may run (they have no other choice), then
    least recent usage per user, then submission time.

    With `PolicyConfig.owned_wait_order`, every job only local nodes may run comes first, whatever its priority, in
    the order of what its wait costs per GPU-second it will hold (Smith's rule: GPU-seconds over the dollars a second
    of its wait is worth, `backlog_value_per_s`): a short local-only job is not kept for days behind a long one, nor
    behind a time-sensitive job that could rent.

    Usage grows as this pass starts a user's jobs, so one user cannot take every free GPU in one pass.
    """

    def __init__(
        self,
        queue: tuple[JobRequest, ...],
        usage: Mapping[str, float],
        *,
        charge_cap_s: float,
        config: PolicyConfig | None = None,
    ):
        self.usage = {user: usage_of(usage, user) for user in usage}
        self.charge_cap_s = charge_cap_s
        self.config = config if config is not None and config.owned_wait_order else None
        self.heap = [self._key(job, seq) for seq, job in enumerate(queue)]
        heapq.heapify(self.heap)

    def _key(self, job: JobRequest, seq: int) -> tuple:
        return (rank(job, self.config), self.usage.get(job.user, 0.0), job.submitted_at, seq, job)

    def take(self, limit: int) -> Iterator[JobRequest]:
        taken = 0
        while self.heap and taken < limit:
            entry = heapq.heappop(self.heap)
            job = entry[-1]
            if entry[1] != self.usage.get(job.user, 0.0):
                heapq.heappush(self.heap, self._key(job, entry[3]))
                continue
            taken += 1
            yield job

    def charge(self, job: JobRequest, duration_s: float) -> None:
        hours = min(duration_s, self.charge_cap_s) / 3600 * job.gpu_count * job.node_count
        self.usage[job.user] = self.usage.get(job.user, 0.0) + hours


def fifo(queue: tuple[JobRequest, ...]) -> list[JobRequest]:
    return sorted(queue, key=lambda job: (job.submitted_at, job.id))
