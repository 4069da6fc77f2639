"""A job's curve as the portal reads it: the whole run, thinned (never cut to its last points); the search driver
still reads the most recent points."""

from shared.bus import publish
from shared.jobs import MetricSpec
from shared.rpc import MetricsQuery
from tests.factories import chunk, placed, unique


async def test_the_whole_curve_is_thinned_and_the_recent_points_stay_for_the_driver(estimator):
    broker, service, _ = estimator
    job_id = unique("j")
    await service.jobs.save(
        job_id,
        {
            "metrics": [MetricSpec(name="loss", regex=r"loss=([0-9.]+)", mode="min").model_dump()],
            "parameters": [],
            "project_id": "p",
            "finished": False,
        },
        None,
        [],
    )
    await publish(broker, placed(job_id, nodes=("n1",)))
    values = [round(25 / (i + 1), 4) for i in range(300)]
    for seq in range(3):
        await publish(
            broker,
            chunk(job_id, node_id="n1", seq=seq, lines=tuple(f"loss={v}" for v in values[seq * 100 : (seq + 1) * 100])),
        )
    whole = (await service.metrics(MetricsQuery(job_id=job_id, max_points=50, whole=True))).series[0].points
    assert len(whole) <= 50 and whole[0][1] == 25.0 and whole[-1][1] == values[-1]
    recent = (await service.metrics(MetricsQuery(job_id=job_id, max_points=50))).series[0].points
    assert [p[1] for p in recent] == values[-50:]
