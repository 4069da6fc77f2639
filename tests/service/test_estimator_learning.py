"""What the estimator keeps of a completed job to learn from: its curve toward a declared target (the own-jobs
corpus, exported for the band's refit) and, with features, its history run; a redelivered completion adds nothing."""

import gzip
import json
from datetime import timedelta

from shared.clock import utcnow
from shared.events import JobStatusChanged, LogLine
from shared.jobs import MetricSpec, Phase, SecondaryPhase
from shared.store import DocumentStore
from services.estimator.jobmodel import JobModel
from services.estimator.model import owncorpus
from services.estimator.ownexport import corpus_line
from services.estimator.service import Estimator
from tests.factories import unique
from tests.memory import MemoryCollection


class Bus:
    async def publish(self, *_, **__) -> None:
        pass


def completed(job_id: str, *, start, end) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:9",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=9,
        phase=Phase.COMPLETED,
        secondary_phase=SecondaryPhase.COMPLETED,
        attempt=1,
        start_time=start,
        end_time=end,
    )


def training(job_id: str, *, start: float, lines: int = 200) -> JobModel:
    """A job that prints `step N loss X` falling as a power law, and declares loss <= 0.2 (no step group: counted)."""
    model = JobModel(metrics=[MetricSpec(name="loss", regex=r"loss (?P<value>[0-9.]+)", mode="min", target=0.2)])
    model.started(at=start, accelerator="NVIDIA A100", gpus=1, nodes=1)
    for i in range(1, lines + 1):
        model.observe(LogLine(t=start + i * 0.5, line=f"step {i} loss {2.0 / i**0.5:.4f}"))
    return model


async def test_a_completed_job_with_a_target_is_kept_as_a_run_of_the_own_jobs_corpus_once():
    job_id, end = unique("own"), utcnow()
    start = end - timedelta(seconds=100)
    estimator = Estimator(
        broker=Bus(),
        jobs=DocumentStore(MemoryCollection("jobs"), Bus()),
        points=MemoryCollection("points"),
        history=MemoryCollection("history"),
        own_runs=MemoryCollection("own_runs"),
        models=None,
    )
    await estimator.jobs.save(job_id, {"metrics": [], "parameters": [], "project_id": "p", "finished": False}, None, [])
    estimator.live[job_id] = training(job_id, start=start.timestamp())
    for _ in range(2):  # a redelivered completion stores nothing twice
        await estimator.status_changed(completed(job_id, start=start, end=end))
        estimator.live[job_id] = training(job_id, start=start.timestamp())
    [doc] = estimator.own_runs.docs.values()
    assert estimator.history.docs == {}  # no benchmark, no features: nothing for the history model
    assert corpus_line({"_id": "hand-edited", "run": {"points": []}}) is None
    run = json.loads(corpus_line(doc))
    assert run["run"] == job_id and run["params"]["seed"] in range(5) and len(run["points"]) == 120
    # thinned evenly to 120 points; a counted step is the point's place among all 200 the job printed
    assert run["points"][-1]["t"] == 100.0 and run["points"][-1]["step"] == 200.0
    assert [p["step"] for p in run["points"][:3]] == [1.0, 3.0, 4.0]
    case = owncorpus.make_case(run, "loss", u=1.0, smooth=False)  # the corpus reads it as its own runs
    assert case is not None and case.truth > 50 and case.mode == "min"


def test_jobs_without_a_target_or_with_too_few_points_are_not_kept(tmp_path):
    assert JobModel(metrics=[]).own_run(job_id="j", start=0.0, end=1.0) is None
    assert training("j", start=0.0, lines=owncorpus.MIN_TRUTH_POINTS).own_run(job_id="j", start=0.0, end=9.0) is None
    stepped = JobModel(
        metrics=[MetricSpec(name="acc", regex=r"step (?P<step>\d+) acc (?P<value>[0-9.]+)", mode="max", target=0.9)]
    )
    for i in range(1, 41):
        stepped.observe(LogLine(t=float(i), line=f"step {i * 10} acc {1 - 1 / i:.3f}"))
    run = stepped.own_run(job_id="j", start=0.0, end=41.0)
    assert [p["step"] for p in run["points"][:2]] == [10.0, 20.0] and "val_acc" in run["points"][0]
    path = tmp_path / "own.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(corpus_line({"_id": "j", "run": run}))
    assert owncorpus.load_sweep(path) == [run]  # what `bench.search.calibrate --sweep` reads
