"""One job's estimate: its metric points, what is known of it (features), and the online estimator (pure)."""
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.events import Eta, LogLine
from shared.jobs import MetricSpec, Parameter
from services.estimator.model import HistoryPredictor, JobFeatures, OnlineEstimator, parse_mllog_line
from services.estimator.model.targets import TARGETS
from services.estimator.tracker import JobTracker

# MLLOG header keys that describe the run (MLPerf logs carry them before training starts).
FEATURE_KEYS = {"submission_benchmark": "benchmark", "global_batch_size": "batch_size",
                "opt_base_learning_rate": "learning_rate", "opt_learning_rate": "learning_rate"}
# Job parameters that name the same features, for scripts that do not write MLLOG.
PARAMETER_KEYS = {"benchmark": "benchmark", "task": "benchmark", "batch_size": "batch_size",
                  "learning_rate": "learning_rate", "lr": "learning_rate"}
# Parameters naming the hardware the features refer to (a replay of another system's run, say); they win over
# the node's own GPUs.
HARDWARE_KEYS = ("accelerator", "accelerators", "nodes")


@dataclass
class JobModel:
    metrics: list[MetricSpec]
    parameters: list[Parameter] = field(default_factory=list)
    tracker: JobTracker = field(init=False)
    features: dict[str, str | float] = field(default_factory=dict)
    started_at: float | None = None
    accelerator: str = "unknown"
    gpus: int = 1
    nodes: int = 1
    online: OnlineEstimator | None = None
    prior_version: int | None = None

    def __post_init__(self) -> None:
        self.tracker = JobTracker(self.metrics)
        for p in self.parameters:
            if p.name in PARAMETER_KEYS:
                self._feature(PARAMETER_KEYS[p.name], p.value)

    def started(self, *, at: float, accelerator: str, gpus: int, nodes: int) -> None:
        self.started_at = self.started_at or at
        declared = {p.name: p.value for p in self.parameters if p.name in HARDWARE_KEYS}
        self.accelerator = declared.get("accelerator") or accelerator or "unknown"
        self.gpus = max(int(float(declared.get("accelerators", gpus))), 1)
        self.nodes = max(int(float(declared.get("nodes", nodes))), 1)

    def observe(self, line: LogLine) -> list:
        """Feed one output line; returns the metric points it carried (for storage)."""
        points = self.tracker.observe(line)
        if self.started_at is None:
            self.started_at = line.t
        record = parse_mllog_line(line.line)
        if record is not None and record.key in FEATURE_KEYS:
            self._feature(FEATURE_KEYS[record.key], record.value)
        if self.online is None:
            return points
        target = self._target()
        for point in points:
            if target and point.name == target[0]:  # the metric point carries its progress too
                self.online.observe(line.t, progress=point.step, metric_value=point.value)
                return points
        if record is not None and (progress := record.progress()) is not None:
            self.online.observe(line.t, progress=progress)
        return points

    def estimate(self, now: float, predictor: HistoryPredictor | None, version: int | None) -> Eta | None:
        """The blended estimate once something is known; the plain rate estimate otherwise."""
        self._ensure_online(predictor, version)
        if self.online is not None:
            e = self.online.estimate(now)
            if e.method not in ("none",) and all(math.isfinite(v) for v in (e.remaining_s, e.low_s, e.high_s)):
                remaining = max(0.0, e.remaining_s)
                return Eta(remaining_s=remaining, finish_time=datetime.fromtimestamp(now + remaining, UTC),
                           low_s=max(0.0, min(e.low_s, remaining)), high_s=max(e.high_s, remaining),
                           method=e.method, progress=self._progress(now, remaining))
        return self.tracker.estimate(now)

    def job_features(self) -> JobFeatures | None:
        benchmark = self.features.get("benchmark")
        if not benchmark:
            return None
        return JobFeatures(benchmark=str(benchmark), batch_size=float(self.features.get("batch_size", 0) or 0),
                           learning_rate=float(self.features.get("learning_rate", 0) or 0),
                           accelerator=self.accelerator, accelerators=self.gpus, nodes=self.nodes)

    def _ensure_online(self, predictor: HistoryPredictor | None, version: int | None) -> None:
        """(Re)build the online estimator when a target is known, or when a newer history model arrives."""
        target = self._target()
        features = self.job_features()
        with_prior = predictor is not None and features is not None
        if self.online is not None and (not with_prior or self.prior_version == version):
            return
        if target is None and not with_prior:
            return
        prior = predictor.prior(features) if with_prior else None
        self.online = OnlineEstimator(start_time=self.started_at or 0.0, target=target[1] if target else None,
                                      mode=target[2] if target else "max", prior=prior,
                                      calibration=predictor.blend if with_prior else None,
                                      key=features.benchmark if features else None)
        self.prior_version = version if with_prior else None
        for name, points in self.tracker.points.items():  # replay what was seen before
            for p in points:
                self.online.observe(p.t, progress=p.step, metric_value=p.value if target and name == target[0]
                                    else None)

    def _target(self) -> tuple[str, float, str] | None:
        """(metric name, target, mode): the job's own, else MLPerf's for its benchmark."""
        for spec in self.metrics:
            if spec.target is not None:
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

    def _feature(self, name: str, value) -> None:
        if name == "benchmark":
            self.features[name] = str(value).lower()
        else:
            try:
                self.features[name] = float(value)
            except (TypeError, ValueError):
                pass
