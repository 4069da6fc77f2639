"""The quote is the decision: on random fleets and queues (seeded, bounded), the offer a dry run shows first is what
the configured policy decides for the job once it is queued behind the others, at the price billing charges."""

import dataclasses
import random

import pytest

from shared.pricing import rank_price_per_hour as billed_share  # what billing charges a rank
from services.placement.policy import Provision, Start, Wait
from services.placement.policy.dryrun import offers
from services.placement.policy.engine import Constraint, place
from services.placement.policy.models import RunningJob
from services.placement.policy.options import rent_cost
from tests.unit.placement.placement_factories import config, make_instance, make_job, make_node, make_state

HOUR = 3600.0
FLEETS = 150  # per policy; a fleet takes a few milliseconds


def random_fleet(rng: random.Random):
    """A few owned nodes partly busy, a catalogue, and a queue of mixed jobs; all at `now` = 10 h."""
    now = 10 * HOUR
    nodes, running = [], []
    for _ in range(rng.randint(1, 5)):
        gpus = rng.choice((1, 2, 4, 8))
        free = rng.randint(0, gpus)
        node = make_node(
            kind=rng.choice(("local", "local", "reserved")),
            gpu_count=gpus,
            free=free,
            gpu_model=rng.choice(("P100", "V100")),
            tflops=rng.choice((9.3, 15.0)),
            price_per_hour=rng.choice((0.35, 1.5)) * gpus,
        )
        nodes.append(node)
        if free < gpus:
            held = tuple(range(free, gpus))
            job = make_job(user=f"u{rng.randint(0, 3)}", gpu_count=len(held))
            running.append(
                RunningJob(
                    job=job,
                    node_ids=(node.id,),
                    gpu_indices=(held,),
                    started_at=0.0,
                    expected_end_at=now + rng.uniform(0.1, 40) * HOUR,
                )
            )
    catalogue = tuple(
        make_instance(
            name=f"type{i}", gpus=g, tflops=t, price_per_hour=p * g, startup_delay_s=rng.choice((60.0, 300.0))
        )
        for i, (g, t, p) in enumerate(
            rng.sample(
                [(1, 8.1, 0.53), (1, 31.2, 1.0), (4, 15.0, 3.06), (8, 8.1, 0.98), (8, 31.2, 2.0)], k=rng.randint(0, 3)
            )
        )
    )
    queue = tuple(random_job(rng, submitted_at=now - rng.uniform(0, 30) * HOUR) for _ in range(rng.randint(0, 8)))
    usage = {f"u{i}": rng.uniform(0, 50) for i in range(4)}
    return make_state(
        nodes=tuple(nodes), running=tuple(running), queue=queue, catalogue=catalogue, usage_by_user=usage
    ), now


def random_job(rng: random.Random, **overrides):
    fields = dict(
        user=f"u{rng.randint(0, 3)}",
        priority=rng.choice(("time", "cost")),
        allowed=rng.choice(("any", "any", "local", "cloud")),
        gpu_count=rng.choice((1, 1, 2, 4, 8)),
        expected_duration_s=rng.uniform(0.2, 60) * HOUR,
        duration_sigma=rng.choice((0.0, 0.3)),
    )
    return make_job(**(fields | overrides))


def queued_decision(state, job, now, cfg):
    """What the engine decides for `job` once submitted: queued behind the others, one pass."""
    for decision in place(dataclasses.replace(state, queue=state.queue + (job,)), now, cfg):
        if isinstance(decision, (Start, Provision, Wait)) and decision.job_id == job.id:
            return decision
    return None


def billed(state, job, node_ids, cfg):
    """Dollars billing charges for the job on these nodes for the time the policy expects it to take there."""
    nodes = [n for i in node_ids for n in state.nodes if n.id == i]
    hours = job.duration_on(min(n.tflops for n in nodes), cfg.reference_tflops) / 3600
    return sum(billed_share(n.price_per_hour, gpus=job.gpu_count, node_gpus=n.gpu_count) for n in nodes) * hours


@pytest.mark.parametrize(
    ("policy", "owned_wait_order"),
    [("trainmaster", False), ("trainmaster", True), ("burst", False), ("wait-local", False), ("wait-local", True)],
)
def test_the_first_offer_is_the_decision_once_queued_at_the_price_billed(policy, owned_wait_order):
    rng = random.Random(f"quote-{policy}")
    cfg = config(policy=policy, owned_wait_order=owned_wait_order)
    compared = 0
    for _ in range(FLEETS):
        state, now = random_fleet(rng)
        job = random_job(rng, id=f"dry-run-{compared}", submitted_at=now)
        shown = offers(state, job, now=now, config=cfg)
        decision = queued_decision(state, job, now, cfg)
        if not shown or decision is None or (isinstance(decision, Wait) and not getattr(decision, "node_ids", ())):
            continue  # nothing could host it now, or it holds no reservation: no price to compare
        first = shown[0]
        assert first.chosen
        if isinstance(decision, Provision):
            assert first.instance is not None and first.instance.name == decision.instance_type
            assert first.cost == pytest.approx(rent_cost(job, first.instance, first.duration_s))
        else:
            assert first.node_ids == decision.node_ids and first.free_now == isinstance(decision, Start)
            assert first.cost == pytest.approx(billed(state, job, decision.node_ids, cfg))
            if isinstance(decision, Wait):
                assert first.start_at == decision.until
        compared += 1
    assert compared >= FLEETS // 3  # most fleets did compare a decision


def test_a_dry_run_is_weighed_behind_the_jobs_already_queued():
    local = make_node(kind="local", gpu_count=1)
    ahead = make_job(priority="time", allowed="local", submitted_at=0.0, expected_duration_s=10 * HOUR)
    state = make_state(nodes=(local,), queue=(ahead,), catalogue=(make_instance(name="v100.1x"),))
    job = make_job(priority="time", allowed="any", submitted_at=HOUR, expected_duration_s=HOUR)

    [first, *_] = offers(state, job, now=HOUR, config=config())

    assert first.instance is not None and first.instance.name == "v100.1x"  # the free GPU is the queued job's


def test_a_dry_run_keeps_to_the_constraints_of_the_jobs_queued_ahead():
    kept = make_node(kind="reserved", gpu_count=1, reserved_for="kept-job")
    ahead = make_job(id="kept-job", allowed="cloud", submitted_at=0.0, expected_duration_s=HOUR)
    job = make_job(allowed="cloud", submitted_at=HOUR, expected_duration_s=HOUR)
    state = make_state(nodes=(kept,), queue=(ahead,), catalogue=(make_instance(name="v100.1x"),))

    [first, *_] = offers(
        state, job, now=HOUR, config=config(), constraints={"kept-job": Constraint(only=frozenset({kept.id}))}
    )

    assert first.instance is not None and first.instance.name == "v100.1x"
