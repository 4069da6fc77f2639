"""On-demand lifecycle: releasing idle nodes and pulling long jobs back to owned nodes."""

import pytest

from services.placement.policy import PullBack, Release, RunningJob, Start, schedule
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


def test_idle_on_demand_node_is_released_after_the_idle_time():
    node = make_node(kind="on_demand", idle_since=0.0)
    state = make_state(nodes=(node,))

    assert schedule(state, 599.0, config(idle_release_s=600.0)) == []
    assert schedule(state, 600.0, config(idle_release_s=600.0)) == [Release(node.id)]


def test_idle_on_demand_node_is_reused_rather_than_released():
    node = make_node(kind="on_demand", idle_since=0.0)
    job = make_job(allowed="cloud")

    decisions = schedule(make_state(nodes=(node,), queue=(job,)), 5000.0, config())

    assert decisions == [Start(job.id, (node.id,), ((0,),))]


def _on_demand_running(*, remaining_h: float, allowed: str = "any", price: float = 4.0, priority: str = "cost"):
    node = make_node(kind="on_demand", gpu_count=1, free=0, price_per_hour=price)
    job = make_job(allowed=allowed, priority=priority)
    run = RunningJob(
        job=job, node_ids=(node.id,), gpu_indices=((0,),), started_at=0.0, expected_end_at=remaining_h * HOUR
    )
    return node, run


def test_pull_back_moves_the_job_with_the_largest_saving():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    short_node, short_run = _on_demand_running(remaining_h=0.5)
    long_node, long_run = _on_demand_running(remaining_h=5)
    cloud_node, cloud_only_run = _on_demand_running(remaining_h=10, allowed="cloud")
    state = make_state(nodes=(owned, short_node, long_node, cloud_node), running=(short_run, long_run, cloud_only_run))

    decisions = schedule(state, 0.0, config())

    assert of_type(decisions, PullBack) == [PullBack(long_run.job.id, long_node.id, owned.id, (0,))]


def test_pull_back_prefers_the_longer_job_when_one_owned_gpu_is_free():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    two_h_node, two_h_run = _on_demand_running(remaining_h=2)
    five_h_node, five_h_run = _on_demand_running(remaining_h=5)
    state = make_state(nodes=(owned, two_h_node, five_h_node), running=(two_h_run, five_h_run))

    [pull_back] = of_type(schedule(state, 0.0, config()), PullBack)

    assert pull_back.job_id == five_h_run.job.id


def test_pull_back_ignores_jobs_that_end_within_the_threshold():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    node, run = _on_demand_running(remaining_h=0.9)
    state = make_state(nodes=(owned, node), running=(run,))

    assert of_type(schedule(state, 0.0, config()), PullBack) == []
    assert len(of_type(schedule(state, 0.0, config(pullback_min_remaining_s=1800.0)), PullBack)) == 1


def test_pull_back_skips_moves_that_cost_more_than_they_save():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    node, run = _on_demand_running(remaining_h=2, price=1.0)
    state = make_state(nodes=(owned, node), running=(run,))

    assert of_type(schedule(state, 0.0, config(migration_fixed_cost=5.0)), PullBack) == []
    assert len(of_type(schedule(state, 0.0, config(migration_fixed_cost=0.0)), PullBack)) == 1


def test_pull_back_waits_for_the_queue_when_configured_to():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    busy_owned = make_node(kind="local", gpu_count=1, free=0, gpu_model="other")
    node, run = _on_demand_running(remaining_h=5)
    waiting = make_job(allowed="local", gpu_models=frozenset({"other"}))
    state = make_state(nodes=(owned, busy_owned, node), running=(run, busy(busy_owned, until=HOUR)), queue=(waiting,))

    assert of_type(schedule(state, 0.0, config(pullback_only_when_queue_empty=True)), PullBack) == []
    assert len(of_type(schedule(state, 0.0, config()), PullBack)) == 1


def test_time_sensitive_job_is_not_pulled_back_onto_a_much_slower_gpu():
    slow_owned = make_node(kind="local", gpu_count=1, tflops=2.0, price_per_hour=0.1)
    node, run = _on_demand_running(remaining_h=5, priority="time")

    decisions = schedule(make_state(nodes=(slow_owned, node), running=(run,)), 0.0, config())

    assert of_type(decisions, PullBack) == []


@pytest.mark.parametrize("policy", ["wait-local", "local-fifo"])
def test_owned_only_policies_never_pay(policy):
    owned = make_node(kind="local", free=0)
    job = make_job(priority="time")
    state = make_state(
        nodes=(owned,), queue=(job,), running=(busy(owned, until=100 * HOUR),), catalogue=(make_instance(),)
    )

    decisions = schedule(state, 0.0, config(policy=policy))

    assert [type(d).__name__ for d in decisions] == ["Wait"]


def test_burst_pays_at_once_for_the_cheapest_type_even_for_cost_sensitive_jobs():
    owned = make_node(kind="local", free=0)
    job = make_job(priority="cost", deadline=1e9)
    cheap, dear = make_instance(name="cheap", price_per_hour=1.0, tflops=1.0), make_instance(name="dear")
    state = make_state(nodes=(owned,), queue=(job,), running=(busy(owned, until=HOUR),), catalogue=(dear, cheap))

    [provision] = schedule(state, 0.0, config(policy="burst"))

    assert provision.instance_type == "cheap"


def test_provisioned_node_is_kept_for_its_job_while_it_boots():
    booting = make_node(kind="on_demand", gpu_count=1, ready_at=100.0, reserved_for="job-mine")
    mine = make_job(id="job-mine", allowed="cloud", submitted_at=5.0)
    other = make_job(allowed="cloud", submitted_at=0.0)
    state = make_state(nodes=(booting,), queue=(other, mine), catalogue=(make_instance(),))

    decisions = schedule(state, 50.0, config())

    assert [type(d).__name__ for d in decisions if getattr(d, "job_id", "") == mine.id] == ["Wait"]
    assert [type(d).__name__ for d in decisions if getattr(d, "job_id", "") == other.id] == ["Provision"]
    assert Start(mine.id, (booting.id,), ((0,),)) in schedule(state, 100.0, config())


def _moving_to(target_kind: str, *, moving: bool) -> tuple:
    """A job checkpointing on its node to move to a ready, free node kept for it (`reserved_for`), and another job
    queued that could run on that target now."""
    target = make_node(kind=target_kind, gpu_count=1, reserved_for="job-mover")
    source = make_node(kind="on_demand" if target_kind == "local" else "local", gpu_count=1, free=0)
    mover = RunningJob(make_job(id="job-mover", allowed="any"), (source.id,), ((0,),), 0.0, 50 * HOUR, moving=moving)
    other = make_job(allowed="any", priority="time", expected_duration_s=50 * HOUR)
    state = make_state(nodes=(target, source), queue=(other,), running=(mover,), catalogue=(make_instance(),))
    return state, target, other


@pytest.mark.parametrize("target_kind", ["local", "on_demand"])  # a pull-back's owned target, a make-room rental
def test_a_node_kept_for_a_job_that_checkpoints_towards_it_is_not_taken_by_another(target_kind):
    state, target, other = _moving_to(target_kind, moving=True)

    decisions = schedule(state, 0.0, config())

    assert not [d for d in of_type(decisions, Start) if target.id in d.node_ids]
    assert [d for d in decisions if getattr(d, "job_id", "") == other.id]  # it waits or rents instead
    assert Release(target.id) not in schedule(state, 10 * HOUR, config())


def test_a_node_kept_for_a_job_that_runs_elsewhere_and_is_not_moving_is_free_to_others():
    state, target, other = _moving_to("local", moving=False)

    assert Start(other.id, (target.id,), ((0,),)) in schedule(state, 0.0, config())


def test_a_job_already_moving_is_not_moved_again():
    owned = make_node(kind="local", gpu_count=1, price_per_hour=0.5)
    node, run = _on_demand_running(remaining_h=5)
    moving = RunningJob(run.job, run.node_ids, run.gpu_indices, run.started_at, run.expected_end_at, moving=True)

    assert of_type(schedule(make_state(nodes=(owned, node), running=(run,)), 0.0, config()), PullBack)
    assert of_type(schedule(make_state(nodes=(owned, node), running=(moving,)), 0.0, config()), PullBack) == []


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        schedule(make_state(), 0.0, config(policy="nope"))
