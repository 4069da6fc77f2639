"""The service's pass (policy/engine.py): jobs without GPUs, jobs moving away, kept to nodes or to a pool, all by
the one policy."""

from services.placement.policy import Provision, Release, Start, Wait, schedule
from services.placement.policy.engine import Constraint, place
from tests.unit.placement.placement_factories import config, make_instance, make_job, make_node, make_state, of_type


def cpu_node(**kw):
    return make_node(gpu_count=0, free=0, gpu_model="", tflops=0.0, **kw)


def test_without_constraints_or_gpu_less_jobs_it_decides_what_schedule_decides():
    nodes = (make_node(kind="local", free=1), make_node(kind="reserved"))
    queue = tuple(make_job(submitted_at=float(i), gpu_count=1) for i in range(4))
    state = make_state(nodes=nodes, queue=queue, catalogue=(make_instance(),))
    assert place(state, 0.0, config()) == schedule(state, 0.0, config())


def test_a_job_without_gpus_takes_the_cheapest_node_with_room_and_no_gpu():
    gpu_box = make_node(price_per_hour=4.0)
    cheap = cpu_node(price_per_hour=0.5, cpu=4.0, free_cpu=4.0)
    job = make_job(gpu_count=0, cpu=2.0, memory_gb=8.0)
    [start] = place(make_state(nodes=(gpu_box, cheap), queue=(job,)), 0.0, config())
    assert start == Start(job.id, (cheap.id,), ((),))


def test_jobs_without_gpus_share_a_node_until_its_cpu_or_memory_is_gone():
    box = cpu_node(cpu=4.0, free_cpu=4.0, memory_gb=16.0, free_memory_gb=16.0)
    jobs = [make_job(gpu_count=0, cpu=2.0, memory_gb=4.0, submitted_at=float(i)) for i in range(3)]
    jobs.append(make_job(gpu_count=0, cpu=0.5, memory_gb=16.0, submitted_at=9.0))
    decisions = place(make_state(nodes=(box,), queue=tuple(jobs)), 0.0, config())
    assert [type(d) for d in decisions] == [Start, Start, Wait, Wait]


def test_a_job_without_gpus_keeps_to_its_allowed_kinds_and_gangs_on_one_kind():
    one = dict(cpu=1.0, free_cpu=1.0)
    local, r1, r2 = (
        cpu_node(kind="local", **one),
        cpu_node(kind="reserved", id="r1", **one),
        cpu_node(kind="reserved", id="r2", **one),
    )
    cloud = make_job(gpu_count=0, allowed="cloud", cpu=1.0)
    gang = make_job(gpu_count=0, node_count=2, cpu=1.0, submitted_at=1.0)
    [a, b] = place(make_state(nodes=(local, r1, r2), queue=(cloud, gang)), 0.0, config())
    assert a.node_ids in (("r1",), ("r2",)) and b == Wait(gang.id, "no node has the CPU and memory free")


def test_a_job_moving_away_avoids_the_nodes_it_left_and_may_rent_instead():
    left = make_node(kind="local")
    job = make_job(gpu_count=1)
    state = make_state(nodes=(left,), queue=(job,), catalogue=(make_instance(),))
    [decision] = place(state, 0.0, config(exchange_rate=100.0), {job.id: Constraint(exclude=frozenset({left.id}))})
    assert decision == Provision("cloud.1gpu", 1, job.id)


def test_a_job_kept_to_its_pulled_back_node_goes_there_and_no_other_job_takes_it():
    target = make_node(kind="local", reserved_for="moving")
    other = make_node(kind="local", free=0)
    moving = make_job(id="moving", gpu_count=2, submitted_at=5.0)
    early = make_job(gpu_count=2, submitted_at=0.0)
    state = make_state(nodes=(target, other), queue=(early, moving), catalogue=(make_instance(),))
    decisions = place(state, 0.0, config(exchange_rate=0.0), {"moving": Constraint(only=frozenset({target.id}))})
    assert Start("moving", (target.id,), ((0, 1),)) in decisions
    assert not [d for d in of_type(decisions, Start) if d.job_id == early.id]


def test_a_job_in_a_pool_uses_only_that_pools_nodes_and_rents_nothing():
    outside = make_node(kind="local")
    inside = make_node(kind="local", pool="vision", free=0)
    job = make_job(gpu_count=1)
    state = make_state(nodes=(outside, inside), queue=(job,), catalogue=(make_instance(),))
    [decision] = place(state, 0.0, config(exchange_rate=100.0), {job.id: Constraint(pool="vision")})
    assert isinstance(decision, Wait)


def test_an_idle_rented_node_a_constrained_job_starts_on_is_not_released():
    idle = make_node(kind="on_demand", idle_since=-10_000.0)
    job = make_job(gpu_count=1)
    state = make_state(nodes=(idle,), queue=(job,))
    decisions = place(state, 0.0, config(), {job.id: Constraint(exclude=frozenset({"elsewhere"}))})
    assert of_type(decisions, Start) == [Start(job.id, (idle.id,), ((0,),))] and not of_type(decisions, Release)


def test_capacity_the_queue_takes_is_not_given_again_to_constrained_or_gpu_less_jobs():
    box = make_node(kind="local", gpu_count=1, cpu=4.0, free_cpu=4.0)
    first = make_job(gpu_count=1, cpu=3.0)
    moving = make_job(gpu_count=1, submitted_at=1.0)
    small = make_job(gpu_count=0, cpu=2.0, submitted_at=2.0)
    decisions = place(
        make_state(nodes=(box,), queue=(first, moving, small)),
        0.0,
        config(),
        {moving.id: Constraint(exclude=frozenset({"gone"}))},
    )
    assert [d.job_id for d in of_type(decisions, Start)] == [first.id]


def test_a_node_kept_for_one_job_is_not_taken_by_another_moving_job():
    kept = make_node(kind="local", reserved_for="owner")
    owner = make_job(id="owner", gpu_count=1, submitted_at=5.0)
    moving = make_job(gpu_count=1, submitted_at=0.0)
    state = make_state(nodes=(kept,), queue=(moving, owner))
    decisions = place(
        state,
        0.0,
        config(),
        {"owner": Constraint(only=frozenset({kept.id})), moving.id: Constraint(exclude=frozenset({"gone"}))},
    )
    assert of_type(decisions, Start) == [Start("owner", (kept.id,), ((0,),))]
