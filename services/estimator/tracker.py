"""Metric points from a job's output and a remaining-time estimate from its own curve (pure, no I/O)."""

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache

from shared.events import Eta, LogLine
from shared.jobs import MetricSpec
from shared.safe_regex import Match, MatchBudget, Pattern, clip, compile_metric, value_group
from services.estimator.model.curveprior import blendtable, net as priornet
from services.estimator.model.curveprior.estimate import estimate
from services.estimator.model.mllog import MAX_KEY_CHARS, LogRecord, finite, parse_json, parse_mllog_line
from services.estimator.model.owncurve import load_calibration

METRICS_PREFIX = "TRAINMASTER_METRICS "  # written by services/agent/sdk/trainmaster_task.report
MAX_CURVE_POINTS = 240  # points an estimate reads (older ones thinned): one estimate stays a few ms
RECENT_KEPT = 40
MAX_KEPT = 4096  # points kept per metric; past it the older half is thinned to every second point
MAX_REPORTED = 64  # values read from one SDK report line
MAX_METRICS = 64  # metric names kept per job: a job printing a new name on every line grows no further (256 let
# one job hold ~190 MB of points: found by review)

# No metric of a training reads past this: larger values are noise or hostile (`1e308` less a target of `-1e308`
# overflowed the curve's arithmetic to NaN, and every estimate of the job failed; found by review)
MAX_METRIC_VALUE = 1e15


@dataclass(frozen=True, slots=True)
class MetricPoint:
    name: str
    t: float
    value: float
    step: float | None = None
    count: int | None = None  # its place among the job's points of this metric (1, 2, ...), set by the tracker


def parse_line(
    line: str,
    t: float,
    metrics: list[MetricSpec],
    patterns: list[Pattern | None],
    record: LogRecord | None = None,
    budget: MatchBudget | None = None,
) -> list[MetricPoint]:
    """Every metric value the line carries: the job's regexes (RE2, on the line's first MAX_LINE_CHARS, within the
    job's `budget` of CPU when given), the SDK's `TRAINMASTER_METRICS {json}` reports and MLLOG key/value records
    (`record`: the line's MLLOG record when the caller has parsed it already). Whatever the line holds, a value that
    is no finite number, or past MAX_METRIC_VALUE, is skipped alone."""
    points = []
    head = clip(line)
    search = budget.search if budget is not None else (lambda pattern, text: pattern.search(text))
    for spec, pattern in zip(metrics, patterns):
        if pattern is not None and (match := search(pattern, head)):
            points += _matched(spec.name, t, match, value_group(pattern), "step" in pattern.groupindex)
    if line.startswith(METRICS_PREFIX):
        points += _reported(parse_json(line[len(METRICS_PREFIX) :]), t)
    record = record or parse_mllog_line(line)
    if record is not None and (value := finite(record.value)) is not None:
        points.append(MetricPoint(record.key, t, value, record.progress()))
    return [p for p in points if abs(p.value) <= MAX_METRIC_VALUE]


def _matched(name: str, t: float, match: Match, group: str | int, has_step: bool) -> list[MetricPoint]:
    value = _number(match.group(group))
    step = _number(match.group("step")) if has_step else None
    return [] if value is None else [MetricPoint(name, t, value, step)]


def _number(text: str | None) -> float | None:
    try:
        return finite(float(text)) if text else None
    except ValueError:
        return None


def _reported(report: object, t: float) -> list[MetricPoint]:
    """The points of an SDK report: its finite numbers by name (at most MAX_REPORTED), `step` their progress."""
    if not isinstance(report, dict):
        return []
    step = finite(report.get("step"))
    return [
        MetricPoint(name, t, value, step)
        for name, raw in list(report.items())[:MAX_REPORTED]
        if len(name) <= MAX_KEY_CHARS and (value := finite(raw)) is not None
    ]


@dataclass
class JobTracker:
    """Everything the estimator knows of one running job."""

    metrics: list[MetricSpec]
    points: dict[str, list[MetricPoint]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # points seen per metric, thinned ones included

    def __post_init__(self) -> None:
        self.patterns = [_compiled(m.regex) for m in self.metrics]
        self.budget = MatchBudget()  # the CPU its patterns may take here

    def observe(self, line: LogLine, record: LogRecord | None = None) -> list[MetricPoint]:
        found = parse_line(line.line, line.t, self.metrics, self.patterns, record, self.budget)
        for point in found:
            if point.name not in self.points and len(self.points) >= MAX_METRICS:
                continue
            kept = self.points.setdefault(point.name, [])
            self.counts[point.name] = self.counts.get(point.name, 0) + 1
            kept.append(replace(point, count=self.counts[point.name]))
            if len(kept) > MAX_KEPT:
                half = len(kept) // 2
                kept[:] = kept[:half:2] + kept[half:]
        return found

    def estimate(self, now: float, start: float | None = None) -> Eta | None:
        """Time until the slowest targeted metric reaches its target, from its own curve so far (`start`: when the
        job started; its first point otherwise)."""
        estimates = [
            e
            for spec in self.metrics
            if spec.target is not None
            if (e := eta_for(self.points.get(spec.name, []), spec, now, start=start))
        ]
        return max(estimates, key=lambda e: e.remaining_s) if estimates else None


def _compiled(regex: str) -> Pattern | None:
    """The metric's RE2 program; None for a pattern stored before submissions were checked under RE2."""
    try:
        return compile_metric(regex)
    except ValueError:
        return None


@cache
def calibration() -> dict | None:
    """The own-curve calibration shipped with the estimator (read once)."""
    return load_calibration()


@cache
def prior() -> priornet.PriorNet | None:
    """The curve prior shipped with the estimator (read once); None when it is missing."""
    return priornet.load()


@cache
def blend_table() -> blendtable.BlendTable | None:
    """The shipped blend of the prior and the fitted curve (read once); None: the former fixed blend."""
    return blendtable.load()


def eta_for(
    points: list[MetricPoint],
    spec: MetricSpec,
    now: float,
    *,
    start: float | None = None,
    table: dict | None = None,
    curve_prior: priornet.PriorNet | None | bool = True,
) -> Eta | None:
    """The own-curve estimate (`curveprior.estimate.estimate`, the curve prior blended with the fitted curve, what
    the harness scores) of one targeted metric; `curve_prior` True: the shipped prior, False: none (the fitted
    curve alone), or the prior to use."""
    if not points or spec.target is None:
        return None
    origin = min(start if start is not None else points[0].t, points[0].t)
    kept = _thinned(points)
    net = prior() if curve_prior is True else (curve_prior or None)
    est = estimate(
        [p.t - origin for p in kept],
        progress_marks(kept),
        [p.value for p in kept],
        target=spec.target,
        mode=spec.mode,
        elapsed=now - origin,
        calibration=table if table is not None else calibration(),
        prior=net,
        blend=True,
        table=blend_table(),
    )
    if est is None:
        return None
    elapsed = now - origin
    remaining = max(0.0, est.total_s - elapsed)
    return Eta(
        remaining_s=remaining,
        finish_time=datetime.fromtimestamp(now + remaining, UTC),
        low_s=max(0.0, min(est.low_s - elapsed, remaining)),
        high_s=max(est.high_s - elapsed, remaining),
        method=est.kind,
        progress=est.fraction,
        updated_at=datetime.fromtimestamp(now, UTC),
    )


def progress_marks(points: list[MetricPoint]) -> list[float] | None:
    """The points' progress: their steps, or where a line prints none, their count among the job's points (a script
    prints every so many steps: the count is its progress in those units, so the training's origin is read from
    the pace of its lines, not put at the job's start, before its imports and the device's set-up); None when
    neither is known for every point."""
    steps = [p.step for p in points]
    if None not in steps:
        return [float(s) for s in steps if s is not None]
    counts = [p.count for p in points]
    return None if None in counts else [float(c) for c in counts if c is not None]


def _thinned(points: list[MetricPoint]) -> list[MetricPoint]:
    """At most MAX_CURVE_POINTS: the most recent ones all, the older ones evenly over the run."""
    if len(points) <= MAX_CURVE_POINTS:
        return points
    older, recent = points[:-RECENT_KEPT], points[-RECENT_KEPT:]
    every = len(older) / (MAX_CURVE_POINTS - RECENT_KEPT)
    return [older[int(i * every)] for i in range(MAX_CURVE_POINTS - RECENT_KEPT)] + recent
