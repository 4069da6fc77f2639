"""The estimator's placement records (`shared.origin`): written by its placements consumer alone, a batch at once;
its jobs consumer only learns each placement (a start is judged by it). A start whose placement is neither known
nor stored waits while the placements consumer has placements to read, then is judged as before."""

import pytest

from shared.bus import publish
from shared.events import LogLine
from shared.origin import NotReadYet, Origins
from tests.factories import T0, chunk, placed, started, submitted, unique
from tests.memory import MemoryCollection


async def test_the_jobs_consumer_stores_no_placement_record_and_the_placements_consumer_stores_it_once(estimator):
    broker, service, _ = estimator
    job_id = unique("rec")
    await service.submitted(submitted(job_id=job_id))
    await service.placed(placed(job_id, nodes=("n2",)))  # the jobs consumer's handler: known, not stored
    assert service.origins.placements.docs == {}
    await service.task_started(started(job_id, node_id="n2", at=T0))
    assert (await service._model(job_id)).started_at == T0.timestamp()
    for _ in range(2):  # delivered to both consumers (and again): one record
        await publish(broker, placed(job_id, nodes=("n2",)))
    assert list(service.origins.placements.docs) == [f"{job_id}:1"]


async def test_a_start_whose_placement_is_not_read_yet_waits_for_it_and_is_then_judged(estimator):
    _, service, _ = estimator
    job_id, read = unique("wait"), [False]

    async def all_read() -> bool:
        return read[0]

    service.origins = Origins(placements=MemoryCollection("placements"), all_read=all_read)
    await service.submitted(submitted(job_id=job_id))
    with pytest.raises(NotReadYet):  # after a restart: its placement neither known nor stored yet
        await service.task_started(started(job_id, node_id="n2", at=T0))
    await service.origins.placed(placed(job_id, nodes=("n2",)))  # the placements consumer stores it
    service.origins.known.pop(f"{job_id}:1")
    await service.task_started(started(job_id, node_id="n2", at=T0))
    assert (await service._model(job_id)).started_at == T0.timestamp()
    read[0] = True  # every placement read: the start of an attempt never placed is dropped, as before
    await service.task_started(started(job_id, attempt=2, node_id="n2", at=T0.replace(year=2020)))
    assert (await service._model(job_id)).started_at == T0.timestamp()


async def test_past_the_first_minutes_a_start_of_an_attempt_never_placed_is_dropped_at_once(estimator):
    """Its placement would have been read first in this process: a node's forged starts hold no slot of the jobs
    consumer while placements keep flowing (the placements consumer never quite all read)."""
    _, service, _ = estimator

    async def never_all_read() -> bool:
        return False

    job_id = unique("forged")
    service.origins = Origins(placements=MemoryCollection("placements"), all_read=never_all_read, restart_wait_s=0)
    await service.submitted(submitted(job_id=job_id))
    await service.task_started(started(job_id, attempt=999, node_id="n2", at=T0))  # dropped, no NotReadYet
    assert (await service._model(job_id)).started_at is None


async def test_a_start_counts_the_gpus_and_ranks_placement_gave_never_those_its_node_claims(estimator):
    """What a job ran on feeds its history record (and every later job's prior): its GPUs and ranks come from the
    placement, not from the node's start (a node claiming 64 GPUs and 100 ranks)."""
    _, service, _ = estimator
    job_id = unique("size")
    await service.submitted(submitted(job_id=job_id))
    await service.placed(placed(job_id, nodes=("n1", "n2"), gpu_indices=(0, 1)))
    claim = started(job_id, node_id="n1", at=T0).model_copy(update={"gpu_count": 64, "world_size": 100})
    await service.task_started(claim)
    model = await service._model(job_id)
    assert (model.gpus, model.nodes) == (2, 2)


async def test_a_start_is_recorded_on_the_gpu_model_placement_gave_never_the_one_its_node_names(estimator):
    """The run's accelerator feeds the history every later job's prior learns from: a node naming a faster GPU
    than placement's record gives would teach the estimator that the faster GPU is this slow."""
    _, service, _ = estimator
    job_id = unique("model")
    await service.submitted(submitted(job_id=job_id))
    placement = placed(job_id, gpu_indices=(0,))
    rank0 = placement.assignments[0].model_copy(update={"gpu_model": "Tesla T4"})
    await service.placed(placement.model_copy(update={"assignments": (rank0,)}))
    claim = started(job_id, node_id="n1", at=T0).model_copy(update={"gpu_model": "NVIDIA H100-SXM5-80GB"})
    await service.task_started(claim)
    assert (await service._model(job_id)).accelerator == "Tesla T4"

    older = unique("model")  # a placement that names no model (made before placements did): the start's
    await service.submitted(submitted(job_id=older))
    await service.placed(placed(older, gpu_indices=(0,)))
    await service.task_started(started(older, node_id="n1", at=T0).model_copy(update={"gpu_model": "Tesla T4"}))
    assert (await service._model(older)).accelerator == "Tesla T4"


async def test_a_node_the_job_left_has_no_say_on_its_estimate(estimator):
    """Output and telemetry were taken for any attempt placed on the sending node: the node an earlier attempt ran
    on moved the job's estimate after the job had moved, and its readings set the job's GPU memory peak (found by
    review). Its late lines stay the job's log (the API's)."""
    broker, service, _ = estimator
    job_id = unique("moved")
    metrics = [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}]
    await publish(broker, submitted(job_id=job_id, metrics=metrics))
    await publish(broker, placed(job_id, attempt=1, nodes=("n1",)))
    await publish(broker, started(job_id, attempt=1, node_id="n1", at=T0))
    await publish(broker, chunk(job_id, attempt=1, node_id="n1", lines=("loss 0.9",)))
    await publish(broker, placed(job_id, attempt=2, nodes=("n2",)))
    await publish(broker, chunk(job_id, attempt=1, node_id="n1", seq=1, lines=("loss 0.000001",)))
    await publish(broker, chunk(job_id, attempt=2, node_id="n2", lines=("loss 0.5",)))
    kept = sorted(d["line"] for d in service.points.docs.values() if d["job_id"] == job_id)
    assert kept == ["loss 0.5", "loss 0.9"]
    assert await service.origins.current_attempt(job_id) == 2


def test_a_nodes_line_times_hold_to_when_the_bus_stored_them():
    from services.estimator.handlers import LINE_AGE_S, timed_by

    stored = 1_000_000.0
    honest = chunk("j", lines=("a",)).model_copy(
        update={"lines": (LogLine(t=stored - 1, line="a"), LogLine(t=stored, line="b"))}
    )
    assert timed_by(honest, stored) is honest
    forged = honest.model_copy(update={"lines": (LogLine(t=stored + 9e6, line="a"), LogLine(t=0.0, line="b"))})
    assert [line.t for line in timed_by(forged, stored).lines] == [stored, stored - LINE_AGE_S]
