"""Candidate placements for one job and the two rules that pick among them (time- and cost-sensitive)."""

import math

from shared.pricing import rank_price_per_hour
from services.placement.policy import why
from services.placement.policy.capacity import INF, CapacityIndex, NodeView
from services.placement.policy.choice import Option
from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import KINDS_FOR_ALLOWED, OWNED_KINDS, InstanceType, JobRequest
from services.placement.policy.spot import spot_duration

KIND_RANK = {"local": 0, "reserved": 1, "on_demand": 2}


def job_kinds(job: JobRequest, enabled: frozenset[str]) -> tuple[str, ...]:
    kinds = _JOB_KINDS.get((job.allowed, enabled))
    if kinds is None:
        kinds = _JOB_KINDS[(job.allowed, enabled)] = tuple(k for k in KINDS_FOR_ALLOWED[job.allowed] if k in enabled)
    return kinds


_JOB_KINDS: dict[tuple[str, frozenset[str]], tuple[str, ...]] = {}  # a few (allowed, enabled) pairs, asked per job


def share_per_hour(views: list[NodeView], gpus: int) -> float:
    """What the job's ranks cost per hour: each rank's share of its node's (amortised or on-demand) price, as billing
    charges it (`shared.pricing`)."""
    return sum(rank_price_per_hour(v.node.price_per_hour, gpus=gpus, node_gpus=v.node.gpu_count) for v in views)


def node_options(
    job: JobRequest, index: CapacityIndex, *, kinds: tuple[str, ...], config: PolicyConfig, wait: bool
) -> list[Option]:
    """Start-now options (and, if `wait`, earliest-availability options) on existing nodes, one per bucket."""
    now = index.now
    found: list[Option] = []
    for key in index.eligible(job, kinds):
        bucket = index.buckets[key]
        duration = job.duration_on(bucket.tflops, config.reference_tflops)
        paid = bucket.kind not in OWNED_KINDS
        picks = index.find_free(key, job, duration=duration, limit=config.max_nodes_scanned)
        if picks is not None:
            hourly = share_per_hour([v for v, _ in picks], job.gpu_count)
            if job.max_price_per_hour is None or hourly <= job.max_price_per_hour:
                found.append(
                    Option(
                        "start",
                        now,
                        now + duration,
                        hourly * duration / 3600,
                        paid,
                        KIND_RANK[bucket.kind],
                        duration,
                        picks=picks,
                    )
                )
        if not wait:
            continue
        soonest = index.earliest(key, job, limit=config.max_nodes_scanned)
        if soonest is None:
            continue
        at, views = soonest
        at = max(at, now + 1.0)
        hourly = share_per_hour(views, job.gpu_count)
        if job.max_price_per_hour is None or hourly <= job.max_price_per_hour:
            found.append(
                Option(
                    "wait",
                    at,
                    at + duration,
                    hourly * duration / 3600,
                    paid,
                    KIND_RANK[bucket.kind],
                    duration,
                    views=views,
                )
            )
    return found


def fits(job: JobRequest, it: InstanceType) -> bool:
    return (
        job.may_run_on(spot=it.spot)
        and it.gpus >= job.gpu_count
        and job.accepts_model(it.gpu_model)
        and it.gpu_memory_gb >= job.min_gpu_memory_gb
        and it.cpu >= job.cpu
        and it.memory_gb >= job.memory_on(it.memory_gb, it.gpus)
        and (job.max_price_per_hour is None or it.price_per_hour * job.node_count <= job.max_price_per_hour)
    )


def rent_cost(job: JobRequest, it: InstanceType, duration: float) -> float:
    """Dollars of renting `it` for the job: every node, billed from the request (start-up included)."""
    return it.price_per_hour * job.node_count * (it.startup_delay_s + duration) / 3600


def provision_options(
    job: JobRequest, catalogue: tuple[InstanceType, ...], *, now: float, config: PolicyConfig
) -> list[Option]:
    found = []
    for it in catalogue:
        if not fits(job, it):
            continue
        duration = job.duration_on(it.tflops, config.reference_tflops)
        if it.spot:
            duration = spot_duration(
                duration,
                checkpoint_interval_s=job.checkpoint_interval_s,
                interruptions_per_hour=it.interruptions_per_hour,
            )
        start = now + it.startup_delay_s
        cost = rent_cost(job, it, duration)
        grace = it.price_per_hour * job.node_count * config.idle_release_s / 3600
        found.append(
            Option(
                "provision",
                start,
                start + duration,
                cost,
                True,
                KIND_RANK["on_demand"],
                duration,
                instance=it,
                grace=grace,
            )
        )
    return found


def cheapest_instance(job: JobRequest, catalogue: tuple[InstanceType, ...]) -> InstanceType | None:
    """The lowest hourly price that fits, whatever its speed (the `burst` baseline's choice)."""
    fitting = [it for it in catalogue if fits(job, it)]
    return min(fitting, key=lambda it: (it.price_per_hour, -it.tflops)) if fitting else None


def time_value_per_s(job: JobRequest, config: PolicyConfig) -> float:
    """Dollars one second less to completion is worth for this job: the exchange rate times its GPUs."""
    rate = config.exchange_rate if job.exchange_rate is None else job.exchange_rate
    if job.priority == "cost":
        rate *= config.cost_sensitive_weight
    return rate * job.gpu_count * job.node_count / 3600


def backlog_value_per_s(job: JobRequest, config: PolicyConfig) -> float:
    """Dollars a second of an owned-only job's wait is charged to the job that makes it wait (the contention charge,
    make room): its own rate, a cost-sensitive job's at `cost_sensitive_backlog_weight` where that is set."""
    weight = config.cost_sensitive_backlog_weight
    if job.priority != "cost" or weight is None:
        return time_value_per_s(job, config)
    rate = config.exchange_rate if job.exchange_rate is None else job.exchange_rate
    return rate * weight * job.gpu_count * job.node_count / 3600


def risk_factor(job: JobRequest, config: PolicyConfig) -> float:
    """Rented time is priced at the duration's upper quantile when the duration is uncertain."""
    return math.exp(config.risk_z * job.duration_sigma)


def paid_dollars(option: Option, risk: float) -> float:
    """On-demand dollars an option adds: its cost at the duration's upper quantile (`risk_factor`) and, for a node
    rented for it, the idle grace before its release; owned capacity is already paid for."""
    return option.cost * risk + option.grace if option.paid else 0.0


def pick(
    options: list[Option], job: JobRequest, *, now: float, config: PolicyConfig, bar: float | None = None
) -> Option:
    """Least on-demand dollars + the wait it causes others + time to finish at the exchange rate; near-equal scores
    go to owned, then fewer dollars, then sooner.

    An option that waits on is weighed with the wait already done (`waited_s`, at the job's rate): a job waits for
    owned capacity only while its whole wait, done and still ahead, is worth less than renting, so a wait that keeps
    slipping ends in a rental as it would have on day one had the whole wait been known.
    Cost-sensitive jobs keep to their deadline when an option meets it (unless the rate is 0: never pay for time).
    A job that has waited what renting would have cost it waits no longer; rental types near-tied in dollars go to
    the cheaper; a rental finishing sooner than burst-like service would finish the job (`burst_finish`) gains
    nothing for the difference (unless the job's rate is above `rental_tie_max_rate`). That finish is the job's, not
    the list's: worked out from every option before any rule above drops one, or handed in (`bar`) by a caller that
    picks among some of the job's options (`market.pick_market`, the dry run).
    """
    if bar is None:
        bar = burst_finish(options)
    value = time_value_per_s(job, config)
    if job.deadline is not None and job.priority == "cost" and value > 0:
        options = [o for o in options if o.finish <= job.deadline] or options
    if job.priority == "cost":
        options = cheapest_owned(options, value=value, now=now, config=config)
    risk = risk_factor(job, config)  # computed once per job
    thrifty = value <= config.rental_tie_max_rate * job.gpu_count * job.node_count / 3600
    if thrifty:
        options = cheapest_rentals(options, config=config)
    options = waited_enough(options, job, now=now, value=value, risk=risk)
    if not thrifty:
        bar = -INF  # a project that pays this much for time buys all the speed it can
    done = value * waited_s(job, now)  # charged to every option that waits on: the wait is the job's whole wait
    scored = [
        (
            (paid_dollars(o, risk) + value * (max(o.finish, bar) - now) if o.paid else value * (o.finish - now))
            + o.charge
            + (done if o.action == "wait" else 0.0),
            o,
        )
        for o in options
    ]
    best = min(score for score, _ in scored)
    soonest = min(o.finish for o in options)
    tolerance = value * max(config.finish_tolerance_s, config.finish_tolerance_frac * (soonest - now))
    near = [o for score, o in scored if score <= best + tolerance + 1e-9]
    chosen = (
        near[0]
        if len(near) == 1
        else min(near, key=lambda o: (o.paid, paid_dollars(o, risk) + o.charge, o.finish, o.cost, o.kind_rank))
    )
    chosen.why = why.explain(chosen, options, job=job, now=now)
    return chosen


def burst_finish(options: list[Option]) -> float:
    """When burst-like service would finish the job: on the soonest free owned GPU now, else on an idle rented node
    now, else on the cheapest type to rent (lowest hourly price, as `burst` rents); -inf when it could do none. Rented
    time is worth the exchange rate only down to this finish: speed bought beyond it is dollars the benchmark's bar
    (burst's completion) does not ask for (bench/sched/README.md, round 5). Burst rents on-demand only: spot offers
    and spot nodes do not count. Pass the job's whole list of options: the bar is the job's, whatever is dropped."""
    options = [o for o in options if not on_spot(o)]
    starts = [o for o in options if o.action == "start"]
    if owned := [o.finish for o in starts if not o.paid]:
        return min(owned)
    if starts:
        return min(starts, key=lambda o: (o.cost, o.finish)).finish
    rentals = [o for o in options if o.action == "provision" and o.instance is not None]
    if rentals:
        return min(rentals, key=lambda o: (o.instance.price_per_hour, -o.instance.tflops)).finish  # type: ignore[union-attr]
    return -INF


def on_spot(option: Option) -> bool:
    """An offer of spot capacity: a spot instance type to rent, or a rented spot node."""
    if option.instance is not None:
        return option.instance.spot
    return any(view.node.spot for view, _ in option.picks) or any(view.node.spot for view in option.views)


def cheapest_rentals(options: list[Option], *, config: PolicyConfig) -> list[Option]:
    """Rental types within `rental_tie_frac` of the cheapest rental's dollars (idle grace included) are a tie: only
    the cheapest stays."""
    rentals = [o for o in options if o.action == "provision"]
    if len(rentals) < 2:
        return options
    cheapest = min(rentals, key=lambda o: (o.cost + o.grace, o.finish))
    tied = (cheapest.cost + cheapest.grace) * (1 + config.rental_tie_frac)
    return [o for o in options if o.action != "provision" or o is cheapest or o.cost + o.grace > tied]


def waited_enough(options: list[Option], job: JobRequest, *, now: float, value: float, risk: float) -> list[Option]:
    """Time already waited counts: once it is worth (at the job's rate) what renting would cost, the job waits no
    longer (it starts now, owned or rented)."""
    rentals = [paid_dollars(o, risk) for o in options if o.action == "provision"]
    if not rentals or value * waited_s(job, now) < min(rentals):
        return options
    return [o for o in options if o.action != "wait"]


def waited_s(job: JobRequest, now: float) -> float:
    """Seconds the job has spent waiting in the queue: since it last entered it (its submission as the platform
    recorded it, `JobSubmitted.create_time`, or placement's own clock when it queued it again), plus what it waited
    before earlier runs; the time it held GPUs is not waiting. Never a node's clock."""
    since = job.submitted_at if job.queued_at is None else job.queued_at
    return job.waited_before_s + max(0.0, now - since)


def cheapest_owned(options: list[Option], *, value: float, now: float, config: PolicyConfig) -> list[Option]:
    """A cost-sensitive job is billed its share of a local node's price too: among owned options keep those that
    cost least (amortised share + time at the job's rate, and with `PolicyConfig.owned_choice_charge` the wait it
    causes others, `Option.charge`); a reserved GPU is paid for whether used or not, so it costs nothing here
    (reserved before slow local); rented options are weighed against them as usual. Without the charge the fastest
    owned GPU is kept alone, and when owned-only jobs wait for it the job may rent while a slower owned GPU nobody
    waits for stands free (bench/sched/README.md, round 11)."""
    owned = [o for o in options if not o.paid]
    if len(owned) < 2:
        return options
    charged = config.owned_choice_charge
    scores = [
        (
            (0.0 if o.kind_rank == KIND_RANK["reserved"] else o.cost)
            + value * (o.finish - now)
            + (o.charge if charged else 0.0),
            o,
        )
        for o in owned
    ]
    best = min(score for score, _ in scores)
    tolerance = max(config.finish_tolerance_frac * best, 1e-9)
    keep = {id(o) for score, o in scores if score <= best + tolerance}
    return [o for o in options if o.paid or id(o) in keep]
