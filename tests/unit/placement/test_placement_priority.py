"""Time-sensitive and cost-sensitive rules: waiting for owned capacity against paying for on-demand."""

from services.placement.policy import Provision, Start, Wait, schedule
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


def _owned_busy_for(hours: float):
    node = make_node(kind="local", free=0)
    return node, busy(node, until=hours * HOUR)


def test_time_sensitive_job_provisions_on_demand_instead_of_waiting():
    node, running = _owned_busy_for(10)
    job = make_job(priority="time", expected_duration_s=HOUR)
    state = make_state(nodes=(node,), queue=(job,), running=(running,), catalogue=(make_instance(),))

    [provision] = schedule(state, 0.0, config())

    assert provision == Provision("cloud.1gpu", 1, job.id)


def test_time_sensitive_job_waits_when_owned_capacity_frees_sooner_than_a_node_boots():
    node, running = _owned_busy_for(0.01)
    job = make_job(priority="time", expected_duration_s=HOUR)
    state = make_state(
        nodes=(node,), queue=(job,), running=(running,), catalogue=(make_instance(startup_delay_s=600.0),)
    )

    [wait] = schedule(state, 0.0, config())

    assert isinstance(wait, Wait) and wait.until == 36.0


def test_time_sensitive_job_prefers_the_faster_finish_on_a_faster_gpu():
    slow = make_node(kind="local", tflops=5.0)
    fast = make_node(kind="local", tflops=20.0, price_per_hour=5.0)
    job = make_job(priority="time", expected_duration_s=HOUR)

    [start] = schedule(make_state(nodes=(slow, fast), queue=(job,)), 0.0, config())

    assert start.node_ids == (fast.id,)


def test_cost_sensitive_job_waits_when_cheaper_and_the_deadline_allows():
    node, running = _owned_busy_for(10)
    job = make_job(priority="cost", expected_duration_s=HOUR, deadline=24 * HOUR)
    state = make_state(nodes=(node,), queue=(job,), running=(running,), catalogue=(make_instance(),))

    decisions = schedule(state, 0.0, config(exchange_rate=1.0))  # 10 h at $0.25/h beats $3.1 of renting

    assert of_type(decisions, Provision) == []
    [wait] = of_type(decisions, Wait)
    assert wait.until == 10 * HOUR


def test_cost_sensitive_job_pays_when_waiting_would_miss_the_deadline():
    node, running = _owned_busy_for(10)
    job = make_job(priority="cost", expected_duration_s=HOUR, deadline=5 * HOUR)
    state = make_state(
        nodes=(node,),
        queue=(job,),
        running=(running,),
        catalogue=(make_instance(name="dear", price_per_hour=9.0), make_instance(name="cheap", price_per_hour=2.0)),
    )

    [provision] = schedule(state, 0.0, config())

    assert provision == Provision("cheap", 1, job.id)


def test_cost_sensitive_job_picks_the_cheaper_total_not_the_cheaper_hour():
    slow_cheap = make_instance(name="slow", tflops=2.5, price_per_hour=1.0)  # 4 h -> $4
    fast_dear = make_instance(name="fast", tflops=20.0, price_per_hour=2.0)  # 0.5 h -> $1
    job = make_job(allowed="cloud", priority="cost", expected_duration_s=HOUR)

    [provision] = schedule(make_state(queue=(job,), catalogue=(slow_cheap, fast_dear)), 0.0, config())

    assert provision.instance_type == "fast"


def test_predicted_duration_overrides_the_owners_expectation():
    node, running = _owned_busy_for(0.01)
    long_by_estimate = make_job(priority="time", expected_duration_s=60.0, predicted_duration_s=20 * HOUR)
    state = make_state(
        nodes=(node,), queue=(long_by_estimate,), running=(running,), catalogue=(make_instance(tflops=20.0),)
    )

    [decision] = schedule(state, 0.0, config(exchange_rate=1e6))

    assert isinstance(decision, Provision)
    short = make_job(priority="time", expected_duration_s=60.0)
    [decision] = schedule(
        make_state(nodes=(node,), queue=(short,), running=(running,), catalogue=(make_instance(tflops=20.0),)),
        0.0,
        config(exchange_rate=1e6),
    )
    assert isinstance(decision, Wait)


def test_owned_node_free_now_is_used_before_paying():
    node = make_node(kind="local")
    job = make_job(priority="time")

    decisions = schedule(make_state(nodes=(node,), queue=(job,), catalogue=(make_instance(),)), 0.0, config())

    assert decisions == [Start(job.id, (node.id,), ((0,),))]


def test_a_very_high_exchange_rate_is_earliest_finish_and_zero_never_rents_to_save_time():
    slow_owned = make_node(kind="local", tflops=5.0)
    job = make_job(priority="time", expected_duration_s=10 * HOUR)
    state = make_state(nodes=(slow_owned,), queue=(job,), catalogue=(make_instance(tflops=20.0),))

    [faster] = schedule(state, 0.0, config(exchange_rate=1e6))
    [frugal] = schedule(state, 0.0, config(exchange_rate=0.0))

    assert isinstance(faster, Provision)
    assert frugal == Start(job.id, (slow_owned.id,), ((0,),))


def test_exchange_rate_zero_waits_however_long_but_still_rents_what_nothing_owned_can_run():
    node, running = _owned_busy_for(1000)
    job = make_job(priority="time", expected_duration_s=HOUR)
    cloud_only = make_job(priority="time", expected_duration_s=HOUR, gpu_count=4)
    state = make_state(
        nodes=(node,),
        queue=(job, cloud_only),
        running=(running,),
        catalogue=(make_instance(), make_instance(name="cloud.4gpu", gpus=4, price_per_hour=12.0)),
    )

    decisions = schedule(state, 0.0, config(exchange_rate=0.0))

    assert of_type(decisions, Provision) == [Provision("cloud.4gpu", 1, cloud_only.id)]
    assert [w.job_id for w in of_type(decisions, Wait)] == [job.id]


def test_the_rate_decides_between_waiting_and_renting():
    node, running = _owned_busy_for(2)  # rent: $3 * (1 h + 2 min) = $3.1; waiting costs 2 h at the rate
    job = make_job(priority="time", expected_duration_s=HOUR)
    state = make_state(nodes=(node,), queue=(job,), running=(running,), catalogue=(make_instance(),))

    [cheap] = schedule(state, 0.0, config(exchange_rate=1.0))
    [dear] = schedule(state, 0.0, config(exchange_rate=2.0))

    assert isinstance(cheap, Wait) and isinstance(dear, Provision)


def test_a_projects_own_rate_overrides_the_clusters():
    node, running = _owned_busy_for(2)
    hurried = make_job(priority="time", expected_duration_s=HOUR, exchange_rate=5.0)
    state = make_state(nodes=(node,), queue=(hurried,), running=(running,), catalogue=(make_instance(),))

    [decision] = schedule(state, 0.0, config(exchange_rate=0.0))

    assert isinstance(decision, Provision)


def test_an_uncertain_duration_is_not_sent_to_a_rental_on_a_guess():
    node, running = _owned_busy_for(2)
    known = make_job(priority="time", expected_duration_s=HOUR)
    guessed = make_job(priority="time", expected_duration_s=HOUR, duration_sigma=1.0)
    catalogue = (make_instance(),)

    [sure] = schedule(
        make_state(nodes=(node,), queue=(known,), running=(running,), catalogue=catalogue),
        0.0,
        config(exchange_rate=2.0),
    )
    [unsure] = schedule(
        make_state(nodes=(node,), queue=(guessed,), running=(running,), catalogue=catalogue),
        0.0,
        config(exchange_rate=2.0),
    )

    assert isinstance(sure, Provision) and isinstance(unsure, Wait)


def test_burst_after_rents_only_once_the_job_has_waited_long_enough():
    node, running = _owned_busy_for(10)
    job = make_job(priority="time", expected_duration_s=HOUR, submitted_at=0.0)
    state = make_state(nodes=(node,), queue=(job,), running=(running,), catalogue=(make_instance(),))

    [early] = schedule(state, 600.0, config(policy="burst-after", burst_after_s=1800.0))
    [late] = schedule(state, 1800.0, config(policy="burst-after", burst_after_s=1800.0))

    assert isinstance(early, Wait) and early.retry_at == 1800.0
    assert late == Provision("cloud.1gpu", 1, job.id)


def test_a_cost_sensitive_job_takes_the_owned_gpu_that_bills_it_least_and_a_time_sensitive_one_the_fastest():
    cheap = make_node(kind="local", gpu_count=1, tflops=10.0, price_per_hour=0.25)
    fast = make_node(kind="local", gpu_count=1, tflops=20.0, price_per_hour=3.6)
    state = lambda job: make_state(nodes=(cheap, fast), queue=(job,), catalogue=())  # noqa: E731

    [cost] = schedule(state(make_job(priority="cost", expected_duration_s=HOUR)), 0.0, config())
    [time] = schedule(state(make_job(priority="time", expected_duration_s=HOUR)), 0.0, config())

    assert cost.node_ids == (cheap.id,)  # $0.25 + 1 h of its time against $1.80 + half an hour
    assert time.node_ids == (fast.id,)


def test_a_start_records_why_its_nodes_were_chosen_over_the_others():
    """Issue 36: the first jobs went to the $1.60/h reserved A100 while a $0.35/h local node stood idle, with
    nothing saying why; the decision now says which options it weighed and by which rule."""
    slow = make_node(kind="local", tflops=5.0, price_per_hour=0.35)
    fast = make_node(kind="reserved", tflops=20.0, price_per_hour=1.6)
    job = make_job(priority="time", expected_duration_s=HOUR)

    [start] = schedule(make_state(nodes=(slow, fast), queue=(job,)), 0.0, config())

    assert start.node_ids == (fast.id,)
    assert start.why.startswith(f"{fast.id} (reserved) ends in ") and "time priority: the soonest finish" in start.why
    assert f"also weighed: {slow.id} (local) ends in " in start.why
