"""One job's estimate: its metric points, what is known of it (features), and the online estimator (pure)."""

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.events import Eta, LogLine
from shared.jobs import MetricSpec, Parameter
from services.estimator.model import HistoryPredictor, JobFeatures, OnlineEstimator, parse_mllog_line
from services.estimator.model.mllog import MLLOG_PREFIX, LogRecord, mark_progress
from services.estimator.model.owncorpus import MIN_TRUTH_POINTS as MIN_CASE_POINTS
from services.estimator.model.owncurve import reached
from services.estimator.model.printed import DECLARED_UNITS, PrintedWork
from services.estimator.model.targets import TARGETS, metric_scalar
from services.estimator.tracker import METRICS_PREFIX, JobTracker, MetricPoint

# MLLOG header keys that describe the run (MLPerf logs carry them before training starts).
FEATURE_KEYS = {
    "submission_benchmark": "benchmark",
    "global_batch_size": "batch_size",
    "opt_base_learning_rate": "learning_rate",
    "opt_learning_rate": "learning_rate",
}
# Job parameters that name the same features, for scripts that do not write MLLOG.
PARAMETER_KEYS = {
    "benchmark": "benchmark",
    "task": "benchmark",
    "batch_size": "batch_size",
    "learning_rate": "learning_rate",
    "lr": "learning_rate",
}
# Parameters declaring the amount of work, in the units the job reports its progress in (its `step` group or
# MLLOG epoch/samples): with it, the live rate alone gives an estimate, whatever the job is. A script may also
# report it (`trainmaster_task.report(step=..., total_steps=...)`, the same units as its `step`); what the spec
# declares comes first.
WORK_KEYS = (
    "max_steps",
    "total_steps",
    "num_steps",
    "epochs",
    "num_epochs",
    "max_epochs",
    "train_samples",
    "total_samples",
)
MAX_WORK = 1e15
# Parameters naming the hardware the features refer to (a replay of another system's run, say); they win over
# the node's own GPUs.
HARDWARE_KEYS = ("accelerator", "accelerators", "nodes")
MAX_SEEN = 1024  # observations kept to rebuild the online estimator (a newer model, completed features)
OWN_RUN_POINTS = 120  # a completed job's curve as the own-jobs corpus keeps it (its recorder keeps 60 a run)
OWN_RUN_SEEDS = 5  # as the recorded runs: a job's seed (from its id) in 0-4, and seed 4 is held out of calibration


@dataclass
class JobModel:
    metrics: list[MetricSpec]
    parameters: list[Parameter] = field(default_factory=list)
    tracker: JobTracker = field(init=False)
    features: dict[str, str | float] = field(default_factory=dict)
    started_at: float | None = None
    accelerator: str = "unknown"
    tflops: float | None = None  # the node's GPU speed as placement recorded it (measured, bounded); None: table's
    gpus: int = 1
    nodes: int = 1
    online: OnlineEstimator | None = None
    # MLLOG `run_start`: the timed run begins after initialisation; history durations are measured from it.
    run_started_at: float | None = None
    built_from: tuple | None = None  # (model version, features, start) the online estimator was built with
    seen: list[tuple[float, float | None, float | None]] = field(default_factory=list)  # (t, progress, value)
    work_source: str | None = None  # who said how much work the job is: declaration, sdk
    printed: PrintedWork | None = None  # the progress its output shows (tqdm, Keras, ...), without declaration
    progress_line: bool = False  # the last line fed carried printed progress

    def __post_init__(self) -> None:
        self.tracker = JobTracker(self.metrics)
        for p in self.parameters:
            if p.name in PARAMETER_KEYS:
                self._feature(PARAMETER_KEYS[p.name], p.value)
            elif p.name in WORK_KEYS and "total_work" not in self.features:
                self._feature("total_work", p.value)
                self.work_source = "declaration" if "total_work" in self.features else None

    def started(self, *, at: float, accelerator: str, gpus: int, nodes: int) -> None:
        self.started_at = self.started_at or at
        declared = {p.name: p.value for p in self.parameters if p.name in HARDWARE_KEYS}
        self.accelerator = declared.get("accelerator") or accelerator or "unknown"
        self.gpus = _count(declared.get("accelerators"), gpus)
        self.nodes = _count(declared.get("nodes"), nodes)

    def carried_progress(self) -> bool:
        """Whether the last line fed carried printed progress (stored, like metric lines, to be replayed)."""
        return self.progress_line

    def observe(self, line: LogLine) -> list:
        """Feed one output line; returns the metric points it carried (for storage). All of its reading is paid from
        the job's budget (`MatchBudget`): only its patterns' searches were, and a job whose every line carried 64
        JSON metrics read freely held the reader that every job's lines wait on (found by review). A line past the
        budget is not read (counted, said)."""
        budget = self.tracker.budget
        if not budget.admit():
            self.progress_line = False
            return []
        before, began = budget.tokens, budget.cpu()
        try:
            return self._observe(line)
        finally:  # the searches paid their own part already
            budget.charge(max(budget.cpu() - began - (before - budget.tokens), 0.0))

    def _observe(self, line: LogLine) -> list:
        record = parse_mllog_line(line.line)
        points = self.tracker.observe(line, record)
        if line.line.startswith(METRICS_PREFIX) and "total_work" not in self.features:
            # `trainmaster_task.report(total_steps=...)`; a metric the spec names so (its regex may capture the
            # epoch reached, not the epochs to run) is the job's curve, not its amount of work
            own = {spec.name for spec in self.metrics}
            declared = next((p.value for p in points if p.name in WORK_KEYS and p.name not in own), None)
            if declared is not None:
                self._feature("total_work", declared)
                self.work_source = "sdk" if "total_work" in self.features else None
        if self.started_at is None:
            self.started_at = line.t
        if self.printed is None:
            self.printed = PrintedWork(start=self.started_at, declared=self._declared_work())
        self.progress_line = (
            record is None
            and not line.line.startswith((METRICS_PREFIX, MLLOG_PREFIX))
            and self.printed.observe(line.line, line.t)
        )
        if record is not None and record.key in FEATURE_KEYS:
            self._feature(FEATURE_KEYS[record.key], record.value)
        if record is not None and record.key == "run_start" and self.run_started_at is None:
            self.run_started_at = line.t
        seen = self._observation(record, points)
        if seen is not None:
            self.seen.append((line.t, *seen))
            if len(self.seen) > MAX_SEEN:  # older half thinned: a rebuild replays the shape, not every step
                half = len(self.seen) // 2
                self.seen = self.seen[:half:2] + self.seen[half:]
            if self.online is not None:
                self.online.observe(line.t, progress=seen[0], metric_value=seen[1])
        return points

    def _observation(
        self, record: LogRecord | None, points: list[MetricPoint]
    ) -> tuple[float | None, float | None] | None:
        """(progress, target metric value) a line carries for the online estimator."""
        target = self._target()
        benchmark = self.features.get("benchmark")
        if record is not None and benchmark:
            # An MLPerf-style log: progress and metric read exactly as the corpus the model learned from.
            progress = mark_progress(record, str(benchmark), float(self.features.get("batch_size", 0) or 0))
            value = None
            if target and record.key == target[0]:
                value = metric_scalar(str(benchmark), record.value, record.metadata)
            return None if progress is None and value is None else (progress, value)
        for point in points:
            if target and point.name == target[0]:  # the metric point carries its progress too
                return point.step, point.value
        # Any metric's step marks progress (a job with a declared amount of work and no target, say).
        progress = next((p.step for p in points if p.step is not None), None)
        if progress is None and record is not None:
            progress = record.progress()
        return None if progress is None else (progress, None)

    def estimate(self, now: float, predictor: HistoryPredictor | None, version: int | None) -> Eta | None:
        """The estimate shown: what the job declares (its amount of work, its target) or reports comes first, its
        printed progress gives the time to its end otherwise; a declared target says whether it was reached (the
        time then runs to the job's end, where known) or cannot be before the job's end."""
        eta = self._estimate(now, predictor, version)
        end = self._printed_eta(now)
        spec = self._declared()
        if spec is None:
            chosen = eta if eta is not None and (self.work_source or self.features.get("benchmark")) else end or eta
            return self._shown(chosen, until="end", target=None)
        if spec.target is not None and reached(
            [p.value for p in self.tracker.points.get(spec.name, [])], target=spec.target, mode=spec.mode
        ):
            return self._shown(end or eta, until="end" if end else "target", target="reached")
        if eta is not None and self.work_source and self.online is not None:
            # a declared amount of work: the online estimate is the time to its end, the curve the time to target
            end, eta = end or eta, self.tracker.estimate(now, start=self.started_at) or eta
        if eta is not None and end is not None and eta.remaining_s > end.remaining_s and eta is not end:
            return self._shown(end, until="end", target="unreachable")
        if eta is None or eta is end:  # nothing says when the target comes yet: the time to the end, if known
            return self._shown(end, until="end", target="ahead")
        return self._shown(eta, until="target", target="ahead")

    def _shown(self, eta: Eta | None, *, until: str, target: str | None) -> Eta | None:
        """The estimate with what is known of the job's progress: done, total, unit, rate and who said so."""
        if eta is None:
            return None
        fields: dict = {"until": until, "target": target}
        printed = self.printed.progress if self.printed is not None else None
        printed_rate = self.printed.rate() if self.printed is not None else None
        if self.work_source or self.features.get("benchmark"):
            done = next((p for _, p, _ in reversed(self.seen) if p is not None), None)
            total = self.features.get("total_work")
            rate = self.online.rate() if self.online is not None else None
            declared = self._declared_work()
            unit = declared[0] if declared else ("step" if self.work_source == "sdk" else None)
            fields |= {
                "done": done,
                "total": total,
                "unit": unit,
                "rate": rate[0] if rate else None,
                "source": self.work_source or "mllog",
            }
        elif printed is not None:
            fields |= {
                "done": printed.done,
                "total": printed.total,
                "unit": printed.unit,
                "rate": printed_rate,
                "source": printed.source,
            }
        for name in ("done", "total", "rate"):  # a job's own numbers: shown only when they are sane
            value = fields.get(name)
            if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_WORK):
                fields[name] = None
        if fields.get("done") is not None and fields.get("total"):
            fields["progress"] = min(1.0, fields["done"] / fields["total"])
        return eta.model_copy(update=fields)

    def _printed_eta(self, now: float) -> Eta | None:
        """Time to the job's end at the rate its printed progress moves."""
        e = self.printed.estimate(now) if self.printed is not None else None
        if e is None or not all(math.isfinite(v) for v in (e.remaining_s, e.low_s, e.high_s)):
            return None
        remaining = max(0.0, e.remaining_s)
        return Eta(
            remaining_s=remaining,
            finish_time=datetime.fromtimestamp(now + remaining, UTC),
            low_s=max(0.0, min(e.low_s, remaining)),
            high_s=max(e.high_s, remaining),
            method="rate",
            updated_at=datetime.fromtimestamp(now, UTC),
        )

    def _declared_work(self) -> tuple[str, float] | None:
        """(unit, amount) of the work a spec parameter declares, when its name says the unit."""
        named = next((p for p in self.parameters if p.name in DECLARED_UNITS), None)
        work = self.features.get("total_work")
        return (DECLARED_UNITS[named.name], float(work)) if named is not None and work else None

    def _estimate(self, now: float, predictor: HistoryPredictor | None, version: int | None) -> Eta | None:
        """The blended estimate once something is known (a history prior, a declared amount of work); a job that
        only declares a target gets the estimate of its own curve, with the band learned on real curves."""
        self._ensure_online(predictor, version)
        declared = any(spec.target is not None for spec in self.metrics)
        if declared and (self.online is None or (self.online.prior is None and self.online.total_work is None)):
            return self.tracker.estimate(now, start=self.started_at)
        if self.online is not None:
            e = self.online.estimate(now)
            if e.method not in ("none",) and all(math.isfinite(v) for v in (e.remaining_s, e.low_s, e.high_s)):
                remaining = max(0.0, e.remaining_s)
                return Eta(
                    remaining_s=remaining,
                    finish_time=datetime.fromtimestamp(now + remaining, UTC),
                    low_s=max(0.0, min(e.low_s, remaining)),
                    high_s=max(e.high_s, remaining),
                    method=e.method,
                    progress=self._progress(now, remaining),
                )
        return self.tracker.estimate(now)

    def history_run(self, *, job_id: str, project: str, start: float, end: float) -> dict | None:
        """The completed job as a corpus run (`corpus.Run`'s fields), read as the corpus reads a log: its
        observations are the progress marks and target-metric values the online estimator saw, not every number
        the output carried; None when it has no features or nothing was observed."""
        features = self.job_features()
        if features is None or not self.seen:
            return None
        start = self.run_started_at or start  # MLPerf durations run from run_start, after initialisation
        run = {
            "run_id": job_id,
            "version": "trainmaster",
            "submitter": project,
            "system": features.accelerator,
            "benchmark": features.benchmark,
            "accelerator": features.accelerator,
            "accelerators_per_node": max(1, features.accelerators // features.nodes),
            "nodes": features.nodes,
            "batch_size": features.batch_size,
            "learning_rate": features.learning_rate,
            "run_start_ms": int(start * 1000),
            "run_stop_ms": int(end * 1000),
            "status": "success",
            "observations": [
                {"t_s": t - start, "progress": progress, "value": value}
                for t, progress, value in self.seen
                if t >= start
            ],
        }
        if (target := self._target()) is not None:  # a declared target makes a new benchmark learnable
            run |= {"target_value": target[1], "target_mode": target[2]}
        return run

    def own_run(self, *, job_id: str, start: float, end: float) -> dict | None:
        """The completed job as a run of the own-jobs corpus (`owncorpus`'s shape) when it declared a target: its
        target metric as `loss` (to minimise) or `val_acc` (to maximise), at most OWN_RUN_POINTS points evenly
        over the run with its last, steps as printed or else the count of points; None without a target or with
        too few points to ever make a case."""
        spec = self._declared()
        points = [p for p in self.tracker.points.get(spec.name, []) if start <= p.t <= end] if spec else []
        if spec is None or len(points) <= MIN_CASE_POINTS:
            return None
        kept: Sequence[int] = range(len(points))
        if len(points) > OWN_RUN_POINTS:
            every = (len(points) - 1) / (OWN_RUN_POINTS - 1)
            kept = [round(i * every) for i in range(OWN_RUN_POINTS)]
        counted = any(p.step is None for p in points)  # then a point's step is its place among all the job's
        key = "loss" if spec.mode == "min" else "val_acc"
        return {
            "run": job_id,
            "group": "trainmaster",
            "params": {"seed": zlib.crc32(job_id.encode()) % OWN_RUN_SEEDS},
            "points": [
                {"t": points[i].t - start, "step": float(i + 1) if counted else points[i].step, key: points[i].value}
                for i in kept
            ],
            "wall_s": end - start,
            "machine": self.accelerator,
        }

    def job_features(self) -> JobFeatures | None:
        benchmark = self.features.get("benchmark")
        if not benchmark:
            return None
        return JobFeatures(
            benchmark=str(benchmark),
            batch_size=float(self.features.get("batch_size", 0) or 0),
            learning_rate=float(self.features.get("learning_rate", 0) or 0),
            accelerator=self.accelerator,
            accelerators=self.gpus * self.nodes,
            nodes=self.nodes,
            tflops=self.node_tflops(),
        )

    def node_tflops(self) -> float | None:
        """The placed node's GPU speed, unless the job declares other hardware (a replay of another system)."""
        declared = any(p.name == "accelerator" for p in self.parameters)
        return None if declared else self.tflops

    def _ensure_online(self, predictor: HistoryPredictor | None, version: int | None) -> None:
        """(Re)build the online estimator when a target is known, or when a newer history model arrives."""
        target = self._target()
        features = self.job_features()
        with_prior = predictor is not None and features is not None
        start = self.run_started_at or self.started_at or 0.0
        # Rebuilt when a newer model arrives, when the log completes the features (the batch size comes a few
        # lines after the benchmark, the amount of work when the script reports it), or when the timed run begins:
        # the prior is for what is known now.
        built_from = (version if with_prior else None, features, start, self.features.get("total_work"))
        if self.online is not None and self.built_from == built_from:
            return
        work = self.features.get("total_work")
        if target is None and not with_prior and not work:
            return
        prior = predictor.prior(features) if predictor is not None and features is not None else None
        self.built_from = built_from
        self.online = OnlineEstimator(
            start_time=start,
            target=target[1] if target else None,
            mode=target[2] if target else "max",
            prior=prior,
            total_work=float(work) if work else None,
            calibration=predictor.blend if predictor is not None and features is not None else None,
            key=features.benchmark if features else None,
        )
        for t, progress, value in self.seen:  # replay what was seen before
            self.online.observe(t, progress=progress, metric_value=value)

    def _declared(self) -> MetricSpec | None:
        """The first metric the job declares a target for."""
        return next((spec for spec in self.metrics if spec.target is not None), None)

    def _target(self) -> tuple[str, float, str] | None:
        """(metric name, target, mode): the job's own, else MLPerf's for its benchmark."""
        if (spec := self._declared()) is not None and spec.target is not None:
            return spec.name, spec.target, spec.mode
        benchmark = self.features.get("benchmark")
        if benchmark in TARGETS:
            return "eval_accuracy", TARGETS[benchmark].value, TARGETS[benchmark].mode
        return None

    def _progress(self, now: float, remaining: float) -> float | None:
        if self.started_at is None:
            return None
        elapsed = max(0.0, now - self.started_at)
        return elapsed / (elapsed + remaining) if elapsed + remaining > 0 else None

    def _feature(self, name: str, value: object) -> None:
        """Keep a feature only when it is sane: a short name, or a finite, positive, bounded number."""
        if name == "benchmark":
            text = str(value).strip().lower()[:64]
            if text:
                self.features[name] = text
            return
        if not isinstance(value, str | int | float):  # a list, an object or null where a number belongs
            return
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return
        if math.isfinite(number) and 0 < number <= MAX_WORK:
            self.features[name] = number


MAX_COUNT = 100_000  # accelerators or nodes a job may declare: no fleet has more


def _count(declared: str | None, placed: int) -> int:
    """A declared count where it is a whole, finite number from 1 to MAX_COUNT, else the placed one (`abc`, `nan`,
    `inf` and `1e308` raised at the start, or made a 300-digit count that overflowed the hardware features: every
    estimate of the job failed)."""
    try:
        number = float(declared) if declared is not None else float("nan")
    except ValueError:
        number = float("nan")
    return int(number) if 1 <= number <= MAX_COUNT else max(int(placed), 1)
