"""Estimator's service layer: follow each job's output, keep its metric points, publish its ETA as it changes."""
import logging
import time
from dataclasses import dataclass, field

from faststream.nats import NatsBroker
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from shared.bus import publish
from shared.events import EtaEstimated, JobStatusChanged, JobSubmitted, LogChunk, LogLine
from shared.jobs import MetricSpec
from shared.rpc import MetricSeries, MetricsQuery, MetricsReport
from services.estimator.tracker import JobTracker

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 1.0


@dataclass
class Estimator:
    broker: NatsBroker
    jobs: AsyncCollection
    points: AsyncCollection
    trackers: dict[str, JobTracker] = field(default_factory=dict)
    last_published: dict[str, float] = field(default_factory=dict)

    async def submitted(self, event: JobSubmitted) -> None:
        await self.jobs.update_one(
            {"_id": event.job_id},
            {"$setOnInsert": {"metrics": [m.model_dump() for m in event.algorithm.metrics], "finished": False}},
            upsert=True,
        )

    async def status_changed(self, event: JobStatusChanged) -> None:
        if not event.phase.is_finished():
            return
        await self.jobs.update_one({"_id": event.job_id}, {"$set": {"finished": True}})
        self.trackers.pop(event.job_id, None)
        self.last_published.pop(event.job_id, None)
        await publish(self.broker, EtaEstimated(event_id=f"{event.job_id}:eta:final", job_id=event.job_id, eta=None))

    async def log_chunk(self, chunk: LogChunk) -> None:
        tracker = await self._tracker(chunk.job_id)
        if tracker is None:
            return
        found = [(line, point) for line in chunk.lines for point in tracker.observe(line)]
        if found:
            await self._store(chunk, found)
        now = time.time()
        if now - self.last_published.get(chunk.job_id, 0) < PUBLISH_EVERY_S:
            return
        eta = tracker.estimate(now)
        if eta is None:
            return
        self.last_published[chunk.job_id] = now
        await publish(self.broker, EtaEstimated(
            event_id=f"{chunk.job_id}:eta:{chunk.attempt}:{chunk.rank}:{chunk.seq}", job_id=chunk.job_id, eta=eta))

    async def metrics(self, query: MetricsQuery) -> MetricsReport:
        """Every metric point of a job so far (finished jobs included), for curves."""
        tracker = await self._tracker(query.job_id, finished_too=True)
        if tracker is None:
            return MetricsReport(job_id=query.job_id, series=[])
        specs = {m.name: m for m in tracker.metrics}
        series = [MetricSeries(name=name, target=specs[name].target if name in specs else None,
                               mode=specs[name].mode if name in specs else None,
                               points=[(p.t, p.value, p.step) for p in points[-query.max_points:]])
                  for name, points in sorted(tracker.points.items())]
        return MetricsReport(job_id=query.job_id, series=series)

    async def _tracker(self, job_id: str, *, finished_too: bool = False) -> JobTracker | None:
        if job_id in self.trackers:
            return self.trackers[job_id]
        job = await self.jobs.find_one({"_id": job_id})
        if job is None or (job.get("finished") and not finished_too):
            return None
        tracker = JobTracker([MetricSpec.model_validate(m) for m in job["metrics"]])
        async for doc in self.points.find({"job_id": job_id}).sort("t", 1):
            tracker.observe(LogLine(t=doc["t"], line=doc["line"]))
        if not job.get("finished"):
            self.trackers[job_id] = tracker
        return tracker

    async def _store(self, chunk: LogChunk, found: list) -> None:
        """Keep the lines that carried metrics (deterministic ids: a redelivered chunk adds nothing)."""
        docs = {}
        for line, point in found:
            key = f"{chunk.job_id}:{chunk.attempt}:{chunk.rank}:{chunk.seq}:{chunk.lines.index(line)}"
            docs[key] = {"_id": key, "job_id": chunk.job_id, "t": line.t, "line": line.line}
        try:
            await self.points.insert_many(list(docs.values()), ordered=False)
        except BulkWriteError:
            pass
