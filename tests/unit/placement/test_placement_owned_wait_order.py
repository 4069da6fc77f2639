"""`PolicyConfig.owned_wait_order`: jobs only local nodes may run queue first, by GPU-seconds per dollar of wait."""

import pytest

from services.placement.policy import Provision, Start, schedule
from services.placement.policy.capacity import CapacityIndex
from services.placement.policy.choice import Option
from services.placement.policy.contention import backlog
from services.placement.policy.passes import ALL_KINDS
from tests.unit.placement.placement_factories import (
    busy,
    config,
    make_instance,
    make_job,
    make_node,
    make_state,
    of_type,
)

HOUR = 3600.0


def _started(state, now: float = 10.0, **overrides) -> list[str]:
    return [d.job_id for d in of_type(schedule(state, now, config(**overrides)), Start)]


def test_a_short_local_only_cost_job_is_not_kept_behind_a_long_local_only_time_job():
    node = make_node(gpu_count=1)
    long_time = make_job(priority="time", allowed="local", expected_duration_s=400 * HOUR, submitted_at=0.0)
    short_cost = make_job(priority="cost", allowed="local", expected_duration_s=0.1 * HOUR, submitted_at=1.0)
    state = make_state(nodes=(node,), queue=(long_time, short_cost))

    assert _started(state, owned_wait_order=True) == [short_cost.id]
    assert _started(state, owned_wait_order=False) == [long_time.id]  # round 9's order: time before cost


def test_a_local_only_job_takes_the_free_local_gpu_before_a_time_job_that_could_rent():
    node = make_node(gpu_count=1)
    could_rent = make_job(priority="time", allowed="any", expected_duration_s=10 * HOUR, submitted_at=0.0)
    local_only = make_job(priority="cost", allowed="local", expected_duration_s=10 * HOUR, submitted_at=1.0)
    state = make_state(nodes=(node,), queue=(could_rent, local_only), catalogue=(make_instance(price_per_hour=3.0),))

    on = schedule(state, 10.0, config(owned_wait_order=True))
    off = schedule(state, 10.0, config(owned_wait_order=False))

    assert [d.job_id for d in of_type(on, Start)] == [local_only.id]
    assert of_type(on, Provision) == []  # renting 10 h ($30) costs more than its wait ($20 at the rate)
    assert [d.job_id for d in of_type(off, Start)] == [could_rent.id]  # the charge ($20) is less than the rental


def test_among_local_only_jobs_of_one_length_the_one_whose_wait_costs_more_goes_first():
    node = make_node(gpu_count=1)
    cheap = make_job(allowed="local", priority="time", exchange_rate=1.0, submitted_at=0.0)
    dear = make_job(allowed="local", priority="time", exchange_rate=8.0, submitted_at=1.0)
    state = make_state(nodes=(node,), queue=(cheap, dear))

    assert _started(state, owned_wait_order=True) == [dear.id]
    assert _started(state, owned_wait_order=False) == [cheap.id]  # submission order


def test_a_local_only_job_whose_wait_is_worth_nothing_goes_last_among_them():
    node = make_node(gpu_count=1)
    free_time = make_job(allowed="local", exchange_rate=0.0, expected_duration_s=60.0, submitted_at=0.0)
    long_ = make_job(allowed="local", expected_duration_s=100 * HOUR, submitted_at=1.0)
    state = make_state(nodes=(node,), queue=(free_time, long_))

    assert _started(state, owned_wait_order=True) == [long_.id]


def test_jobs_that_may_rent_keep_their_order_behind_the_local_only_ones():
    node = make_node(gpu_count=2)
    cost_any = make_job(priority="cost", allowed="any", submitted_at=0.0)
    time_any = make_job(priority="time", allowed="any", submitted_at=1.0)
    local_only = make_job(priority="cost", allowed="local", expected_duration_s=50 * HOUR, submitted_at=2.0)
    state = make_state(nodes=(node,), queue=(cost_any, time_any, local_only))

    assert _started(state, owned_wait_order=True) == [local_only.id, time_any.id]
    assert _started(state, owned_wait_order=False) == [time_any.id, local_only.id]


@pytest.mark.parametrize(("owned_wait_order", "charged"), [(False, 401.0), (True, 6.0)])
def test_the_contention_charge_plans_the_local_only_queue_in_the_order_the_queue_serves(owned_wait_order, charged):
    """Two local GPUs, both busy, back at 1 h and 500 h; queued local-only: L (time, 100 h, $2/h) before S (cost, 1 h,
    $8/h at the full rate). Served time first (off), L starts at 1 h and S at 101 h; served by GPU-seconds over the
    wait's worth (on), S at 1 h and L at 2 h. A job that holds one of the two GPUs for 100 h is charged half of each
    wait up to 100 h: off ($2 x 1 + $8 x 100) / 2, on ($8 x 1 + $2 x 2) / 2."""
    a = make_node(kind="local", gpu_count=1, free=0)
    b = make_node(kind="local", gpu_count=1, free=0)
    long_time = make_job(priority="time", allowed="local", expected_duration_s=100 * HOUR, submitted_at=0.0)
    short_cost = make_job(
        priority="cost", allowed="local", expected_duration_s=HOUR, exchange_rate=8.0, submitted_at=1.0
    )
    could_rent = make_job(priority="time", allowed="any", expected_duration_s=100 * HOUR)
    state = make_state(
        nodes=(a, b),
        running=(busy(a, until=HOUR), busy(b, until=500 * HOUR)),
        queue=(long_time, short_cost, could_rent),
    )
    waits = backlog(
        state,
        now=0.0,
        config=config(owned_wait_order=owned_wait_order),
        owned_only={long_time.id: ("local",), short_cost.id: ("local",)},
        value_per_s={long_time.id: 2.0 / HOUR, short_cost.id: 8.0 / HOUR},
    )
    view = CapacityIndex(state, now=0.0, kinds=ALL_KINDS).member(a.id)
    option = Option("wait", HOUR, 101 * HOUR, 0.0, False, 0, 100 * HOUR, views=[view])

    assert waits.charge(could_rent, option) == pytest.approx(charged)
