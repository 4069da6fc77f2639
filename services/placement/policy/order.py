"""The order the queue is served in, one rule for the fair-share queue (`passes.FairQueue`), the contention charge
and make room: each plans the local-only backlog in the order the queue will serve it."""

import math
from collections.abc import Mapping

from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import JobRequest
from services.placement.policy.options import backlog_value_per_s


def rank(job: JobRequest, config: PolicyConfig | None) -> tuple:
    """Time-sensitive before cost-sensitive, jobs only local nodes may run first within each (round 9's); with
    `PolicyConfig.owned_wait_order`, every local-only job first, whatever its priority, by its expected GPU-seconds
    over the dollars a second of its wait is worth (Smith's rule), then the others as before."""
    if config is None or not config.owned_wait_order or job.allowed != "local":
        return (job.priority != "time", job.allowed != "local", 0.0)
    value = backlog_value_per_s(job, config)
    base = job.duration_on(config.reference_tflops, config.reference_tflops)
    area = base * job.gpu_count * job.node_count
    return (False, False, area / value if value > 0 else math.inf)


def usage_of(usage: Mapping[str, float], user: str) -> float:
    """A user's recent GPU-hours as fair share reads them (none, or not a number: 0)."""
    hours = usage.get(user, 0.0)
    return hours if hours == hours else 0.0


def backlog_order(job: JobRequest, config: PolicyConfig, *, usage: Mapping[str, float]) -> tuple:
    """Where an owned-only job stands in the queue at the start of a pass, as the contention charge and make room plan
    it: with `PolicyConfig.owned_wait_order`, the queue's own order (`rank`, fair share, submission); without,
    round 9's plan (time-sensitive first, then submission)."""
    if not config.owned_wait_order:
        return (job.priority != "time", job.submitted_at, job.id)
    return (rank(job, config), usage_of(usage, job.user), job.submitted_at, job.id)
