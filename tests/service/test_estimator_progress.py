"""The estimator reads a job's printed progress from its output chunks, publishes the ETA with it, and keeps the
lines that carried it, so an estimator that restarts replays them and knows the progress again."""

import time
from datetime import timedelta
from types import SimpleNamespace

from shared.events import EtaEstimated, JobStatusChanged, LogChunk, LogLine
from shared.jobs import Phase, SecondaryPhase
from shared.origin import Origins
from shared.rpc import MetricsQuery
from shared.store import DocumentStore
from services.estimator.service import Estimator
from tests.factories import T0, placed, started, submitted, unique
from tests.memory import MemoryCollection, ReadCounting


class Bus:
    def __init__(self) -> None:
        self.sent: list = []

    async def publish(self, message, *_, **__) -> None:
        self.sent.append(message)


def estimator(bus: Bus, **collections) -> Estimator:
    return Estimator(
        broker=bus,
        jobs=collections.get("jobs") or DocumentStore(MemoryCollection("jobs"), bus),
        points=collections.get("points") or MemoryCollection("points"),
        history=MemoryCollection("history"),
        own_runs=MemoryCollection("own_runs"),
        models=SimpleNamespace(predictor=None, version=None),
    )  # no history model trained


def status(job_id: str, phase: Phase) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:9",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=9,
        phase=phase,
        secondary_phase=SecondaryPhase(phase.value),
    )


def chunk(job_id: str, seq: int, lines: list[tuple[float, str]]) -> LogChunk:
    return LogChunk(
        event_id=f"{job_id}:1:0:n1:log:{seq}",
        job_id=job_id,
        attempt=1,
        node_id="n1",
        seq=seq,
        lines=tuple(LogLine(t=t, line=line) for t, line in lines),
    )


async def test_printed_progress_gives_the_published_eta_and_survives_a_restart():
    job_id, bus, now = unique("bar"), Bus(), time.time()
    first = estimator(bus)
    await first.jobs.save(job_id, {"metrics": [], "parameters": [], "project_id": "p", "finished": False}, None, [])
    lines = [(now - 100 + i, f"{i // 10:3d}%|#   | {i}/1000 [00:{i:02d}<?, 1.00it/s]") for i in range(1, 101)]
    await first.log_chunk(chunk(job_id, 0, [(now - 101, "loading data"), *lines]))
    [published] = [m for m in bus.sent if isinstance(m, EtaEstimated)]
    eta = published.eta
    assert (eta.source, eta.unit, eta.done, eta.total, eta.until) == ("tqdm", "it", 100, 1000, "end")
    assert 850 < eta.remaining_s < 950
    assert len(first.points.docs) == 100  # the bar's lines are kept; the line without progress is not

    restarted = estimator(Bus(), jobs=first.jobs, points=first.points)
    model = await restarted._model(job_id)
    again = model.estimate(now, None, None)
    assert (again.source, again.done, again.total) == ("tqdm", 100, 1000)


async def test_a_job_submitted_to_this_estimator_is_found_by_its_output_without_a_read():
    job_id, bus, now = unique("new"), Bus(), time.time()
    jobs, points = ReadCounting("jobs"), ReadCounting("points")
    live = estimator(bus, jobs=DocumentStore(jobs, bus), points=points)
    await live.submitted(submitted(job_id=job_id))
    await live.submitted(submitted(job_id=job_id))  # redelivered: stored once, modelled once
    lines = [(now - 100 + i, f"{i // 10:3d}%|#   | {i}/1000 [00:{i:02d}<?, 1.00it/s]") for i in range(1, 101)]
    await live.log_chunk(chunk(job_id, 0, lines))
    assert (jobs.reads, points.reads) == (0, 0)
    assert [m.eta.done for m in bus.sent if isinstance(m, EtaEstimated)] == [100]


async def test_output_that_comes_after_its_job_finished_here_is_kept_for_its_curves_without_a_read():
    """A task's last chunk comes on its own consumer and may come after the job's end: its lines are the curve's
    last points (they were dropped, and the portal's curve of a job that ended missed its end on a loaded machine).
    No estimate goes out for it, and neither the job nor its points are read to learn it ended."""
    job_id, bus = unique("late"), Bus()
    jobs, points = ReadCounting("jobs"), ReadCounting("points")
    live = estimator(bus, jobs=DocumentStore(jobs, bus, remember=10), points=points)
    await live.submitted(submitted(job_id=job_id))
    await live.status_changed(status(job_id, Phase.FAILED))
    await live.log_chunk(chunk(job_id, 0, [(time.time(), "  5%|#   | 5/100 [00:05<01:35, 1.00it/s]"), (0, "noise")]))
    assert (jobs.reads, points.reads) == (0, 0)
    assert not [m for m in bus.sent if isinstance(m, EtaEstimated)]
    assert [d["line"] for d in points.docs.values()] == ["  5%|#   | 5/100 [00:05<01:35, 1.00it/s]"]
    assert job_id not in live.live  # not tracked again


async def test_output_that_comes_long_after_its_job_finished_is_dropped():
    """The node placed for the job may add its last lines to the curve for a while after the end (this process's
    clock: `ENDED_WINDOW_S`), not for as long as the job is remembered."""
    job_id, bus = unique("later"), Bus()
    live = estimator(bus)
    await live.submitted(submitted(job_id=job_id))
    await live.status_changed(status(job_id, Phase.FAILED))
    model, until = live.ended.get(job_id)
    assert until > time.monotonic()
    live.ended.put(job_id, (model, time.monotonic() - 0.001))  # the window has passed
    await live.log_chunk(chunk(job_id, 0, [(time.time(), "  5%|#   | 5/100 [00:05<01:35, 1.00it/s]")]))
    assert not live.points.docs and not [m for m in bus.sent if isinstance(m, EtaEstimated)]


async def test_a_start_counts_only_from_the_node_its_rank_was_placed_on():
    job_id, bus = unique("start"), Bus()
    checks = Origins(placements=MemoryCollection("placements"), all_read=_all_read)
    service = estimator(bus)
    service.origins = checks
    await service.submitted(submitted(job_id=job_id))
    await service.placed(placed(job_id, nodes=("n2",)))
    await service.task_started(started(job_id, node_id="n1", at=T0 - timedelta(days=300)))  # a stranger's word
    model = await service._model(job_id)
    assert model.started_at is None
    await service.task_started(started(job_id, node_id="n2", at=T0))
    assert model.started_at == T0.timestamp()


async def _all_read() -> bool:
    return True


def final_estimates(bus: Bus) -> list[str]:
    """The jobs whose estimate was cleared (published from the record's outbox, as stored)."""
    return [m["job_id"] for m in bus.sent if isinstance(m, dict) and m.get("event_id", "").endswith(":eta:final")]


async def test_a_job_that_ends_without_an_estimate_of_it_shown_is_not_written_at_its_end():
    """No estimate went out (no output, or none that says how far it is): its end clears nothing and its record
    stays as submitted; a job of which one went out is marked finished and its estimate cleared, as before."""
    bus = Bus()
    live = estimator(bus)
    quiet, shown = unique("quiet"), unique("shown")
    for job_id in (quiet, shown):
        await live.submitted(submitted(job_id=job_id))
    now = time.time()
    await live.log_chunk(chunk(quiet, 0, [(now, "hello")]))  # output that says nothing of its progress
    await live.log_chunk(chunk(shown, 0, [(now - 10 + i, f"{i}%|#   | {i}/100 [00:0{i}<?, 1.00it/s]") for i in (1, 5)]))
    for job_id in (quiet, shown):
        await live.status_changed(status(job_id, Phase.COMPLETED))
    docs = live.jobs.collection.docs
    assert (docs[quiet]["finished"], docs[shown]["finished"]) == (False, True)
    assert final_estimates(bus) == [shown]
    assert await live._model(quiet) is None  # finished here: its late output is dropped, as before


async def test_a_job_submitted_before_this_process_is_written_at_its_end():
    """Another process may have shown an estimate of it: its end is written and clears it."""
    bus, job_id = Bus(), unique("older")
    first = estimator(bus)
    await first.submitted(submitted(job_id=job_id))
    restarted = estimator(bus, jobs=first.jobs, points=first.points)
    await restarted.status_changed(status(job_id, Phase.FAILED))
    assert first.jobs.collection.docs[job_id]["finished"] is True
    assert final_estimates(bus) == [job_id]


async def test_the_curves_of_a_finished_job_shown_without_an_estimate_do_not_track_it_again():
    """Its record still says unfinished (nothing was written at its end): a query of its curves reads them, and its
    late output is still dropped; it does not come back among the live jobs (rev10 M5)."""
    bus = Bus()
    live = estimator(bus)
    quiet = unique("quiet")
    await live.submitted(submitted(job_id=quiet))
    await live.log_chunk(chunk(quiet, 0, [(time.time(), "hello")]))
    await live.status_changed(status(quiet, Phase.COMPLETED))
    assert live.jobs.collection.docs[quiet]["finished"] is False
    await live.metrics(MetricsQuery(job_id=quiet))
    assert quiet not in live.live
    assert await live._model(quiet) is None  # its late output: dropped
