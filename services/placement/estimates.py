"""Queued jobs' durations from the estimator (`tm.rpc.estimator.predict`), cached, with a bounded wait.

The estimator answers from its history model when the job names a `benchmark` parameter (and optionally
`batch_size`, `learning_rate`); otherwise, or when it does not answer in time, the owner's `expected_duration_s`
stands, with a wider uncertainty. The policy prices rented time at the upper end of that uncertainty.
"""

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from faststream.nats import NatsBroker

from shared.asking import request
from shared.bus import RPC_METRICS, RPC_PREDICT
from shared.jobs import Parameter, Resource
from shared.rpc import MetricsQuery, MetricsReport, PredictQuery, PredictReply

log = logging.getLogger(__name__)
PREDICT_TIMEOUT_S = 0.5
PEAK_TIMEOUT_S = 2.0
PEAK_SERIES = "gpu_memory_peak_gb"  # the estimator's system series of a job's GPU telemetry
CACHE_TTL_S = 600.0  # a history model is retrained rarely; a new version shows within this
OWNER_SIGMA = 0.5  # an owner's guess, log-normal spread assumed
UNKNOWN_SIGMA = 1.0  # no guess at all (the one-hour default)
Z_80 = 1.2816  # the estimator's interval is read as 10th-90th percentiles


@dataclass(frozen=True, slots=True)
class Estimate:
    duration_s: float | None  # None: keep the owner's expectation
    sigma: float
    source: str  # "estimator" | "owner" | "default"


def query_for(parameters: Sequence[Parameter], resource: Resource, accelerator: str) -> PredictQuery | None:
    """The estimator's features from the job's parameters; None when it names no benchmark."""
    params = {p.name.lower(): p.value for p in parameters}
    benchmark = params.get("benchmark", "").strip()
    if not benchmark:
        return None

    def number(name: str) -> float:
        try:
            value = float(params.get(name, 0) or 0)
        except ValueError:
            return 0.0
        return value if math.isfinite(value) and value >= 0 else 0.0

    return PredictQuery(
        benchmark=benchmark[:128],
        batch_size=number("batch_size"),
        learning_rate=number("learning_rate"),
        accelerator=accelerator[:128] or "unknown",
        accelerators=max(1, resource.gpu_count),
        nodes=resource.node_count,
    )


def from_reply(reply: PredictReply) -> Estimate | None:
    """A usable prediction (finite, positive), with its spread from the interval."""
    d = reply.duration_s
    if d is None or not math.isfinite(d) or d <= 0 or d > 366 * 86400:
        return None
    low, high = reply.low_s, reply.high_s
    sigma = OWNER_SIGMA
    if low and high and math.isfinite(low) and math.isfinite(high) and 0 < low <= d <= high:
        sigma = min(2.0, math.log(high / low) / (2 * Z_80))
    return Estimate(d, sigma, "estimator")


def fallback(expected_duration_s: float | None) -> Estimate:
    return Estimate(None, OWNER_SIGMA, "owner") if expected_duration_s else Estimate(None, UNKNOWN_SIGMA, "default")


@dataclass
class Estimates:
    """Predictions per query, kept `CACHE_TTL_S`; a failed or empty answer is remembered as long (no retry storm)."""

    broker: NatsBroker | None
    timeout_s: float = PREDICT_TIMEOUT_S
    ttl_s: float = CACHE_TTL_S
    cache: dict[str, tuple[float, Estimate | None]] = field(default_factory=dict)

    def cached(self, query: PredictQuery | None, *, now: float | None = None) -> Estimate | None:
        if query is None:
            return None
        hit = self.cache.get(query.model_dump_json())
        now = time.time() if now is None else now
        return hit[1] if hit and now - hit[0] < self.ttl_s else None

    async def refresh(self, queries: list[PredictQuery], *, now: float | None = None) -> None:
        """Ask for the queries not cached (at most a handful at once, each bounded by the timeout)."""
        now = time.time() if now is None else now
        todo = {
            q.model_dump_json(): q
            for q in queries
            if (hit := self.cache.get(q.model_dump_json())) is None or now - hit[0] >= self.ttl_s
        }
        if not todo or self.broker is None:
            return
        answers = await asyncio.gather(*(self._ask(q) for q in list(todo.values())[:32]))
        for key, estimate in zip(list(todo)[:32], answers, strict=True):
            self.cache[key] = (now, estimate)
        if len(self.cache) > 10_000:
            for key in sorted(self.cache, key=lambda k: self.cache[k][0])[:5_000]:
                del self.cache[key]

    async def peak_gpu_memory(self, job_id: str) -> float | None:
        """The job's recorded peak GPU memory (its telemetry, as the estimator kept it); None when none was
        recorded or the estimator does not answer in time."""
        if self.broker is None:
            return None
        try:
            query = MetricsQuery(job_id=job_id, max_points=1)
            reply = await request(self.broker, query, RPC_METRICS, timeout=PEAK_TIMEOUT_S)
            return recorded_peak(MetricsReport.model_validate(await reply.decode()))
        except Exception as exc:  # no estimator, a timeout or a malformed answer: today's rule alone
            log.warning("no recorded GPU memory peak of job %s: %r", job_id, exc)
            return None

    async def _ask(self, query: PredictQuery) -> Estimate | None:
        if self.broker is None:
            return None
        try:
            reply = await request(self.broker, query, RPC_PREDICT, timeout=self.timeout_s)
            return from_reply(PredictReply.model_validate(await reply.decode()))
        except Exception as exc:  # no estimator, a timeout or a malformed answer: the owner's figure stands
            log.debug("estimator did not answer %s: %r", query.benchmark, exc)
            return None


def recorded_peak(report: MetricsReport) -> float | None:
    """The highest GPU memory a job's telemetry recorded (GB; the estimator's system series), if any."""
    values = [p[1] for s in report.series if s.system and s.name == PEAK_SERIES for p in s.points]
    finite = [v for v in values if math.isfinite(v) and 0 <= v <= 1024]
    return max(finite) if finite else None
