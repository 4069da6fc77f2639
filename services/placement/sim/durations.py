"""Where the simulated placement's duration estimates come from: the trace (oracle or log-normal error) or history."""

import math
import statistics
from collections import deque
from dataclasses import replace

from services.placement.policy import JobRequest

HISTORY_KEEP = 20  # finished run times remembered per user (resource shape)
HISTORY_MIN = 3  # fewer than this: fall back to the owner's expectation
OWNER_SIGMA = 0.5  # how far an owner's guess is assumed to be off when nothing better is known


class DurationSource:
    """`trace`: the job's own expected duration (exact, or with the trace's log-normal error and its sigma)."""

    name = "trace"

    def estimate(self, job: JobRequest) -> JobRequest:
        return job

    def observe(self, job: JobRequest, run_time_s: float) -> None:
        """A job finished after `run_time_s` (at the reference speed)."""


class HistorySource(DurationSource):
    """Like the estimator: the median of the user's recent run times, its spread as the uncertainty; the owner's
    expectation (assumed sigma `OWNER_SIGMA`) until the user has history."""

    name = "history"

    def __init__(self) -> None:
        self.history: dict[str, deque[float]] = {}

    def estimate(self, job: JobRequest) -> JobRequest:
        seen = self.history.get(job.user)
        if seen is None or len(seen) < HISTORY_MIN:
            return replace(job, duration_sigma=max(job.duration_sigma, OWNER_SIGMA))
        logs = [math.log(max(v, 1.0)) for v in seen]
        return replace(
            job, predicted_duration_s=math.exp(statistics.median(logs)), duration_sigma=statistics.pstdev(logs)
        )

    def observe(self, job: JobRequest, run_time_s: float) -> None:
        self.history.setdefault(job.user, deque(maxlen=HISTORY_KEEP)).append(run_time_s)


SOURCES = {"trace": DurationSource, "history": HistorySource}
