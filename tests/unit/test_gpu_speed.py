"""A GPU's measured speed is a claim: bounded by its record and its table figure, then placement and the estimator
plan with it."""

import pytest

from shared.jobs import MetricSpec, Parameter
from shared.noderecords import capped, limits_from_entry
from shared.nodes import Gpu
from shared.store import DocumentStore
from services.estimator.jobmodel import JobModel
from services.estimator.service import Estimator, with_tflops
from services.placement.adapter import policy_node, reference_tflops
from services.placement.apply import assignment
from tests.factories import node, placed, submitted, unique
from tests.memory import MemoryCollection

A100 = {
    "id": "ws-1",
    "kind": "local",
    "price_per_hour": 1.0,
    "gpus": [{"model": "A100", "memory_gb": 40, "tflops": 312, "count": 2}],
}


def measured(info, *figures):
    return info.model_copy(
        update={"gpus": tuple(g.model_copy(update={"measured_tflops": f}) for g, f in zip(info.gpus, figures))}
    )


@pytest.mark.parametrize(
    ("table", "figure", "speed"),
    [
        (989.0, 700.0, 700.0),  # slower than the datasheet, as real GPUs are: the measurement counts
        (989.0, 1000.0, 1000.0),  # a boost clock: a little over is believed
        (312.0, 5000.0, 312.0 * 1.1),  # a node boasting: no more than the table's figure and its slack
        (989.0, None, 989.0),  # not measured: the table
        (0.0, 700.0, 0.0),  # a model the table does not know: nothing to bound a claim by, so it is not believed
    ],
)
def test_a_gpus_speed_is_its_measured_figure_bounded_by_its_table_figure(table, figure, speed):
    assert Gpu(index=0, model="G", memory_gb=80, tflops=table, measured_tflops=figure).speed == pytest.approx(speed)


def test_a_measured_figure_over_the_records_is_capped_to_it_and_said():
    claimed = measured(node(node_id="ws-1", gpus=2, tflops=312, gpu_memory_gb=40, price=1.0), 9999.0, 280.0)
    claimed = claimed.model_copy(
        update={
            "gpus": tuple(g.model_copy(update={"model": "A100"}) for g in claimed.gpus),
            "labels": {"pool": "default"},
            "cpu_count": 8,
            "memory_gb": 32,
        }
    )
    info, refused = capped(claimed, limits_from_entry(A100))
    assert [g.measured_tflops for g in info.gpus] == [343.2, 280.0]
    assert refused == {"gpus[0].measured_tflops": "claimed 9999.0, record 343.2"}


def test_placement_plans_with_the_measured_speed():
    info = measured(node(gpus=2, tflops=989.0), 700.0, 600.0)
    assert policy_node(info).tflops == 650.0
    assert reference_tflops([info, node(tflops=100.0)]) == 600.0
    assert policy_node(measured(node(gpus=1, tflops=312.0), 5000.0)).tflops == pytest.approx(343.2)


def test_a_placed_rank_carries_the_measured_speed_of_its_slowest_gpu_as_placement_recorded_it():
    info = measured(node(gpus=4, tflops=989.0), 700.0, 600.0, None, 5000.0)
    assert assignment(0, info, (0, 1)).gpu_tflops == 600.0
    assert assignment(0, info, (0, 3)).gpu_tflops == 700.0  # a boast counts at most the table's x 1.1
    assert assignment(0, info, (1, 2)).gpu_tflops is None  # not all measured: the estimator's table stands
    assert assignment(0, measured(node(gpus=1, tflops=0.0), 700.0), (0,)).gpu_tflops is None


def test_a_placed_rank_carries_the_model_of_its_slowest_gpu_as_placement_recorded_it():
    info = measured(node(gpus=2, tflops=989.0), 700.0, 600.0)
    slow = info.gpus[1].model_copy(update={"model": "older-gpu"})
    info = info.model_copy(update={"gpus": (info.gpus[0], slow)})
    assert assignment(0, info, (0, 1)).gpu_model == "older-gpu"
    assert assignment(0, info, (0,)).gpu_model == info.gpus[0].model != ""
    assert assignment(0, info, ()).gpu_model == ""  # no GPU: nothing said


def test_the_estimator_plans_with_the_placed_nodes_speed_unless_the_job_declares_other_hardware():
    model = JobModel(
        metrics=[MetricSpec(name="loss", regex=r"loss (?P<value>[0-9.]+)", mode="min")],
        parameters=[Parameter(name="benchmark", value="bert")],
    )
    model.started(at=0.0, accelerator="NVIDIA H100 80GB HBM3", gpus=1, nodes=1)
    assert model.job_features().resolved().tflops == 989.0  # not placed by a record that says: the table
    model.tflops = 700.0
    assert model.job_features().resolved().tflops == 700.0
    replay = JobModel(
        metrics=model.metrics, parameters=[*model.parameters, Parameter(name="accelerator", value="A100")]
    )
    replay.started(at=0.0, accelerator="NVIDIA H100 80GB HBM3", gpus=1, nodes=1)
    replay.tflops = 700.0
    assert replay.job_features().resolved().tflops == 312.0


def test_the_estimator_keeps_the_latest_attempts_speed_with_the_job_once():
    job = {"_id": "j", "metrics": []}
    kept, _ = with_tflops(job, 700.0, attempt=2)
    assert kept == {"_id": "j", "metrics": [], "tflops": 700.0, "placed_attempt": 2}
    assert with_tflops(kept, 700.0, attempt=2) is None  # redelivered
    assert with_tflops(kept, 300.0, attempt=1) is None  # an earlier attempt's placement, late
    assert with_tflops(kept, None, attempt=3)[0]["tflops"] is None  # moved to a node not measured
    assert with_tflops(None, 700.0, attempt=1) is None


def test_a_job_placed_where_no_speed_is_known_is_not_written_until_one_is():
    job = {"_id": "j", "metrics": []}
    assert with_tflops(job, None, attempt=1) is None  # a job without GPUs: its placements cost no write
    kept, _ = with_tflops(job, 700.0, attempt=2)
    assert with_tflops(kept, None, attempt=3)[0] == {**kept, "tflops": None, "placed_attempt": 3}


class Bus:
    async def publish(self, *_, **__) -> None:
        pass


class Origins:
    async def placed(self, event) -> None:
        pass

    def learn(self, event) -> str:
        return ""


async def test_the_estimator_takes_the_speed_from_placements_record_and_keeps_it_over_a_restart():
    job_id = unique("fast")
    stores = dict(
        jobs=DocumentStore(MemoryCollection("jobs"), Bus()),
        points=MemoryCollection("points"),
        history=MemoryCollection("history"),
        own_runs=MemoryCollection("own_runs"),
    )
    estimator = Estimator(broker=Bus(), models=None, origins=Origins(), **stores)
    await estimator.submitted(submitted(job_id=job_id))
    await estimator.placed(placed(job_id, attempt=2, gpu_tflops=650.0))
    await estimator.placed(placed(job_id, attempt=1, gpu_tflops=100.0))  # late, and superseded
    assert estimator.live[job_id].tflops == 650.0
    restarted = Estimator(broker=Bus(), models=None, origins=Origins(), **stores)
    assert (await restarted._model(job_id)).tflops == 650.0


def test_a_later_attempt_on_a_node_of_no_known_speed_is_kept_so_a_late_earlier_placement_gives_it_no_speed():
    job = {"_id": "j", "metrics": []}
    kept, _ = with_tflops(job, None, attempt=2)  # the second attempt, on a node not measured
    assert kept["placed_attempt"] == 2 and kept["tflops"] is None
    assert with_tflops(kept, 700.0, attempt=1) is None  # the first attempt's placement, redelivered late
