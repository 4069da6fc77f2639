"""Whether a job may run on spot capacity, and what a spot offer really costs it (pure; used by the policy).

A spot node can be taken back with two minutes' notice. A job that checkpoints loses at most one checkpoint
interval plus a restart each time; one that does not loses everything it did. So spot is offered only to jobs
that checkpoint, and its price is weighed with the expected time lost to interruptions."""

from dataclasses import dataclass

DEFAULT_INTERRUPTIONS_PER_HOUR = 0.05  # AWS's spot advisor's "<5%" band, per month, is far lower; be wary
RESTART_S = 300.0  # a new node booted and the job restored from its checkpoint


@dataclass(frozen=True)
class SpotOffer:
    price_per_hour: float
    on_demand_price_per_hour: float
    interruptions_per_hour: float = DEFAULT_INTERRUPTIONS_PER_HOUR


def expected_cost(
    offer: SpotOffer, *, duration_s: float, checkpoint_interval_s: float, restart_s: float = RESTART_S
) -> tuple[float, float]:
    """(expected dollars, expected seconds) to finish `duration_s` of work on spot: each interruption costs half a
    checkpoint interval of redone work plus a restart, all of it billed."""
    hours = duration_s / 3600
    interruptions = offer.interruptions_per_hour * hours
    lost_s = interruptions * (checkpoint_interval_s / 2 + restart_s)
    total_s = duration_s + lost_s
    return offer.price_per_hour * total_s / 3600, total_s


def choose_spot(
    offer: SpotOffer,
    *,
    checkpoints: bool,
    duration_s: float,
    checkpoint_interval_s: float,
    deadline_slack_s: float | None = None,
) -> bool:
    """Spot for a job that checkpoints, when it is cheaper in expectation than on-demand and the time it may lose
    fits the job's deadline slack (None: no deadline)."""
    if not checkpoints or duration_s <= 0:
        return False
    cost, total_s = expected_cost(offer, duration_s=duration_s, checkpoint_interval_s=checkpoint_interval_s)
    if deadline_slack_s is not None and total_s - duration_s > deadline_slack_s:
        return False
    return cost < offer.on_demand_price_per_hour * duration_s / 3600


def spot_duration(
    duration_s: float, *, checkpoint_interval_s: float | None, interruptions_per_hour: float | None = None
) -> float:
    """The expected time on spot to finish `duration_s` of work (the policy prices and plans a spot offer with it);
    a job that declares no checkpoint interval is never offered spot, so it has no spot duration."""
    if checkpoint_interval_s is None:
        raise ValueError("spot is only for jobs that declare a checkpoint interval")
    hazard = DEFAULT_INTERRUPTIONS_PER_HOUR if interruptions_per_hour is None else interruptions_per_hour
    offer = SpotOffer(price_per_hour=0.0, on_demand_price_per_hour=0.0, interruptions_per_hour=hazard)
    return expected_cost(offer, duration_s=duration_s, checkpoint_interval_s=checkpoint_interval_s)[1]
