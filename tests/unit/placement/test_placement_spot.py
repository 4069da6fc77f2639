"""Spot capacity: only for jobs that declare a checkpoint interval, priced with the work interruptions lose."""

import pytest

from services.placement.policy import Provision, schedule
from services.placement.policy.spot import spot_duration
from tests.unit.placement.placement_factories import busy, config, make_instance, make_job, make_node, make_state

HOUR = 3600.0


def _renting(job, *instances):
    node = make_node(kind="local", free=0)
    state = make_state(nodes=(node,), queue=(job,), running=(busy(node, until=10 * HOUR),), catalogue=instances)
    [provision] = schedule(state, 0.0, config())
    assert isinstance(provision, Provision)
    return provision.instance_type


def test_a_job_that_does_not_checkpoint_never_runs_on_spot_however_cheap():
    job = make_job(priority="time", expected_duration_s=HOUR)
    spot = make_instance(name="cloud.1gpu.spot", price_per_hour=0.3, spot=True)

    assert _renting(job, make_instance(), spot) == "cloud.1gpu"


def test_a_job_that_only_spot_could_run_without_a_checkpoint_is_not_rented_spot():
    job = make_job(priority="time", expected_duration_s=HOUR)
    node = make_node(kind="local", free=0)
    state = make_state(
        nodes=(node,),
        queue=(job,),
        running=(busy(node, until=10 * HOUR),),
        catalogue=(make_instance(name="cloud.1gpu.spot", price_per_hour=0.3, spot=True),),
    )

    assert not [d for d in schedule(state, 0.0, config()) if isinstance(d, Provision)]


def test_a_checkpointing_job_takes_the_cheaper_spot_offer():
    job = make_job(priority="time", expected_duration_s=HOUR, checkpoint_interval_s=600.0)
    spot = make_instance(name="cloud.1gpu.spot", price_per_hour=0.9, spot=True)

    assert _renting(job, make_instance(), spot) == "cloud.1gpu.spot"


def test_spot_is_planned_longer_by_the_work_interruptions_lose():
    short = spot_duration(10 * HOUR, checkpoint_interval_s=60.0)
    long = spot_duration(10 * HOUR, checkpoint_interval_s=3600.0)

    assert 10 * HOUR < short < long
    with pytest.raises(ValueError):
        spot_duration(HOUR, checkpoint_interval_s=None)
