"""Parse training log lines: MLPerf `:::MLLOG {json}` records and user regex metrics."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from shared.safe_regex import Pattern, clip, compile_metric, value_group

MLLOG_PREFIX = ":::MLLOG "
MAX_KEY_CHARS = 128  # a record's key names a metric: a longer one is no metric anyone declared
MAX_DEPTH = 3  # metadata and values nest this deep at most in real logs; deeper parts are dropped

# Metadata keys that carry training progress, in order of preference.
PROGRESS_KEYS = ("samples_count", "epoch_num", "step_num")


@dataclass(frozen=True)
class LogRecord:
    """One `:::MLLOG` record."""

    key: str
    value: Any
    time_ms: int
    metadata: dict = field(default_factory=dict)

    def progress(self) -> float | None:
        """Progress (samples, epochs or steps) carried in the metadata, if any."""
        for name in PROGRESS_KEYS:
            if (val := finite(self.metadata.get(name))) is not None:
                return val
        return None


# Records whose progress marks work already done; an epoch_start announces work about to start.
MARK_KEYS = frozenset({"eval_accuracy", "epoch_stop", "block_stop", "tracked_stats"})
KITS19_CASES_PER_EPOCH = 168.0


def mark_progress(rec: LogRecord, benchmark: str, batch_size: float = 0.0) -> float | None:
    """Progress a record marks, in the benchmark's majority unit (None when it marks none).

    The corpus loader and the live estimator both read logs through this, so a running job's
    progress is in the units the history model learned. Which keys agree with the eval progress
    was checked against the v3.1/v4.0 logs: tracked_stats `step` and block_stop
    `first_epoch_num` alone use other units.
    """
    if rec.key not in MARK_KEYS:
        return None
    md = rec.metadata
    if rec.key == "tracked_stats":
        value = md.get("epoch_num")
    elif rec.key == "epoch_stop":
        value = md.get("epoch_num")
        # ssd counts epochs from 0 at epoch_stop but from 1 at eval.
        value = value + 1 if benchmark == "ssd" and _is_num(value) else value
    elif rec.key == "block_stop":
        value = md.get("samples_count")
        if value is None and _is_num(md.get("first_epoch_num")) and _is_num(md.get("epoch_count")):
            value = md["first_epoch_num"] + md["epoch_count"]
    else:
        value = md.get("samples_count", md.get("epoch_num"))
        if benchmark == "stable_diffusion":
            value = md.get("samples_count")
        if value is None and _is_num(md.get("step_num")) and benchmark == "stable_diffusion":
            value = md["step_num"] * batch_size
    if not _is_num(value):
        return None
    # unet3d: some logs count epochs, most count samples.
    if benchmark == "unet3d" and value < 1e4:
        value *= KITS19_CASES_PER_EPOCH
    return finite(value)


def _is_num(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> float | None:
    """A number a log line carried as a finite float; None for anything else (a bool, a string, NaN, infinity, an
    integer past float's range)."""
    if not _is_num(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _clean(value: Any, depth: int = 0) -> Any:
    """A parsed JSON value with every number a finite float or a small-enough int, and no deeper than MAX_DEPTH:
    whatever reads a record afterwards does arithmetic on it without a care."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        number = finite(value)
        return None if number is None else value if isinstance(value, int) else number
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value]
    return None


def parse_json(text: str) -> Any:
    """A JSON value from untrusted text, numbers cleaned (`_clean`); None when it does not parse (too deep, an
    integer of more digits than Python converts, invalid)."""
    try:
        return _clean(json.loads(text))
    except (ValueError, RecursionError):
        return None


def parse_mllog_line(line: str) -> LogRecord | None:
    """Return the record of a `:::MLLOG {json}` line, or None for any other line."""
    start = line.find(MLLOG_PREFIX)
    if start < 0:
        return None
    obj = parse_json(line[start + len(MLLOG_PREFIX) :])
    if not isinstance(obj, dict) or not isinstance(obj.get("key"), str) or len(obj["key"]) > MAX_KEY_CHARS:
        return None
    metadata = obj.get("metadata")
    time_ms = finite(obj.get("time_ms"))
    if time_ms is None:
        return None
    return LogRecord(
        key=obj["key"],
        value=obj.get("value"),
        time_ms=int(time_ms),
        metadata=metadata if isinstance(metadata, dict) else {},
    )


@dataclass(frozen=True)
class MetricSpec:
    """A metric read from free-form log lines with a regex.

    The regex has a named group `value` or exactly one unnamed group (`shared.safe_regex.value_group`); an
    optional named group `step` gives the progress (step, epoch or samples) at which the value was logged.
    """

    name: str
    regex: str

    def compiled(self) -> Pattern:
        try:
            return compile_metric(self.regex)  # RE2: linear in the line, whoever wrote the pattern
        except ValueError as exc:
            raise ValueError(f"metric {self.name!r}: {exc}") from exc


@dataclass(frozen=True)
class MetricPoint:
    """One metric value found in a log line."""

    name: str
    value: float
    step: float | None = None


class RegexMetricParser:
    """Extract metric points from log lines with a list of `MetricSpec`."""

    def __init__(self, specs: list[MetricSpec]) -> None:
        self._specs = [(spec.name, spec.compiled()) for spec in specs]

    def parse(self, line: str) -> list[MetricPoint]:
        """Return every metric point the line holds (at most one per spec)."""
        points = []
        for name, pattern in self._specs:
            match = pattern.search(clip(line))
            if match is None:
                continue
            value = _to_float(match.group(value_group(pattern)))
            if value is None:
                continue
            step = _to_float(match.group("step")) if "step" in pattern.groupindex else None
            points.append(MetricPoint(name=name, value=value, step=step))
        return points


def _to_float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return finite(float(raw))
    except ValueError:
        return None
