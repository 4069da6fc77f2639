"""Queue order (priority, fair share) and backfill behind the head's reservation."""

import pytest

from services.placement.policy import Start, Wait, schedule
from tests.unit.placement.placement_factories import busy, config, make_job, make_node, make_state, of_type


def test_fair_share_starts_the_lighter_user_first():
    node = make_node(gpu_count=1)
    heavy = make_job(user="heavy", submitted_at=0.0)
    light = make_job(user="light", submitted_at=50.0)
    state = make_state(nodes=(node,), queue=(heavy, light), usage_by_user={"heavy": 100.0, "light": 1.0})

    decisions = schedule(state, 100.0, config())

    [start] = of_type(decisions, Start)
    assert start.job_id == light.id


def test_fair_share_charges_users_within_one_pass():
    node = make_node(gpu_count=2)
    first_a, second_a = make_job(user="a", submitted_at=0.0), make_job(user="a", submitted_at=1.0)
    only_b = make_job(user="b", submitted_at=2.0)
    state = make_state(nodes=(node,), queue=(first_a, second_a, only_b))

    started = [d.job_id for d in of_type(schedule(state, 10.0, config()), Start)]

    assert started == [first_a.id, only_b.id]


def test_time_sensitive_jobs_come_before_cost_sensitive_ones():
    node = make_node(gpu_count=1)
    cost = make_job(priority="cost", submitted_at=0.0)
    time_ = make_job(priority="time", submitted_at=99.0)

    [start] = of_type(schedule(make_state(nodes=(node,), queue=(cost, time_)), 100.0, config()), Start)

    assert start.job_id == time_.id


def _head_blocked_state(*, short_s: float, long_s: float, **head):
    """Two GPUs: one free now, one busy until t=100. The head needs both, so it reserves t=100."""
    node = make_node(gpu_count=2, free=1, kind="local")
    running = busy(node, until=100.0)
    head = make_job(user="u", gpu_count=2, submitted_at=0.0, allowed="local", **head)
    short = make_job(user="u", expected_duration_s=short_s, submitted_at=1.0, allowed="local")
    long_ = make_job(user="u", expected_duration_s=long_s, submitted_at=2.0, allowed="local")
    return node, make_state(nodes=(node,), queue=(head, short, long_), running=(running,)), head, short, long_


# round 9's order (submission among these local-only time jobs), and the local-only order of
# `PolicyConfig.owned_wait_order` (GPU-seconds over what a second of wait is worth), where a head whose time is worth
# 500 times more comes first as well
HEAD_FIRST = pytest.mark.parametrize(
    ("owned_wait_order", "head"), [(False, {}), (True, {"exchange_rate": 1000.0})], ids=["order-off", "order-on"]
)


@HEAD_FIRST
def test_backfill_starts_a_short_job_that_ends_before_the_heads_reservation(owned_wait_order, head):
    node, state, head, short, long_ = _head_blocked_state(short_s=50.0, long_s=500.0, **head)

    decisions = schedule(state, 0.0, config(owned_wait_order=owned_wait_order))

    assert of_type(decisions, Start) == [Start(short.id, (node.id,), ((0,),))]
    waits = {w.job_id: w for w in of_type(decisions, Wait)}
    assert waits[head.id].until == 100.0
    assert long_.id in waits


@HEAD_FIRST
def test_backfill_never_delays_the_head(owned_wait_order, head):
    _, state, head, short, long_ = _head_blocked_state(short_s=150.0, long_s=500.0, **head)

    decisions = schedule(state, 0.0, config(owned_wait_order=owned_wait_order))

    assert of_type(decisions, Start) == []
    assert {w.job_id for w in of_type(decisions, Wait)} == {head.id, short.id, long_.id}


def test_local_fifo_head_blocks_the_queue_without_backfill():
    node, state, head, short, _ = _head_blocked_state(short_s=50.0, long_s=500.0)

    decisions = schedule(state, 0.0, config(policy="local-fifo"))

    assert of_type(decisions, Start) == []
    assert [w.job_id for w in of_type(decisions, Wait)] == [head.id]
