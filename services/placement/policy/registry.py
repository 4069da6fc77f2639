"""The one entry point: `schedule(state, now, config)` runs the policy named in the config."""

from collections.abc import Callable

from services.placement.policy.baselines import schedule_burst, schedule_burst_after, schedule_local_fifo
from services.placement.policy.config import PolicyConfig
from services.placement.policy.decisions import Decision
from services.placement.policy.models import ClusterState
from services.placement.policy.trainmaster import schedule_trainmaster, schedule_wait_local

PolicyFn = Callable[[ClusterState, float, PolicyConfig], list[Decision]]

POLICIES: dict[str, PolicyFn] = {
    "trainmaster": schedule_trainmaster,
    "local-fifo": schedule_local_fifo,
    "burst": schedule_burst,
    "burst-after": schedule_burst_after,
    "wait-local": schedule_wait_local,
}


def schedule(state: ClusterState, now: float, config: PolicyConfig | None = None) -> list[Decision]:
    """Decisions for this instant; pure: same inputs, same decisions, no I/O."""
    config = config or PolicyConfig()
    try:
        policy = POLICIES[config.policy]
    except KeyError:
        raise ValueError(f"unknown policy {config.policy!r}; choose one of {sorted(POLICIES)}") from None
    return policy(state, now, config)
