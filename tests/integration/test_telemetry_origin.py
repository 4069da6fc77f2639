"""GPU telemetry on a real NATS server configured as `make run` does: one node's agent, with its own credentials,
publishes samples on its own telemetry subject naming a job placed on another node (first, with the numbers the
real samples will carry); the estimator, reading the telemetry stream as itself, keeps none of them, and the real
node's samples become the job's system series."""

import time
from types import SimpleNamespace

import pytest

from shared.bus import connect, make_broker, publish, read_up
from shared.events import TaskTelemetry
from shared.origin import Origins
from shared.rpc import MetricsQuery
from shared.store import DocumentStore, make_client
from services.estimator.handlers import JOBS, PLACED, router
from services.estimator.service import Estimator
from services.placement.estimates import Estimates
from tests.factories import placed, unique
from tests.integration.test_output_origin import as_node, until

pytestmark = pytest.mark.integration


def sample(job_id: str, *, node_id: str, seq: int, memory_gb: float) -> TaskTelemetry:
    return TaskTelemetry(
        event_id=f"{job_id}:1:0:gpu:{node_id}:{seq}",
        job_id=job_id,
        attempt=1,
        node_id=node_id,
        seq=seq,
        t=1000.0 + seq,
        gpus=[{"index": 0, "util_percent": 90, "memory_used_gb": memory_gb}],
    )


@pytest.fixture
async def estimator(cluster_servers):
    """The estimator's bus handlers, as the estimator (its own credentials), on the real server and database."""
    broker = make_broker(
        cluster_servers.nats_url, name="estimator", creds=cluster_servers.identities.creds("estimator")
    )
    broker.include_router(router)
    client = make_client(cluster_servers.mongo_url_of("estimator"))
    db = client[unique("db").replace("-", "_")]
    service = Estimator(
        broker=broker,
        jobs=DocumentStore(db.estimator_jobs, broker),
        points=db.estimator_points,
        history=db.estimator_history,
        own_runs=db.estimator_own_runs,
        models=SimpleNamespace(predictor=None, version=None, status=lambda: {}),
        origins=Origins(placements=db.estimator_placements, all_read=lambda: read_up(broker, PLACED)),
        telemetry=db.estimator_telemetry,
    )
    broker.context.set_global("estimator", service)
    await connect(broker)
    await JOBS.resume(broker)
    await broker.start()
    yield broker, service
    await broker.stop()
    await client.close()


async def test_other_nodes_samples_are_dropped_and_the_real_ones_are_the_jobs_series(cluster_servers, estimator):
    _, service = estimator
    job_id = unique("j")
    await service.jobs.save(job_id, {"metrics": [], "parameters": [], "project_id": "p", "finished": False}, None, [])
    placement = make_broker(
        cluster_servers.nats_url, name="placement", creds=cluster_servers.identities.creds("placement")
    )
    await connect(placement)
    await publish(placement, placed(job_id, nodes=("n2",), gpu_indices=(0,), gpu_memory_gb=24))
    await placement.stop()

    attacker = await as_node(cluster_servers, "n1")
    for seq in range(1, 4):
        await publish(attacker, sample(job_id, node_id="n1", seq=seq, memory_gb=23))
    await attacker.stop()
    runner = await as_node(cluster_servers, "n2")
    for seq in range(1, 4):
        await publish(runner, sample(job_id, node_id="n2", seq=seq, memory_gb=float(seq)))
    await runner.stop()

    async def three_stored() -> bool:
        return await service.telemetry.count_documents({"job_id": job_id}) == 3

    assert await until(three_stored)
    report = await service.metrics(MetricsQuery(job_id=job_id, max_points=100))
    series = {s.name: [p[1] for p in s.points] for s in report.series if s.system}
    assert series["gpu_memory_gb"] == [1.0, 2.0, 3.0] and series["gpu_memory_peak_gb"] == [1.0, 2.0, 3.0]
    assert series["gpu_util"] == [90.0, 90.0, 90.0]
    times = [p[0] for s in report.series if s.name == "gpu_util" for p in s.points]
    assert all(abs(t - time.time()) < 600 for t in times)  # when the server stored them, not the claimed 1001-1003

    placement = make_broker(
        cluster_servers.nats_url, name="placement", creds=cluster_servers.identities.creds("placement")
    )
    await connect(placement)
    try:
        assert await Estimates(broker=placement).peak_gpu_memory(job_id) == 3.0  # asked and answered as themselves
        assert await Estimates(broker=placement).peak_gpu_memory(unique("never-ran")) is None
    finally:
        await placement.stop()
