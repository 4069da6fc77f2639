"""Metric points from a job's output and a remaining-time estimate from their rate (pure, no I/O)."""
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.events import Eta, LogLine
from shared.jobs import MetricSpec
from shared.safe_regex import Pattern, clip, compile_metric
from services.estimator.model.mllog import LogRecord, parse_mllog_line

METRICS_PREFIX = "TRAINMASTER_METRICS "  # written by services/agent/sdk/trainmaster_task.report
WINDOW = 50  # recent points the rate is fitted on
MIN_POINTS = 3


@dataclass(frozen=True)
class MetricPoint:
    name: str
    t: float
    value: float
    step: float | None = None


def parse_line(line: str, t: float, metrics: list[MetricSpec], patterns: list[Pattern | None],
               record: LogRecord | None = None) -> list[MetricPoint]:
    """Every metric value the line carries: the job's regexes (RE2, on the line's first MAX_LINE_CHARS), and MLLOG
    key/value records (`record`: the line's MLLOG record when the caller has parsed it already)."""
    points = []
    head = clip(line)
    for spec, pattern in zip(metrics, patterns):
        match = pattern.search(head) if pattern is not None else None
        if not match:
            continue
        groups = match.groupdict()
        raw = groups.get("value")
        try:
            value = float(raw)
            step = float(groups["step"]) if groups.get("step") else None
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            points.append(MetricPoint(spec.name, t, value, step))
    if line.startswith(METRICS_PREFIX):
        try:
            report = json.loads(line[len(METRICS_PREFIX):])
        except json.JSONDecodeError:
            report = {}
        step = report.get("step") if isinstance(report.get("step"), int | float) else None
        points += [MetricPoint(name, t, float(value), step) for name, value in report.items()
                   if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)]
    record = record or parse_mllog_line(line)
    if record is not None and isinstance(record.value, int | float) and not isinstance(record.value, bool):
        points.append(MetricPoint(record.key, t, float(record.value), record.progress()))
    return points


@dataclass
class JobTracker:
    """Everything the estimator knows of one running job."""

    metrics: list[MetricSpec]
    points: dict[str, list[MetricPoint]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.patterns = [_compiled(m.regex) for m in self.metrics]

    def observe(self, line: LogLine, record: LogRecord | None = None) -> list[MetricPoint]:
        found = parse_line(line.line, line.t, self.metrics, self.patterns, record)
        for point in found:
            self.points.setdefault(point.name, []).append(point)
        return found

    def estimate(self, now: float) -> Eta | None:
        """Time until the slowest targeted metric reaches its target, by the trend of its recent values."""
        estimates = [e for spec in self.metrics if spec.target is not None
                     if (e := _eta_for(self.points.get(spec.name, []), spec, now))]
        return max(estimates, key=lambda e: e.remaining_s) if estimates else None


def _compiled(regex: str) -> Pattern | None:
    """The metric's RE2 program; None for a pattern stored before submissions were checked under RE2."""
    try:
        return compile_metric(regex)
    except ValueError:
        return None


def _eta_for(points: list[MetricPoint], spec: MetricSpec, now: float) -> Eta | None:
    recent = points[-WINDOW:]
    if len(recent) < MIN_POINTS:
        return None
    first, last = points[0], recent[-1]
    reached = last.value <= spec.target if spec.mode == "min" else last.value >= spec.target
    remaining = 0.0
    slope, spread = _trend(recent)
    if not reached:
        toward = (spec.target - last.value) * slope
        if slope == 0 or toward <= 0:
            return None
        remaining = max(0.0, (spec.target - last.value) / slope - (now - last.t))
    total = abs(spec.target - first.value)
    progress = min(1.0, max(0.0, abs(last.value - first.value) / total)) if total else None
    relative = min(1.0, spread)
    return Eta(remaining_s=remaining, finish_time=datetime.fromtimestamp(now + remaining, UTC),
               low_s=remaining * (1 - relative / 2), high_s=remaining * (1 + relative), method="rate",
               progress=progress, updated_at=datetime.fromtimestamp(now, UTC))


def _trend(points: list[MetricPoint]) -> tuple[float, float]:
    """Least-squares slope of value over time and its relative standard error."""
    n = len(points)
    mean_t = sum(p.t for p in points) / n
    mean_v = sum(p.value for p in points) / n
    var_t = sum((p.t - mean_t) ** 2 for p in points)
    if var_t == 0:
        return 0.0, 1.0
    slope = sum((p.t - mean_t) * (p.value - mean_v) for p in points) / var_t
    residual = sum((p.value - mean_v - slope * (p.t - mean_t)) ** 2 for p in points) / max(1, n - 2)
    error = math.sqrt(residual / var_t)
    return slope, (error / abs(slope) if slope else 1.0)
