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
    state = make_state(nodes=(node,), queue=(job,), running=(running,),
                       catalogue=(make_instance(startup_delay_s=600.0),))

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

    decisions = schedule(state, 0.0, config())

    assert of_type(decisions, Provision) == []
    [wait] = of_type(decisions, Wait)
    assert wait.until == 10 * HOUR


def test_cost_sensitive_job_pays_when_waiting_would_miss_the_deadline():
    node, running = _owned_busy_for(10)
    job = make_job(priority="cost", expected_duration_s=HOUR, deadline=5 * HOUR)
    state = make_state(nodes=(node,), queue=(job,), running=(running,),
                       catalogue=(make_instance(name="dear", price_per_hour=9.0),
                                  make_instance(name="cheap", price_per_hour=2.0)))

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
    state = make_state(nodes=(node,), queue=(long_by_estimate,), running=(running,),
                       catalogue=(make_instance(tflops=20.0),))

    [decision] = schedule(state, 0.0, config())

    assert isinstance(decision, Provision)
    short = make_job(priority="time", expected_duration_s=60.0)
    [decision] = schedule(make_state(nodes=(node,), queue=(short,), running=(running,),
                                     catalogue=(make_instance(tflops=20.0),)), 0.0, config())
    assert isinstance(decision, Wait)


def test_owned_node_free_now_is_used_before_paying():
    node = make_node(kind="local")
    job = make_job(priority="time")

    decisions = schedule(make_state(nodes=(node,), queue=(job,), catalogue=(make_instance(),)), 0.0, config())

    assert decisions == [Start(job.id, (node.id,), ((0,),))]


def test_time_sensitive_job_pays_for_a_much_faster_gpu_unless_told_to_pay_only_to_avoid_waiting():
    slow_owned = make_node(kind="local", tflops=5.0)
    job = make_job(priority="time", expected_duration_s=10 * HOUR)
    state = make_state(nodes=(slow_owned,), queue=(job,), catalogue=(make_instance(tflops=20.0),))

    [faster] = schedule(state, 0.0, config())
    [frugal] = schedule(state, 0.0, config(pay_only_to_avoid_waiting=True))

    assert isinstance(faster, Provision)
    assert frugal == Start(job.id, (slow_owned.id,), ((0,),))
