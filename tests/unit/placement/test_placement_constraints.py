"""Constraint rules: where a job may run at all."""

import pytest

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


def test_local_only_job_waits_for_local_while_cloud_is_idle():
    local = make_node(kind="local", free=0)
    reserved = make_node(kind="reserved")
    job = make_job(allowed="local", priority="time")
    state = make_state(
        nodes=(local, reserved), queue=(job,), running=(busy(local, until=5000.0),), catalogue=(make_instance(),)
    )

    decisions = schedule(state, 0.0, config())

    assert of_type(decisions, Start) == [] and of_type(decisions, Provision) == []
    [wait] = of_type(decisions, Wait)
    assert wait.job_id == job.id and wait.until == 5000.0


def test_cloud_only_job_takes_reserved_before_provisioning_on_demand():
    local = make_node(kind="local")
    reserved = make_node(kind="reserved", price_per_hour=2.0)
    job = make_job(allowed="cloud", priority="time")
    state = make_state(nodes=(local, reserved), queue=(job,), catalogue=(make_instance(price_per_hour=1.0),))

    [start] = schedule(state, 0.0, config())

    assert start == Start(job.id, (reserved.id,), ((0,),))


def test_reserved_wins_over_idle_on_demand_at_equal_finish():
    reserved = make_node(kind="reserved", price_per_hour=9.0)
    on_demand = make_node(kind="on_demand", price_per_hour=1.0, idle_since=0.0)
    job = make_job(allowed="cloud", priority="time")

    [start] = schedule(make_state(nodes=(on_demand, reserved), queue=(job,)), 0.0, config())

    assert start.node_ids == (reserved.id,)


def test_min_gpu_memory_is_respected():
    small = make_node(gpu_memory_gb=16.0, tflops=40.0)
    large = make_node(gpu_memory_gb=40.0, tflops=10.0)
    job = make_job(min_gpu_memory_gb=24.0)

    [start] = schedule(make_state(nodes=(small, large), queue=(job,)), 0.0, config())
    assert start.node_ids == (large.id,)

    [wait] = schedule(make_state(nodes=(small,), queue=(job,)), 0.0, config())
    assert isinstance(wait, Wait) and wait.until is None


def test_acceptable_models_and_max_price_filter_instance_types():
    cheap_t4 = make_instance(name="t4", gpu_model="T4", price_per_hour=0.5)
    pricey = make_instance(name="v100", price_per_hour=9.0)
    fine = make_instance(name="v100-small", price_per_hour=2.0)
    job = make_job(allowed="cloud", gpu_models=frozenset({"V100"}), max_price_per_hour=3.0)

    [provision] = schedule(make_state(queue=(job,), catalogue=(cheap_t4, pricey, fine)), 0.0, config())

    assert provision == Provision("v100-small", 1, job.id)


def test_two_node_job_is_all_or_nothing_on_nodes_of_one_kind():
    free_local = make_node(kind="local", gpu_count=4)
    busy_local = make_node(kind="local", gpu_count=4, free=0)
    free_reserved = make_node(kind="reserved", gpu_count=4)
    job = make_job(node_count=2, gpu_count=4)
    state = make_state(
        nodes=(free_local, busy_local, free_reserved), queue=(job,), running=(busy(busy_local, until=900.0),)
    )

    decisions = schedule(state, 0.0, config())

    assert of_type(decisions, Start) == []
    [wait] = of_type(decisions, Wait)
    assert wait.until == 900.0

    other_local = make_node(kind="local", gpu_count=4)
    [start] = schedule(make_state(nodes=(free_local, other_local, free_reserved), queue=(job,)), 0.0, config())
    assert set(start.node_ids) == {free_local.id, other_local.id}
    assert start.gpu_indices == ((0, 1, 2, 3), (0, 1, 2, 3))


def test_multi_node_job_provisions_all_ranks_at_once():
    job = make_job(allowed="cloud", node_count=3)

    [provision] = schedule(make_state(queue=(job,), catalogue=(make_instance(),)), 0.0, config())

    assert provision == Provision("cloud.1gpu", 3, job.id)


@pytest.mark.parametrize("bad", [{"gpu_count": -1}, {"node_count": 0}, {"allowed": "mars"}, {"priority": "asap"}])
def test_invalid_job_requests_are_rejected_on_construction(bad):
    with pytest.raises(ValueError):
        make_job(**bad)


def test_node_free_gpu_indices_must_exist():
    with pytest.raises(ValueError):
        make_node(gpu_count=2, free_gpu_indices=(0, 2))
