"""Which market a job rents in: whether it rents is weighed at on-demand prices, what it rents may be spot.

A spot offer is cheaper but revocable. Weighed directly against owned capacity at the exchange rate, its discount
makes a faster rented GPU beat a free, slower owned one for nearly every job, so owned GPUs stand idle while spot is
bought for speed (bench/sched/README.md, "Spot in the plan": 0.88x burst's dollars at 0.12-0.73x its completion). So
spot replaces on-demand rentals and never displaces owned capacity: the decision is made without spot offers, and
only when it is to rent are the rentals, spot included, weighed again (each spot one with its expected lost work).
"""

from services.placement.policy.choice import Option
from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import JobRequest
from services.placement.policy.options import burst_finish, pick


def is_spot(option: Option) -> bool:
    return option.instance is not None and option.instance.spot


def pick_market(
    options: list[Option], job: JobRequest, *, now: float, config: PolicyConfig, bar: float | None = None
) -> Option:
    """`pick`, with spot offers only among the rentals once the job is to rent (or when only spot could host it).
    Both picks weigh rented time against one bar, burst's finish on the whole list (or `bar`, from a caller that
    hands only some of the job's options)."""
    bar = burst_finish(options) if bar is None else bar
    plain = [o for o in options if not is_spot(o)]
    if len(plain) == len(options):
        return pick(options, job, now=now, config=config, bar=bar)
    if plain:
        first = pick(plain, job, now=now, config=config, bar=bar)
        if first.action != "provision":
            return first
    return pick([o for o in options if o.action == "provision"], job, now=now, config=config, bar=bar)
