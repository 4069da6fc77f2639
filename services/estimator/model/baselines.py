"""Reference estimators the harness scores the blend against (no I/O; fitted on training runs)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Protocol

import numpy as np

from services.estimator.model.corpus import Run
from services.estimator.model.curves import FAMILIES, crossing, fit_family
from services.estimator.model.online import OnlineEstimator


class Baseline(Protocol):
    def total(self, run: Run, now: float, est: OnlineEstimator) -> float | None:
        """The run's predicted total duration (seconds) at `now`, None when the method has no answer."""
        ...


def capped(total: float, now: float) -> float:
    """Same sanity cap as the online estimator: no more than 20x the elapsed time."""
    return min(max(total, now), 20.0 * now)


class MedianDuration:
    """Median training duration of the benchmark, ignoring the live run."""

    def __init__(self, train: list[Run]):
        by = defaultdict(list)
        for r in train:
            by[r.benchmark].append(r.duration_s)
        self.median = {b: statistics.median(v) for b, v in by.items()}
        self.all = statistics.median(r.duration_s for r in train)

    def total(self, run: Run, now: float, _est: OnlineEstimator) -> float:
        return max(self.median.get(run.benchmark, self.all), now)


class WorkOverThroughput:
    """Median work to target of (benchmark, batch size) in history / live throughput."""

    def __init__(self, train: list[Run]):
        self.fallback = MedianDuration(train)
        by: dict[tuple[str, float], list[float]] = defaultdict(list)
        by_b: dict[str, list[float]] = defaultdict(list)
        for r in train:
            if r.total_work is None:  # a run that never showed its work (the harness trains on usable runs only)
                continue
            by[(r.benchmark, r.batch_size)].append(r.total_work)
            by_b[r.benchmark].append(r.total_work)
        self.work = {k: statistics.median(v) for k, v in by.items()}
        self.work_b = {k: statistics.median(v) for k, v in by_b.items()}

    def total(self, run: Run, now: float, est: OnlineEstimator) -> float:
        work = self.work.get((run.benchmark, run.batch_size), self.work_b.get(run.benchmark))
        live = est.rate()
        if work is None or live is None:
            return self.fallback.total(run, now, est)
        rate, t_last, p_last = live
        return capped(t_last + max(work - p_last, 0.0) / rate, now)


class CurveOnly:
    """Optimus-style fit of metric vs progress alone, extrapolated with live throughput."""

    def __init__(self, family: str = "optimus") -> None:
        self.family = family

    def total(self, run: Run, now: float, est: OnlineEstimator) -> float | None:
        live = est.rate()
        x, y = np.asarray(est._metric_x), np.asarray(est._metric_y)
        if live is None or run.target is None or len(x) < len(FAMILIES[self.family].p0) + 1:
            return None
        scale = float(x.max())
        fit = fit_family(self.family, x / scale, y)
        target = run.target if run.mode == "max" else -run.target
        cross = crossing(self.family, fit.params, target) * scale if fit else math.inf
        if not math.isfinite(cross):
            return None
        rate, t_last, p_last = live
        return capped(t_last + max(cross - p_last, 0.0) / rate, now)
