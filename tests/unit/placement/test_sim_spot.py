"""Spot in the simulator: offers priced from the catalogue file, interruptions at the documented hazard (seeded),
the work since the last checkpoint lost, and spot only for jobs that checkpoint."""

import json
import math

import pytest

from services.placement.policy import InstanceType, JobRequest, PolicyConfig, Provision, Start, schedule
from services.placement.policy.options import waited_s
from services.placement.sim.catalogue import DEFAULT_CATALOGUE
from services.placement.sim.cli import main
from services.placement.sim.engine import Simulation
from services.placement.sim.spot import (
    BUCKET_MONTHLY,
    FAMILY_BUCKET,
    HOURS_PER_MONTH,
    family_hazard,
    hazard_per_hour,
    interruption_after_s,
    kept_compute_s,
    spot_fractions,
    spot_offers,
)
from services.placement.sim.trace import TraceJob, TraceOptions, load_jobs
from tests.unit.placement.placement_factories import busy, config, make_instance, make_job, make_node, make_state

HOUR = 3600.0


@pytest.mark.parametrize("bucket", sorted(BUCKET_MONTHLY))
def test_seeded_interruptions_happen_at_the_buckets_monthly_rate(bucket):
    hazard = hazard_per_hour(bucket)
    draws = [interruption_after_s(f"od-{i:05d}", hazard_per_hour=hazard, seed=7) for i in range(20_000)]

    within_a_month = sum(d <= HOURS_PER_MONTH * HOUR for d in draws) / len(draws)
    assert within_a_month == pytest.approx(BUCKET_MONTHLY[bucket], abs=0.01)
    assert sum(draws) / len(draws) == pytest.approx(HOUR / hazard, rel=0.03)


def test_each_family_of_the_catalogue_has_its_documented_bucket_and_the_files_spot_price():
    fractions, overall = spot_fractions()
    offers = {it.name: it for it in spot_offers(DEFAULT_CATALOGUE)}

    assert len(offers) == len(DEFAULT_CATALOGUE)
    for it in DEFAULT_CATALOGUE:
        spot = offers[it.name + ".spot"]
        family = it.name.split(".")[0]
        assert spot.spot and spot.interruptions_per_hour == hazard_per_hour(FAMILY_BUCKET[family])
        assert spot.price_per_hour == pytest.approx(it.price_per_hour * fractions.get(family, overall), abs=1e-4)
        assert spot.price_per_hour < it.price_per_hour
    assert family_hazard("p3dn.24xlarge.spot") > family_hazard("g5.xlarge") > family_hazard("g4dn.xlarge")


def test_interruptions_are_reproducible_and_depend_on_the_seed():
    hazard = hazard_per_hour(">20%")

    first = [interruption_after_s(f"od-{i}", hazard_per_hour=hazard, seed=1) for i in range(50)]
    again = [interruption_after_s(f"od-{i}", hazard_per_hour=hazard, seed=1) for i in range(50)]
    other = [interruption_after_s(f"od-{i}", hazard_per_hour=hazard, seed=2) for i in range(50)]

    assert first == again and first != other
    assert interruption_after_s("od-1", hazard_per_hour=0.0, seed=1) == math.inf


def test_a_checkpoint_keeps_only_whole_intervals():
    assert kept_compute_s(4000.0, checkpoint_interval_s=1800.0) == 3600.0
    assert kept_compute_s(1799.0, checkpoint_interval_s=1800.0) == 0.0
    assert kept_compute_s(-120.0, checkpoint_interval_s=1800.0) == 0.0  # still restoring: nothing computed


def test_the_trace_declares_checkpoints_for_jobs_expected_past_an_hour(tmp_path):
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        "short,4000,8192,1,1000,,LS,Running,0,3600,0\nlong,4000,8192,1,1000,,LS,Running,0,3601,0\n"
    )

    jobs, _ = load_jobs(str(pods), TraceOptions())

    assert {j.request.id: j.request.checkpoint_interval_s for j in jobs} == {"short": None, "long": 1800.0}


SPOT = InstanceType("t.spot", 1, "G2", 24, 12.0, 8, 64, 0.4, 120.0, spot=True, interruptions_per_hour=0.2)
ON_DEMAND = InstanceType("t", 1, "G2", 24, 12.0, 8, 64, 1.0, 120.0)


def _job(job_id: str, run_s: float, checkpoint_interval_s: float | None) -> TraceJob:
    request = JobRequest(
        id=job_id,
        user="u",
        submitted_at=0.0,
        expected_duration_s=run_s,
        allowed="cloud",
        checkpoint_interval_s=checkpoint_interval_s,
    )
    return TraceJob(request, run_s, "LS")


def _simulate(jobs: list[TraceJob], *, seed: int):
    config = PolicyConfig(policy="burst", reference_tflops=12.0)
    return Simulation(jobs, [], catalogue=(ON_DEMAND, SPOT), config=config, spot_seed=seed).run()


def test_an_interrupted_job_loses_the_work_since_its_checkpoint_pays_the_restore_and_is_placed_again():
    run_s, startup, restore = 10 * HOUR, SPOT.startup_delay_s, PolicyConfig().migration_s
    draw = lambda node, seed: interruption_after_s(node, hazard_per_hour=0.2, seed=seed)  # noqa: E731
    # a seed whose first node is taken back mid-run and whose second node outlives the rest of the job
    seed = next(
        s
        for s in range(1000)
        if startup + HOUR < draw("od-00001", s) < startup + 9 * HOUR and draw("od-00002", s) > 2 * run_s
    )
    taken_back = draw("od-00001", seed)
    elapsed = taken_back - startup
    kept = kept_compute_s(elapsed, checkpoint_interval_s=1800.0)

    out = _simulate([_job("j", run_s, 1800.0)], seed=seed)

    assert out.interruptions == 1 and out.jobs_interrupted == 1 and out.spot_nodes_created == 2
    assert out.lost_compute_s == pytest.approx(elapsed - kept)
    assert 0 < elapsed - kept < 1800.0
    assert out.finished["j"] == pytest.approx(taken_back + startup + restore + run_s - kept)
    assert out.od_dollars == 0.0 and out.spot_dollars > 0


def test_an_interrupted_job_is_queued_again_with_its_wait_kept_and_its_run_not_counted_as_waiting(monkeypatch):
    """The policy sees the job queued from the interruption, having waited only for its first node to boot."""
    run_s, startup = 10 * HOUR, SPOT.startup_delay_s
    draw = lambda node, seed: interruption_after_s(node, hazard_per_hour=0.2, seed=seed)  # noqa: E731
    seed = next(s for s in range(1000) if startup + HOUR < draw("od-00001", s) < startup + 9 * HOUR)
    taken_back = draw("od-00001", seed)
    seen: list[tuple[float, JobRequest]] = []

    def spy(state, now, config):
        seen.extend((now, job) for job in state.queue)
        return schedule(state, now, config)

    monkeypatch.setattr("services.placement.sim.engine.schedule", spy)
    _simulate([_job("j", run_s, 1800.0)], seed=seed)

    [(now, again), *_] = [(now, job) for now, job in seen if now >= taken_back]
    assert now == pytest.approx(taken_back)
    assert again.queued_at == pytest.approx(taken_back) and again.waited_before_s == pytest.approx(startup)
    assert waited_s(again, taken_back + HOUR) == pytest.approx(startup + HOUR)


def test_the_same_seed_replays_the_same_run():
    jobs = [_job(f"j{i}", (i + 2) * HOUR, 1800.0) for i in range(6)]

    first, again, other = _simulate(jobs, seed=3), _simulate(jobs, seed=3), _simulate(jobs, seed=4)

    assert first.interruptions > 0
    assert (first.finished, first.spot_dollars, first.lost_compute_s) == (
        again.finished,
        again.spot_dollars,
        again.lost_compute_s,
    )
    assert (first.finished, first.lost_compute_s) != (other.finished, other.lost_compute_s)


def test_a_job_without_checkpoints_is_never_rented_spot_in_the_simulator():
    out = _simulate([_job("no-ckpt", 10 * HOUR, None), _job("ckpt", 10 * HOUR, 1800.0)], seed=0)

    assert out.od_nodes_created == 1 and out.spot_nodes_created == 1
    assert out.od_dollars == pytest.approx(1.0 * (120 + 10 * HOUR + PolicyConfig().idle_release_s) / HOUR)


@pytest.mark.parametrize("policy", ["trainmaster", "burst"])
def test_an_idle_spot_node_is_not_given_to_a_job_that_does_not_checkpoint(policy):
    spot_node = make_node(kind="on_demand", spot=True, price_per_hour=0.2, gpu_count=1)
    plain = make_job(priority="time", allowed="cloud", expected_duration_s=HOUR)
    saver = make_job(priority="time", allowed="cloud", expected_duration_s=HOUR, checkpoint_interval_s=600.0)

    decisions = schedule(
        make_state(nodes=(spot_node,), queue=(plain,), catalogue=(make_instance(),)), 0.0, config(policy=policy)
    )
    assert not [d for d in decisions if isinstance(d, Start)]
    assert [d.instance_type for d in decisions if isinstance(d, Provision)] == ["cloud.1gpu"]

    decisions = schedule(
        make_state(nodes=(spot_node,), queue=(saver,), catalogue=(make_instance(),)), 0.0, config(policy=policy)
    )
    assert [d.node_ids for d in decisions if isinstance(d, Start)] == [(spot_node.id,)]


def test_the_cli_reports_spot_dollars_apart_and_never_spot_without_the_flag(tmp_path, capsys):
    pods, nodes = tmp_path / "pods.csv", tmp_path / "nodes.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\np-long,4000,8192,1,1000,,LS,Running,0,36000,0\n"
        "p-short,4000,8192,1,1000,,LS,Running,0,1800,0\n"
    )
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,32000,131072,1,G2\n")
    argv = [
        "--pods",
        str(pods),
        "--nodes",
        str(nodes),
        "--local",
        "0",
        "--reserved",
        "0",
        "--policy",
        "burst",
        "--local-only-frac",
        "0",
        "--cloud-only-frac",
        "0",
        "--json",
    ]

    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--spot"]) == 0
    spot = json.loads(capsys.readouterr().out)

    assert plain["spot_nodes_created"] == 0 and plain["cloud_dollars"] == plain["on_demand_dollars"]
    assert spot["spot_nodes_created"] == 1 and spot["on_demand_nodes_created"] == 1  # the short job: on-demand
    assert spot["cloud_dollars"] == pytest.approx(spot["on_demand_dollars"] + spot["spot_dollars"], abs=0.01)
    assert spot["cloud_dollars"] < plain["cloud_dollars"]


def test_spot_replaces_a_rental_but_never_leaves_a_free_owned_gpu_idle():
    slow_owned = make_node(kind="local", gpu_count=1, tflops=5.0)  # half the rented speed: renting would be sooner
    job = make_job(priority="time", expected_duration_s=10 * HOUR, checkpoint_interval_s=1800.0)
    on_demand = make_instance(name="cloud.1gpu", price_per_hour=3.0)
    spot = make_instance(name="cloud.1gpu.spot", price_per_hour=0.3, spot=True, interruptions_per_hour=0.001)

    [start] = schedule(make_state(nodes=(slow_owned,), queue=(job,), catalogue=(on_demand, spot)), 0.0, config())
    assert isinstance(start, Start) and start.node_ids == (slow_owned.id,)

    busy_owned = make_node(kind="local", gpu_count=1, tflops=5.0, free=0)
    state = make_state(
        nodes=(busy_owned,), queue=(job,), running=(busy(busy_owned, until=30 * HOUR),), catalogue=(on_demand, spot)
    )
    [provision] = schedule(state, 0.0, config())
    assert isinstance(provision, Provision) and provision.instance_type == "cloud.1gpu.spot"


def test_a_job_naming_no_host_memory_takes_its_gpus_share_in_the_simulator_and_gives_it_back():
    node = make_node(gpu_count=4, memory_gb=128.0, free_memory_gb=128.0)
    job = TraceJob(
        JobRequest(id="share", user="u", submitted_at=0.0, expected_duration_s=HOUR, gpu_count=1, memory_gb=None),
        HOUR,
        "LS",
    )
    sim = Simulation([job], [node], catalogue=(), config=PolicyConfig(policy="burst", reference_tflops=10.0))

    out = sim.run()  # a None here used to be subtracted from the node's free memory (TypeError)

    assert out.finished["share"] == pytest.approx(HOUR)
    assert sim.nodes[node.id].free_memory_gb == pytest.approx(128.0)
