"""A dry run shows what the policy decides, at the price it decides it (policy/dryrun.py)."""

import dataclasses
import random

import pytest

from services.placement.policy import Provision, Start, Wait
from services.placement.policy.capacity import CapacityIndex
from services.placement.policy.dryrun import faster_node, offers
from services.placement.policy.engine import Constraint, place
from services.placement.policy.options import node_options, rent_cost
from services.placement.policy.passes import ALL_KINDS
from tests.unit.placement.placement_factories import busy, config, make_instance, make_job, make_node, make_state


def decided(state, job, cfg):
    """The policy's decision for `job` queued alone on `state`."""
    [decision] = [d for d in place(dataclasses.replace(state, queue=(job,)), 0.0, cfg) if d.job_id == job.id]
    return decision


def test_a_free_owned_node_is_shown_first_at_its_share_of_the_price():
    owned = make_node(kind="local", gpu_count=4, price_per_hour=2.0, tflops=10.0)
    job = make_job(gpu_count=2, expected_duration_s=7200.0)
    state = make_state(nodes=(owned,), catalogue=(make_instance(gpus=2, price_per_hour=9.0),))
    cfg = config()
    chosen, *rest = offers(state, job, now=0.0, config=cfg)
    assert chosen.chosen and decided(state, job, cfg) == Start(job.id, chosen.node_ids, ((0, 1),))
    assert (chosen.price_per_hour, chosen.cost) == (1.0, 2.0)  # half the node for two hours
    assert [o.instance.name for o in rest] == ["cloud.1gpu"] and not rest[0].chosen


@pytest.mark.parametrize("rate", [0.0, 2.0, 1000.0])
def test_the_offer_shown_first_is_what_the_policy_decides_at_the_price_it_weighs(rate):
    owned = make_node(kind="local", free=0, tflops=10.0)
    fast = make_instance(name="fast", tflops=40.0, price_per_hour=12.0, startup_delay_s=60.0)
    slow = make_instance(name="slow", tflops=10.0, price_per_hour=3.0, startup_delay_s=60.0)
    job = make_job(gpu_count=1, expected_duration_s=4 * 3600.0)
    state = make_state(nodes=(owned,), running=(busy(owned, until=6 * 3600.0),), catalogue=(fast, slow))
    cfg = config(exchange_rate=rate)
    chosen = offers(state, job, now=0.0, config=cfg)[0]
    decision = decided(state, job, cfg)
    if isinstance(decision, Provision):
        it = fast if decision.instance_type == "fast" else slow
        assert chosen.instance == it and chosen.cost == rent_cost(job, it, chosen.duration_s)
    else:
        assert isinstance(decision, Wait) and chosen.node_ids == (owned.id,) and not chosen.free_now
        assert decision.until == chosen.start_at
    if rate == 0.0:
        assert isinstance(decision, Wait)  # never rents to save time
    if rate == 1000.0:
        assert decision == Provision("fast", 1, job.id)  # earliest finish


def test_a_job_without_gpus_is_shown_its_whole_node_as_billing_charges_it():
    gpu_box = make_node(kind="local", price_per_hour=4.0)
    cpu_box = make_node(kind="reserved", gpu_count=0, free=0, gpu_model="", tflops=0.0, price_per_hour=1.5)
    job = make_job(gpu_count=0, cpu=2.0, expected_duration_s=7200.0)
    state = make_state(nodes=(gpu_box, cpu_box))
    chosen, other = offers(state, job, now=0.0, config=config())
    assert decided(state, job, config()) == Start(job.id, chosen.node_ids, ((),))
    assert (chosen.node_ids, chosen.price_per_hour, chosen.cost) == ((cpu_box.id,), 1.5, 3.0)
    assert (other.node_ids, other.price_per_hour, other.chosen) == ((gpu_box.id,), 4.0, False)


def test_a_pool_narrows_what_a_dry_run_shows():
    outside, inside = make_node(kind="local"), make_node(kind="local", pool="vision")
    job = make_job(gpu_count=1)
    state = make_state(nodes=(outside, inside), catalogue=(make_instance(),))
    shown = offers(state, job, now=0.0, config=config(), constraint=Constraint(pool="vision"))
    assert [o.node_ids for o in shown] == [(inside.id,)]


def test_a_faster_free_node_is_found_away_from_where_the_job_runs():
    here, quick = make_node(kind="local", free=0, tflops=10.0), make_node(kind="local", tflops=30.0)
    job = make_job(gpu_count=1)
    state = make_state(nodes=(here, quick))
    assert (
        faster_node(state, job, away_from=frozenset({here.id}), tflops_now=10.0, now=0.0, config=config()) == quick.id
    )
    assert faster_node(state, job, away_from=frozenset({here.id}), tflops_now=26.0, now=0.0, config=config()) is None


def test_a_dry_run_over_a_large_fleet_looks_at_a_few_nodes_not_all():
    """Views are built when a search reaches a node: a dry run on 2,000 idle nodes builds a handful."""

    nodes = tuple(make_node(gpu_count=8) for _ in range(2000))
    job = make_job(gpu_count=1)
    state = make_state(nodes=nodes, queue=(job,))
    index = CapacityIndex(state, now=0.0, kinds=ALL_KINDS)
    chosen = offers(make_state(nodes=nodes), job, now=0.0, config=config())[0]
    assert chosen.free_now and chosen.node_ids[0] in {n.id for n in nodes}
    assert len(index.views) == 0  # building the index reads the nodes, it makes no view
    node_options(job, index, kinds=("local",), config=config(), wait=True)
    assert 0 < len(index.views) <= 2


def test_availability_read_without_a_view_is_what_the_view_says():
    """The shortcut for nodes with enough GPUs free now agrees with a view built for every node of a mixed fleet."""

    rng = random.Random(3)
    nodes, running = [], []
    for _ in range(300):
        gpus = rng.choice((1, 2, 4, 8))
        free = rng.randrange(gpus + 1)
        node = make_node(
            gpu_count=gpus,
            free=free,
            kind=rng.choice(("local", "reserved", "on_demand")),
            ready_at=rng.choice((None, None, 50.0, 200.0)),
        )
        nodes.append(node)
        if free < gpus:
            running.append(busy(node, until=rng.uniform(-100.0, 5000.0)))
    state = make_state(nodes=tuple(nodes), running=tuple(running))
    lazy = CapacityIndex(state, now=100.0, kinds=ALL_KINDS)
    eager = CapacityIndex(state, now=100.0, kinds=ALL_KINDS)
    for node in nodes:
        for gpus in range(1, node.gpu_count + 1):
            at, version = lazy._avail_for(node.id, gpus)
            assert (at, version) == (eager.view(node.id).avail_for(gpus), 0), (node, gpus)
    assert len(lazy.views) < len(nodes)  # the shortcut answered for some nodes without a view
