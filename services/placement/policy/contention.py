"""The wait a placement causes: jobs that may only run on owned capacity and queue behind a job that could rent.

A free owned GPU costs a job that could rent nothing at the exchange rate, so without this such a job takes the last
free local GPUs and the jobs that can run nowhere else wait behind it. Here a job that may rent is charged, for an
owned option, the time it adds to that backlog at the backlog's own exchange rates: holding g GPUs for d seconds on
a kind of N GPUs delays every job of the backlog by about g * d / N (pure; one `Backlog` per pass).
"""

from dataclasses import dataclass, field

from services.placement.policy.choice import Option
from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import OWNED_KINDS, ClusterState, JobRequest


@dataclass(slots=True)
class Backlog:
    """Per owned kind: GPUs of the kind, GPUs free now, and the owned-only jobs still queued (GPUs, $ per second)."""

    gpus: dict[str, int] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    value: dict[str, float] = field(default_factory=dict)

    def charge(self, job: JobRequest, option: Option) -> float:
        """Dollars of waiting this option of a job that may rent puts on the owned-only backlog of its kind."""
        kind = option_kind(option)
        if kind not in OWNED_KINDS or not self.value.get(kind):
            return 0.0
        gpus = job.gpu_count * job.node_count
        if self.demand[kind] + gpus <= self.free.get(kind, 0):
            return 0.0  # room for the backlog and this job: nobody waits for it
        return self.value[kind] * gpus * option.duration / max(self.gpus[kind], 1)

    def started(self, job: JobRequest, option: Option, *, owned_only: bool, value_per_s: float) -> None:
        """Account for a start decided this pass (the GPUs it takes; an owned-only job leaves the backlog)."""
        kind = option_kind(option)
        if kind not in OWNED_KINDS:
            return
        gpus = job.gpu_count * job.node_count
        self.free[kind] = self.free.get(kind, 0) - gpus
        if owned_only and kind in self.demand:
            self.demand[kind] -= gpus
            self.value[kind] = max(0.0, self.value[kind] - value_per_s)


def backlog(
    state: ClusterState,
    *,
    now: float,
    config: PolicyConfig,
    owned_only: dict[str, tuple[str, ...]],
    value_per_s: dict[str, float],
) -> Backlog:
    """The backlog at the start of a pass: `owned_only` maps each queued job that may not rent to its owned kinds."""
    out = Backlog()
    for node in state.nodes:
        if node.kind in OWNED_KINDS:
            out.gpus[node.kind] = out.gpus.get(node.kind, 0) + node.gpu_count
            if node.is_ready(now) and node.reserved_for is None:
                out.free[node.kind] = out.free.get(node.kind, 0) + node.free_gpus
    for job in state.queue:
        for kind in owned_only.get(job.id, ()):
            out.demand[kind] = out.demand.get(kind, 0) + job.gpu_count * job.node_count
            out.value[kind] = out.value.get(kind, 0.0) + value_per_s[job.id]
    return out


def option_kind(option: Option) -> str:
    if option.action == "provision":
        return "on_demand"
    views = [view for view, _ in option.picks] if option.picks else option.views
    return views[0].node.kind if views else "on_demand"
