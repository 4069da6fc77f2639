"""Estimator's service layer: follow each job's output, keep its metric points, publish its ETA as it changes,
and learn from the jobs that complete."""

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from faststream.nats import NatsBroker
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from shared.bus import publish
from shared.events import (
    EtaEstimated,
    JobDeleted,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    LogChunk,
    LogLine,
    TaskStarted,
    TaskTelemetry,
)
from shared.jobs import MetricSpec, Parameter, Phase
from shared.lru import Lru
from shared.origin import NotReadYet, Origins, Verdict, dedup_key, verdict
from shared.rpc import MetricSeries, MetricsQuery, MetricsReport, PredictQuery, PredictReply
from shared.safe_regex import REPLAY_PER_LINE_S, MatchBudget
from shared.store import DocumentStore
from services.estimator.jobmodel import JobModel
from services.estimator.model import JobFeatures
from services.estimator.modelstore import ModelStore
from services.estimator.telemetry import believed, believed_process_memory, summary, system_series
from services.estimator.thinning import thin

log = logging.getLogger(__name__)
WARM_UP_QUERY = PredictQuery(benchmark="bert", batch_size=64, accelerator="NVIDIA H100-SXM5-80GB", accelerators=8)

PUBLISH_EVERY_S = 1.0
FINISHED_REMEMBERED = 10_000  # jobs seen finishing here: their late output chunks are read without the job's record
REPLAYED_KEPT = 32  # finished jobs' models kept for queries of their curves
ENDED_KEPT = 64  # the models of the jobs that ended here last: their last chunks, coming after the end, are kept
ENDED_WINDOW_S = 60.0  # for this long after this process saw the end (its clock): the node's word ends there


def observed(model: JobModel, chunk: LogChunk) -> list[tuple[int, LogLine]]:
    """The chunk's lines the model read (its position in the chunk with each): those that carried a metric, printed
    progress or an MLLOG record, which are kept so a restart, and a finished job's curves, read them again."""
    return [
        (i, line)
        for i, line in enumerate(chunk.lines)
        if model.observe(line) or model.carried_progress() or ":::MLLOG" in line.line
    ]


def finish(job: dict[str, Any] | None) -> tuple[dict[str, Any], list[EtaEstimated]] | None:
    """A known job marked finished, with the final estimate that clears the one shown; None when nothing changes."""
    if job is None or job.get("finished"):
        return None
    return {**job, "finished": True}, [EtaEstimated(event_id=f"{job['_id']}:eta:final", job_id=job["_id"], eta=None)]


def with_tflops(job: dict[str, Any] | None, tflops: float | None, *, attempt: int) -> tuple[dict, list] | None:
    """A known job with the GPU speed of its latest attempt's node (kept for a restart); None when nothing changes
    (a redelivered placement, or one of an earlier attempt, or a first attempt with no speed known where none was
    ever stored: a job without GPUs is placed without a write; a later attempt's is written, so that a late copy of
    an earlier attempt's placement cannot then give the job that attempt's speed)."""
    if job is None or job.get("placed_attempt", 0) > attempt:
        return None
    if tflops is None and job.get("tflops") is None and "placed_attempt" not in job and attempt <= 1:
        return None
    if job.get("placed_attempt") == attempt and job.get("tflops") == tflops:
        return None
    return {**job, "tflops": tflops, "placed_attempt": attempt}, []


def job_model(job: dict[str, Any]) -> JobModel:
    """A job's model as stored at its submission (and its GPUs' speed once placed), before any output."""
    # Stored from a validated submission; one stored before RE2 checked patterns is skipped by the tracker.
    model = JobModel(
        [MetricSpec.model_construct(**m) for m in job["metrics"]],
        [Parameter.model_validate(p) for p in job.get("parameters", [])],
    )
    model.tflops = job.get("tflops")
    return model


@dataclass
class Estimator:
    broker: NatsBroker
    jobs: DocumentStore  # what each job declares, and whether it finished (with its final estimate)
    points: AsyncCollection
    history: AsyncCollection  # completed jobs with features: the history model's runs
    own_runs: AsyncCollection  # completed jobs' curves toward a declared target: the own-jobs corpus
    models: ModelStore
    origins: Origins | None = None  # the placements output is checked against (the bus handlers need it)
    telemetry: AsyncCollection | None = None  # each task's GPU samples, as system series (the bus handlers need it)
    live: dict[str, JobModel] = field(default_factory=dict)
    last_published: dict[str, float] = field(default_factory=dict)
    # Jobs this process saw finish (a job never runs again once finished): output that comes after the end, on its
    # own consumer (a task's last chunk, most often), is not read as a live job's, and the job is not read to learn
    # it finished. Its metric lines still belong on its curves: the model of a job that ended here lately reads
    # them (`ended`, with the monotonic time they stop being read), with no estimate, for `ENDED_WINDOW_S`: the
    # node placed for the job may not add points to its curve for as long as the job is kept; older ones' late
    # output is dropped.
    finished: Lru[str, bool] = field(default_factory=lambda: Lru(FINISHED_REMEMBERED), repr=False)
    ended: Lru[str, tuple[JobModel, float]] = field(default_factory=lambda: Lru(ENDED_KEPT), repr=False)
    # finished jobs' models read again for a query of their curves: each query replayed every kept line (20,000
    # lines: 0.6 s on the loop each time; found by review); dropped when a late line of the job is kept
    replayed: Lru[str, JobModel] = field(default_factory=lambda: Lru(REPLAYED_KEPT), repr=False)
    # Jobs whose record this process made (so no earlier process estimated them) and of which no estimate went out
    # yet: their end needs no final estimate to clear one shown, nor a write (`status_changed`).
    unestimated: Lru[str, bool] = field(default_factory=lambda: Lru(FINISHED_REMEMBERED), repr=False)
    # (GPUs of rank 0, ranks, rank 0's GPU model) of each attempt as placed, until its start: a start's own counts
    # and model are its node's word
    placed_sizes: Lru[tuple[str, int], tuple[int, int, str]] = field(
        default_factory=lambda: Lru(FINISHED_REMEMBERED), repr=False
    )

    def health_details(self) -> dict:
        return {"history_model": self.models.status(), "live_jobs": len(self.live)}

    async def submitted(self, event: JobSubmitted) -> None:
        fields = {
            "metrics": [m.model_dump() for m in event.algorithm.metrics],
            "parameters": [p.model_dump() for p in event.algorithm.parameters],
            "project_id": event.project_id,
            "finished": False,
        }
        if await self.jobs.save(event.job_id, fields, None, []):  # a redelivery finds it stored: nothing changes
            self.live[event.job_id] = job_model(fields)  # nothing observed yet: its events need no read to find it
            self.unestimated.put(event.job_id, True)

    async def placed(self, event: JobPlaced) -> None:
        """Which node runs each rank of the attempt (the only node whose output of it is read), and the speed of
        rank 0's GPUs as placement recorded it (the history prior's TFLOPS)."""
        if self.origins is not None:  # its record is the placements consumer's to write (`handlers.on_placed`)
            self.origins.learn(event)
        rank0 = next((a for a in event.assignments if a.rank == 0), None)
        model = await self._model(event.job_id)
        if model is None or rank0 is None:
            return
        # what the attempt runs on, as placement gave it: its start's counts are the node's word
        self.placed_sizes.put(
            (event.job_id, event.attempt), (len(rank0.gpu_indices), len(event.assignments), rank0.gpu_model)
        )
        if await self.jobs.update(event.job_id, lambda job: with_tflops(job, rank0.gpu_tflops, attempt=event.attempt)):
            model.tflops = rank0.gpu_tflops

    async def task_started(self, event: TaskStarted) -> None:
        """Rank 0's start, only from the node placement put it on (the placement precedes it in the job's order);
        its time is when the bus server stored it (the handler puts it in), not the node's clock."""
        model = await self._model(event.job_id)
        if model is None or event.rank != 0:
            return
        if self.origins is not None and await self._judged(event) != "keep":
            log.warning(
                "dropped the start of job %s attempt %d from node %s: not placed there",
                event.job_id,
                event.attempt,
                event.node_id,
            )
            return
        gpus, nodes, placed_model = self.placed_sizes.get((event.job_id, event.attempt)) or (
            event.gpu_count,
            event.world_size,
            "",
        )
        # the model placement's record gave (a placement made before it said one: the start's)
        accelerator = placed_model or event.gpu_model
        model.started(at=event.started_at.timestamp(), accelerator=accelerator, gpus=gpus, nodes=nodes)

    async def _judged(self, event: TaskStarted) -> Verdict:
        """A start's verdict against its placement; one whose placement this process neither knows nor finds stored
        waits while the placements consumer has some to read, in the first minutes after a restart only (the
        placement, read before it in this job's order, may not be stored yet; `Origins.may_wait`)."""
        assert self.origins is not None
        nodes = await self.origins.nodes(event.job_id, event.attempt)
        read = nodes is not None or not self.origins.may_wait(time.monotonic()) or await self.origins.all_read()
        decided = verdict(nodes, event, all_placements_read=read)
        if decided == "wait":
            raise NotReadYet(f"the placement of job {event.job_id} attempt {event.attempt} is not read yet")
        return decided

    async def status_changed(self, event: JobStatusChanged) -> None:
        """A finished job is learnt from (completed) and tracked no more; its record is marked finished with the
        final estimate that clears the one shown, unless no estimate of it ever went out (`unestimated`)."""
        if not event.phase.is_finished():
            return
        model = await self._model(event.job_id, finished_too=True)
        if event.phase == Phase.COMPLETED and model is not None and event.start_time and event.end_time:
            await self._learn(event, model)
        if not self.unestimated.get(event.job_id):  # else nothing to clear: its record stays as submitted
            await self.jobs.update(event.job_id, finish)
        self.finished.put(event.job_id, True)
        if model is not None:
            self.ended.put(event.job_id, (model, time.monotonic() + ENDED_WINDOW_S))
        self.live.pop(event.job_id, None)
        self.last_published.pop(event.job_id, None)

    async def deleted(self, event: JobDeleted) -> None:
        """A deleted job (only a finished one is: the submitter's word) is tracked no more: its record, metric
        lines, GPU samples and placements go; output that comes later is dropped unread. What it taught the
        history model and the own-jobs corpus stays."""
        self.finished.put(event.job_id, True)
        self.replayed.pop(event.job_id)
        self.ended.pop(event.job_id)
        self.live.pop(event.job_id, None)
        self.last_published.pop(event.job_id, None)
        self.unestimated.pop(event.job_id)
        if self.origins is not None:
            await self.origins.forget(event.job_id)
        await self.points.delete_many({"job_id": event.job_id})
        if self.telemetry is not None:
            await self.telemetry.delete_many({"job_id": event.job_id})
        await self.jobs.delete(event.job_id)

    async def log_chunk(self, chunk: LogChunk) -> None:
        model = await self._model(chunk.job_id)
        if model is None:
            ended = self.ended.get(chunk.job_id)
            if ended is not None and time.monotonic() < ended[1] and (kept := observed(ended[0], chunk)):
                await self._store(chunk, kept)  # its last lines, after its end: on its curves, no estimate
                self.replayed.pop(chunk.job_id)
            return
        if kept := observed(model, chunk):
            await self._store(chunk, kept)
        if skipped := model.tracker.budget.unreported():
            log.warning(
                "job %s: its metric patterns took more than their %g%% of a core here: %d searches of its output "
                "lines skipped (its curves miss those lines' values)",
                chunk.job_id,
                100 * model.tracker.budget.rate,
                skipped,
            )
        now = time.time()
        if now - self.last_published.get(chunk.job_id, 0) < PUBLISH_EVERY_S:
            return
        eta = model.estimate(now, self.models.predictor, self.models.version)
        if eta is None:
            return
        self.last_published[chunk.job_id] = now
        self.unestimated.pop(chunk.job_id)  # before it goes out: its end then clears it
        # No outbox: an estimate is derived, superseded by the next, and an unacknowledged chunk is redelivered.
        await publish(
            self.broker,
            EtaEstimated(
                event_id=f"{chunk.job_id}:eta:{chunk.attempt}:{chunk.rank}:{chunk.seq}", job_id=chunk.job_id, eta=eta
            ),
        )

    async def task_telemetry(self, sample: TaskTelemetry) -> None:
        """Keep a running job's sample of the GPUs placement gave the rank (ids by task and number: redelivery adds
        nothing); readings of other GPUs, or past their recorded memory, are dropped."""
        if self.origins is None or self.telemetry is None or await self._model(sample.job_id) is None:
            return  # no record to check the node's claim against, or nowhere to keep it
        given = await self.origins.given(sample.job_id, sample.attempt, sample.rank)
        kept = believed(sample, given)
        if not kept:
            log.warning(
                "dropped GPU telemetry of job %s attempt %d rank %d from node %s: no reading of its own "
                "GPUs within their memory",
                sample.job_id,
                sample.attempt,
                sample.rank,
                sample.node_id,
            )
            return
        try:
            await self.telemetry.insert_one(
                {
                    "_id": dedup_key(sample),
                    "job_id": sample.job_id,
                    "attempt": sample.attempt,
                    "rank": sample.rank,
                    "t": sample.t,
                    "seq": sample.seq,
                    **summary(kept, believed_process_memory(sample, given)),
                }
            )
        except DuplicateKeyError:
            pass

    async def system_series(self, job_id: str, *, max_points: int) -> list[MetricSeries]:
        """The job's latest `max_points` GPU samples as series; the peak counts the older ones too."""
        if self.telemetry is None:
            return []
        newest_first = [("t", -1), ("seq", -1)]  # a sample's number orders two the server stored at one instant
        latest = [d async for d in self.telemetry.find({"job_id": job_id}).sort(newest_first).limit(max_points)]
        latest.reverse()
        peak = 0.0
        if latest:
            older = self.telemetry.find({"job_id": job_id, "t": {"$lt": latest[0]["t"]}}).sort("gpu_memory_gb", -1)
            peak = next(iter([d.get("gpu_memory_gb", 0.0) async for d in older.limit(1)]), 0.0)
        return system_series(latest, peak_before=peak)

    def warm_up(self) -> PredictReply:
        """Serve the newest model that loads now and predict once with it (its first use of numpy), so neither waits
        for the first question after a start: placement's first estimate used to find no model served yet."""
        try:
            self.models.load_latest()
            return self.predict(WARM_UP_QUERY)
        except Exception:  # the background refresh tries again; a question meets what is left
            log.exception("the estimator's warm-up failed; starting without it")
            return PredictReply()

    def predict(self, query: PredictQuery) -> PredictReply:
        """A duration before the job starts, from the history model (when one is trained)."""
        if self.models.predictor is None:
            return PredictReply()
        # The query counts accelerators per node; the model, like MLPerf's systems, counts them all.
        fields = query.model_dump() | {"accelerators": query.accelerators * query.nodes}
        duration, low, high = self.models.predictor.predict(JobFeatures(**fields))
        return PredictReply(duration_s=duration, low_s=low, high_s=high, model_version=self.models.version)

    async def metrics(self, query: MetricsQuery) -> MetricsReport:
        """Every metric point of a job so far (finished jobs included), for curves."""
        model = await self._model(query.job_id, finished_too=True)
        if model is None:
            return MetricsReport(job_id=query.job_id, series=[])
        specs = {m.name: m for m in model.metrics}
        series = [
            MetricSeries(
                name=name,
                target=specs[name].target if name in specs else None,
                mode=specs[name].mode if name in specs else None,
                points=[
                    (p.t, p.value, p.step)
                    for p in (
                        thin(points, query.max_points, value=lambda p: p.value)
                        if query.whole
                        else points[-query.max_points :]
                    )
                ],
            )
            for name, points in sorted(model.tracker.points.items())
        ]
        series += await self.system_series(query.job_id, max_points=query.max_points)
        return MetricsReport(job_id=query.job_id, series=series)

    async def _model(self, job_id: str, *, finished_too: bool = False) -> JobModel | None:
        if job_id in self.live:
            return self.live[job_id]
        if not finished_too and self.finished.get(job_id):
            return None
        if finished_too and (kept := self.replayed.get(job_id)) is not None:
            return kept
        job = await self.jobs.load(job_id)
        if job is None or (job.get("finished") and not finished_too):
            return None
        model = job_model(job)
        # Its kept lines, read again with a budget of their own (`MatchBudget.replaying`): a usual pattern's all of
        # them, a pathological one's for a bounded time, not for hours on the event loop at every restart and query
        model.tracker.budget = MatchBudget.replaying()
        async for doc in self.points.find({"job_id": job_id}).sort("t", 1):
            model.tracker.budget.grant(REPLAY_PER_LINE_S)
            model.observe(LogLine(t=doc["t"], line=doc["line"]))
        model.tracker.budget = MatchBudget()  # what its new lines may take
        if not job.get("finished") and not finished_too:
            # a query of its curves, or its end, reads a job without tracking it: one that ended without an estimate
            # shown keeps an unfinished record (`status_changed`), and a query would have tracked it again for good
            self.live[job_id] = model
        elif job.get("finished") or self.finished.get(job_id):  # ended: its lines come no more (but late ones)
            self.replayed.put(job_id, model)
        return model

    async def _store(self, chunk: LogChunk, lines: list[tuple[int, LogLine]]) -> None:
        """Keep the lines that carried metrics, printed progress or MLLOG records (ids by position: redelivery adds
        nothing)."""
        docs = [
            {"_id": f"{dedup_key(chunk)}:{i}", "job_id": chunk.job_id, "t": line.t, "line": line.line}
            for i, line in lines
        ]
        try:
            await self.points.insert_many(docs, ordered=False)
        except BulkWriteError:
            pass

    async def _learn(self, event: JobStatusChanged, model: JobModel) -> None:
        """A completed job becomes training data: its curve toward a declared target for the own-job band
        (exported and refitted offline, `ownexport`), its features and timing for the history model, whose enough
        new runs train a new version."""
        if event.start_time is None or event.end_time is None:
            return  # never ran: no curve and no timing to learn from
        start, end = event.start_time.timestamp(), event.end_time.timestamp()
        if (own := model.own_run(job_id=event.job_id, start=start, end=end)) is not None:
            try:
                await self.own_runs.insert_one({"_id": event.job_id, "run": own})
            except DuplicateKeyError:
                pass
        run = model.history_run(job_id=event.job_id, project=event.project_id, start=start, end=end)
        if run is None:
            return
        try:
            await self.history.insert_one({"_id": event.job_id, "run": run, "trained": False})
        except DuplicateKeyError:
            return
        if await self.history.count_documents({"trained": False}) >= self.models.retrain_every:
            runs = [d["run"] async for d in self.history.find({})]
            await self.models.train(runs)
            await self.history.update_many({"trained": False}, {"$set": {"trained": True}})
