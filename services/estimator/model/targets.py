"""MLPerf Training quality targets (v3.1 and v4.0 closed-division rules).

Every benchmark stops at a fixed quality target, so "when will this run finish" is
"when will the metric reach the target". Multi-metric benchmarks are reduced to one
scalar, `metric_scalar`, whose target is 1.0 (the worst normalised sub-metric).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Quality target of one benchmark: threshold, direction and a task description."""

    value: float
    mode: str  # "max": higher is better; "min": lower is better
    task: str
    family: str


# Values from the MLPerf Training rules (training_rules.adoc, "Benchmarks" table).
TARGETS: dict[str, Target] = {
    "bert": Target(0.720, "max", "nlp", "transformer"),
    "dlrm_dcnv2": Target(0.80275, "max", "recommendation", "dlrm"),
    "gnn": Target(0.72, "max", "graph", "gnn"),
    "gpt3": Target(2.69, "min", "llm", "transformer"),
    "llama2_70b_lora": Target(0.925, "min", "llm", "transformer"),
    "maskrcnn": Target(1.0, "max", "vision_detection", "cnn"),  # BBOX 0.377 and SEGM 0.339
    "resnet": Target(0.759, "max", "vision_classification", "cnn"),
    "rnnt": Target(0.058, "min", "speech", "rnn"),
    "ssd": Target(0.340, "max", "vision_detection", "cnn"),
    "stable_diffusion": Target(1.0, "max", "image_generation", "diffusion"),  # FID<=90, CLIP>=0.15
    "unet3d": Target(0.908, "max", "vision_segmentation", "cnn"),
}

_MASKRCNN = {"BBOX": 0.377, "SEGM": 0.339}
_SD_FID_MAX = 90.0
_SD_CLIP_MIN = 0.15


def metric_scalar(benchmark: str, value, metadata: dict | None = None) -> float | None:
    """Reduce an `eval_accuracy` value to the scalar compared with `TARGETS[benchmark]`."""
    metadata = metadata or {}
    if benchmark == "maskrcnn" and isinstance(value, dict):
        try:
            return min(float(value[k]) / thr for k, thr in _MASKRCNN.items())
        except (KeyError, TypeError, ValueError):
            return None
    if benchmark == "stable_diffusion":
        name = metadata.get("metric")
        if not isinstance(value, (int, float)):
            return None
        if name == "FID":
            return _SD_FID_MAX / max(float(value), 1e-9)
        if name == "CLIP":
            return float(value) / _SD_CLIP_MIN
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def reached(value: float, target: float, mode: str) -> bool:
    """Whether `value` meets `target` in direction `mode`."""
    return value >= target if mode == "max" else value <= target
