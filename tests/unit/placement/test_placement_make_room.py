"""Make room: a long job that could rent is moved off an owned GPU once jobs that may only run there queue behind it
(the reverse of pull-back; issue #33, the worst miss's next step)."""

from services.placement.policy import JobRequest, MakeRoom, RunningJob, Wait, schedule
from services.placement.policy.makeroom import make_room
from services.placement.policy.passes import ALL_KINDS, Pass
from services.placement.sim.engine import Simulation
from services.placement.sim.trace import TraceJob
from tests.unit.placement.placement_factories import busy, config, make_instance, make_job, make_node, make_state

HOUR = 3600.0
T4 = dict(name="t4.1x", price_per_hour=0.5)


def _held_local(*, left_h: float, **job):
    """The only local GPU, held by a job that could rent, started at 0 and expected to run `left_h` hours more."""
    node = make_node(kind="local", gpu_count=1, free=0, price_per_hour=0.35)
    fields = dict(priority="time", allowed="any", expected_duration_s=left_h * HOUR, checkpoint_interval_s=1800.0)
    fields.update(job)
    long = make_job(**fields)
    return node, RunningJob(long, (node.id,), ((0,),), started_at=0.0, expected_end_at=left_h * HOUR)


def _local_only(n: int) -> tuple:
    return tuple(make_job(priority="cost", allowed="local", expected_duration_s=HOUR) for _ in range(n))


def test_a_long_job_that_could_rent_makes_room_for_the_local_only_jobs_queued_behind_it():
    node, long = _held_local(left_h=1000)
    state = make_state(nodes=(node,), running=(long,), queue=_local_only(20), catalogue=(make_instance(**T4),))

    decisions = schedule(state, 0.0, config())

    # 20 jobs at $0.5/h wait ~1,000 h less ($10,000); the rental costs $500 and is as fast
    assert MakeRoom(long.job.id, (node.id,), "t4.1x", 1) in decisions


def test_nothing_moves_when_no_local_only_job_waits():
    node, long = _held_local(left_h=1000)
    state = make_state(nodes=(node,), running=(long,), catalogue=(make_instance(**T4),))

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_a_job_that_does_not_checkpoint_is_not_moved():
    node, long = _held_local(left_h=1000, checkpoint_interval_s=None)
    state = make_state(nodes=(node,), running=(long,), queue=_local_only(20), catalogue=(make_instance(**T4),))

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_a_job_with_little_left_is_not_moved():
    node, long = _held_local(left_h=10)
    state = make_state(nodes=(node,), running=(long,), queue=_local_only(20), catalogue=(make_instance(**T4),))

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_a_job_that_may_not_rent_is_not_moved():
    node, long = _held_local(left_h=1000, allowed="local")
    state = make_state(nodes=(node,), running=(long,), queue=_local_only(20), catalogue=(make_instance(**T4),))

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_the_move_is_not_made_when_the_rental_costs_more_than_the_wait_it_saves():
    node, long = _held_local(left_h=1000)
    # one job at $0.5/h waiting at most 1,000 h ($500) against $3,000 of renting
    state = make_state(
        nodes=(node,),
        running=(long,),
        queue=_local_only(1),
        catalogue=(make_instance(name="v100.1x", price_per_hour=3.0),),
    )

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_the_saving_counts_each_waiting_job_no_longer_than_it_would_wait():
    node, long = _held_local(left_h=1000)
    other = make_node(kind="local", gpu_count=1, free=0, price_per_hour=0.35)
    soon = RunningJob(make_job(allowed="local"), (other.id,), ((0,),), started_at=0.0, expected_end_at=2 * HOUR)
    # the 20 jobs get the other GPU within about 20 h: moving the long job saves them 20 h at most, not 1,000 h
    state = make_state(
        nodes=(node, other), running=(long, soon), queue=_local_only(20), catalogue=(make_instance(**T4),)
    )

    assert not [d for d in schedule(state, 0.0, config(reservation_depth=64)) if isinstance(d, MakeRoom)]


def test_the_simulator_moves_the_job_to_a_rental_and_the_local_only_jobs_run_on_the_freed_gpu():
    node = make_node(kind="local", gpu_count=1, price_per_hour=0.35)
    long = make_job(priority="time", allowed="any", expected_duration_s=1000 * HOUR, checkpoint_interval_s=1800.0)
    later = [
        make_job(priority="cost", allowed="local", submitted_at=10 * HOUR + i, expected_duration_s=HOUR)
        for i in range(20)
    ]
    jobs = [TraceJob(j, j.expected_duration_s, "BE") for j in (long, *later)]
    sim = Simulation(jobs, [node], catalogue=(make_instance(**T4),), config=config())

    out = sim.run()

    assert out.moves_to_make_room == 1
    start = out.started[long.id]  # its last start: on the rental, once booted
    assert 10 * HOUR + 120.0 <= start <= 10 * HOUR + 130.0
    assert all(out.finished[j.id] <= 40 * HOUR for j in later)  # not behind 1,000 h of the long job
    # the long job computed 10 h locally, the rest on the rental (restoring first) and, once the local-only jobs
    # were done, back on the local GPU (pulled back): no work lost, two restores
    assert out.pullbacks == 1
    assert start + 990 * HOUR < out.finished[long.id] <= start + 990 * HOUR + 2 * config().migration_s + 1.0
    assert out.od_dollars > 0


def test_a_faster_rental_does_not_move_a_job_the_waiting_jobs_do_not_pay_for():
    # on a slow owned GPU; a 3x faster rental would save the job itself ~667 h ($1,333 at its rate) for $167, but the
    # one job waiting behind it would gain at most its 20 h ($10): the move would be for the job's own speed, which
    # `pick` already weighed when it chose the owned GPU
    node, long = _held_local(left_h=1000)
    other = make_node(kind="local", gpu_count=1, free=0, price_per_hour=0.35)
    soon = RunningJob(make_job(allowed="local"), (other.id,), ((0,),), started_at=0.0, expected_end_at=20 * HOUR)
    fast = make_instance(name="a10g.1x", tflops=30.0, price_per_hour=0.5)
    state = make_state(nodes=(node, other), running=(long, soon), queue=_local_only(1), catalogue=(fast,))

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, MakeRoom)]


def test_the_simulator_keeps_the_rental_for_the_moved_job_while_it_boots_though_another_job_could_take_it():
    node = make_node(kind="local", gpu_count=1, price_per_hour=0.35)
    long = make_job(priority="time", allowed="any", expected_duration_s=1000 * HOUR, checkpoint_interval_s=1800.0)
    later = [
        make_job(priority="cost", allowed="local", submitted_at=10 * HOUR + i, expected_duration_s=HOUR)
        for i in range(20)
    ]
    # arrives while the rental boots, time-sensitive and first in the queue order: it would take the rental if free
    rival = make_job(priority="time", allowed="any", submitted_at=10 * HOUR + 60, expected_duration_s=HOUR)
    jobs = [TraceJob(j, j.expected_duration_s, "BE") for j in (long, *later, rival)]
    sim = Simulation(jobs, [node], catalogue=(make_instance(**T4),), config=config())

    out = sim.run()

    assert out.moves_to_make_room == 1
    assert 10 * HOUR + 120.0 <= out.started[long.id] <= 10 * HOUR + 130.0  # on the rental made for it
    assert out.od_nodes_created >= 2  # the rival rented its own


def test_the_saving_counts_the_freed_gpus_share_of_each_wait_as_the_contention_charge_does():
    # two local GPUs: the long job holds one for 1,000 h, the other is back at 20 h and the 20 local-only jobs wait
    # 20-39 h for it (590 h at $0.5/h: their wait charged at their own quarter of the rate, as before round 8).
    # Freeing 1 GPU of 2 takes 1 * min(1,000 h, t) / 2 off a wait t: $147.5 in
    # all (g * min(d, t) / N, as `contention.py` charges), not min(g * d / N, t) = t ($295): a $200 rental does not pay
    node, long = _held_local(left_h=1000)
    other = make_node(kind="local", gpu_count=1, free=0, price_per_hour=0.35)
    soon = RunningJob(make_job(allowed="local"), (other.id,), ((0,),), started_at=0.0, expected_end_at=20 * HOUR)
    cheap = make_instance(name="t4.1x", price_per_hour=0.2)
    state = make_state(nodes=(node, other), running=(long, soon), queue=_local_only(20), catalogue=(cheap,))

    assert not [
        d
        for d in schedule(state, 0.0, config(reservation_depth=64, cost_sensitive_backlog_weight=None))
        if isinstance(d, MakeRoom)
    ]
    # at $0.1/h ($100) it pays, so the rule above is what stops the move
    state = make_state(
        nodes=(node, other),
        running=(long, soon),
        queue=_local_only(20),
        catalogue=(make_instance(name="t4.1x", price_per_hour=0.1),),
    )
    assert [
        d
        for d in schedule(state, 0.0, config(reservation_depth=64, cost_sensitive_backlog_weight=None))
        if isinstance(d, MakeRoom)
    ]


def test_the_next_job_in_line_that_fits_on_the_freed_gpu_counts_its_whole_wait():
    # a kind of 8 local GPUs: the long job holds one for 30 h more, the other 7 are busy for 100 h; one time-sensitive
    # local-only job ($2/h) waits 30 h for the long job's GPU. Freeing it starts that job now: 30 h off its wait
    # ($60), not 1/8 of it ($7.5, the share every later job in line gains); a ~$15.5 rental pays
    node, long = _held_local(left_h=30)
    rest = make_node(kind="local", gpu_count=7, free=0, price_per_hour=2.45)
    held = RunningJob(
        make_job(allowed="local"), (rest.id,), (tuple(range(7)),), started_at=0.0, expected_end_at=100 * HOUR
    )
    waiting = make_job(priority="time", allowed="local", expected_duration_s=10 * HOUR)
    state = make_state(nodes=(node, rest), running=(long, held), queue=(waiting,), catalogue=(make_instance(**T4),))

    assert MakeRoom(long.job.id, (node.id,), "t4.1x", 1) in schedule(state, 0.0, config())


def _two_movable(*waiting: JobRequest, **overrides) -> Pass:
    """A kind of 8 local GPUs: two long jobs that could rent hold one each for 40 h more, the other 6 are busy for
    200 h; `waiting` are queued (the test gives their Waits, as the engine's plan would); a $1/h rental for the 40 h
    left costs about $40 a move."""
    nodes, running = [], []
    for _ in range(2):
        node, long = _held_local(left_h=40, exchange_rate=0.01)
        nodes.append(node)
        running.append(long)
    rest = make_node(kind="local", gpu_count=6, free=0, price_per_hour=2.1)
    state = make_state(
        nodes=(*nodes, rest),
        running=(*running, busy(rest, until=200 * HOUR)),
        queue=waiting,
        catalogue=(make_instance(name="t4.1x", price_per_hour=1.0),),
    )
    return Pass(state, now=0.0, config=config(**overrides), kinds=ALL_KINDS)


def _local_only_at(rate: float, submitted_at: float, **job) -> JobRequest:
    fields = dict(priority="time", allowed="local", exchange_rate=rate, submitted_at=submitted_at)
    return make_job(expected_duration_s=HOUR, **fields, **job)


def test_a_job_started_on_freed_gpus_is_not_counted_starting_again_by_the_next_move_of_the_pass():
    # B1 ($2/h) waits 100 h, B2 ($0.5/h) 101 h; each move frees 1 GPU of 8 for 40 h. The first move starts B1: its
    # 40 h whole ($80: $70 beyond its 1/8 share) and 1/8 of B2's 40 h ($2.5) pay for a ~$40 rental. B1 then waits
    # no more: a second move would start B2, worth its 40 h at $0.5/h ($20 with its share), not B1's $70 again
    b1, b2 = _local_only_at(2.0, 0.0), _local_only_at(0.5, 1.0)
    p = _two_movable(b1, b2)
    p.decisions = [Wait(b1.id, "waiting", until=100 * HOUR), Wait(b2.id, "waiting", until=101 * HOUR)]

    make_room(p)

    assert len([d for d in p.decisions if isinstance(d, MakeRoom)]) == 1


def test_the_freed_gpu_starts_the_next_job_in_queue_order_not_the_one_that_would_save_most():
    # B1 ($0.5/h) is first in line and waits 100 h; B2 ($2/h, of another shape: it needs 8 GB) waits as long behind
    # it. The freed GPU starts B1 ($17.5 beyond its share), not B2 ($70): with both shares ($2.5 + $10) that is $30,
    # and a ~$40 rental does not pay
    b1, b2 = _local_only_at(0.5, 0.0), _local_only_at(2.0, 1.0, min_gpu_memory_gb=8.0)
    p = _two_movable(b1, b2)
    p.decisions = [Wait(b1.id, "waiting", until=100 * HOUR), Wait(b2.id, "waiting", until=100 * HOUR)]

    make_room(p)

    assert not [d for d in p.decisions if isinstance(d, MakeRoom)]


def test_with_owned_wait_order_the_freed_gpu_starts_the_next_job_the_queue_serves():
    # the same queue served by `PolicyConfig.owned_wait_order`: of two 1-h local-only jobs B2 ($2/h) comes before B1
    # ($0.5/h), so the freed GPU starts B2: $70 beyond its share, $82.5 with both shares, pays for a ~$40 rental
    b1, b2 = _local_only_at(0.5, 0.0), _local_only_at(2.0, 1.0, min_gpu_memory_gb=8.0)
    p = _two_movable(b1, b2, owned_wait_order=True)
    p.decisions = [Wait(b1.id, "waiting", until=100 * HOUR), Wait(b2.id, "waiting", until=100 * HOUR)]

    make_room(p)

    assert len([d for d in p.decisions if isinstance(d, MakeRoom)]) == 1


def test_jobs_no_rental_can_host_are_made_room_for_as_local_only_jobs_are():
    """Jobs that may rent but ask for the local GPU's model, which no instance type has, wait for owned capacity as
    local-only jobs do: the long job that could rent is moved for them (round 8 saw only `allowed = local` jobs)."""
    node, long = _held_local(left_h=1000)
    model_only = tuple(
        make_job(priority="cost", allowed="any", gpu_models=frozenset({node.gpu_model}), expected_duration_s=HOUR)
        for _ in range(20)
    )
    t4 = make_instance(**T4, gpu_model="T4")
    state = make_state(nodes=(node,), running=(long,), queue=model_only, catalogue=(t4,))

    assert MakeRoom(long.job.id, (node.id,), "t4.1x", 1) in schedule(state, 0.0, config())


def test_freeing_a_gpu_counts_its_share_of_every_owned_gpu_the_waiting_jobs_may_use():
    """Four jobs of 1,000 h that accept only the V100 (no rental has it; $2/h each at the full rate) may use the
    local V100 a long job that could rent holds for 1,000 h more, and three reserved V100s back at 100 h, where they
    would start. Moving the long job starts one of them 100 h sooner ($200; the others still wait for the reserved
    ones): a $500 rental does not pay. Freeing 1 of the 4 GPUs they wait for is priced at 1/4 of each wait and the
    next job's whole wait ($350); priced as if the local V100 were all they could use (round 9: 1 of 1 GPU), all
    four waits came off ($800) and the job was moved."""
    node, long = _held_local(left_h=1000)
    reserved = make_node(kind="reserved", gpu_count=3, free=0, gpu_model=node.gpu_model, price_per_hour=1.5)
    waiting = tuple(
        make_job(
            priority="cost",
            allowed="any",
            gpu_models=frozenset({node.gpu_model}),
            expected_duration_s=1000 * HOUR,
            submitted_at=float(i),
        )
        for i in range(4)
    )
    state = make_state(
        nodes=(node, reserved),
        running=(long, busy(reserved, until=100 * HOUR)),
        queue=waiting,
        catalogue=(make_instance(**T4, gpu_model="T4"),),
    )
    for one_queue, moved in ((True, False), (False, True)):  # off: round 9's plan, N the freed GPU's kind
        p = Pass(state, now=0.0, config=config(one_owned_queue=one_queue), kinds=ALL_KINDS)
        p.decisions = [Wait(job.id, "waiting", until=100 * HOUR) for job in waiting]

        make_room(p)

        assert bool([d for d in p.decisions if isinstance(d, MakeRoom)]) is moved
