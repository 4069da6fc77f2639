"""MLPerf Training quality targets (v3.1 and v4.0 closed-division rules).

Every benchmark stops at a fixed quality target, so "when will this run finish" is
"when will the metric reach the target". Multi-metric benchmarks are reduced to one
scalar, `metric_scalar`, whose target is 1.0 (the worst normalised sub-metric).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Quality target of one benchmark: threshold, direction, a task description and the logged metric."""

    value: float
    mode: str  # "max": higher is better; "min": lower is better
    task: str = "unknown"
    family: str = "unknown"
    metric: str = "eval_accuracy"


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


def metric_scalar(benchmark: str, value: object, metadata: dict | None = None) -> float | None:
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


# Words in a benchmark or model name that say its task and model family, so a job the table does not know
# still meets the history of similar ones (a "llama31_8b" is an LLM transformer like gpt3 and llama2_70b_lora).
_NAME_HINTS = (
    (("llama", "gpt", "mixtral", "mistral", "falcon", "bloom", "llm"), "llm", "transformer"),
    (("bert", "roberta", "electra"), "nlp", "transformer"),
    (("diffusion", "flux", "sdxl", "dit", "unet2d"), "image_generation", "diffusion"),
    (("gnn", "rgat", "gat", "gcn", "graph", "sage"), "graph", "gnn"),
    (("retinanet", "ssd", "yolo", "rcnn", "detr", "detection"), "vision_detection", "cnn"),
    (("unet3d", "segment"), "vision_segmentation", "cnn"),
    (("resnet", "vit", "efficientnet", "convnext", "imagenet"), "vision_classification", "cnn"),
    (("dlrm", "recsys", "recommend"), "recommendation", "dlrm"),
    (("rnnt", "whisper", "speech", "wav2vec", "conformer"), "speech", "rnn"),
)


def task_of(name: str) -> tuple[str, str]:
    """(task, family) of a benchmark or model name: the table's, else guessed from its words, else unknown."""
    known = TARGETS.get(name)
    if known is not None:
        return known.task, known.family
    words = re.split(r"[^a-z]+", name.lower())
    for hints, task, family in _NAME_HINTS:
        if any(w.startswith(h) for w in words if w for h in hints):
            return task, family
    return "unknown", "unknown"


MAX_DECLARED = 256
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def parse_targets(obj: object) -> dict[str, Target]:
    """Declared targets `{"<benchmark>": {"metric", "target", "mode"}}`; ValueError names the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("param[targets] invalid: expected an object of benchmark -> target")
    if len(obj) > MAX_DECLARED:
        raise ValueError(f"param[targets] invalid: more than {MAX_DECLARED} benchmarks")
    out = {}
    for bench, spec in obj.items():
        if not isinstance(bench, str) or not _NAME.match(bench):
            raise ValueError(f"param[targets] invalid: benchmark name {str(bench)[:64]!r}")
        field = f"targets.{bench}"
        if not isinstance(spec, dict):
            raise ValueError(f"param[{field}] invalid: expected an object")
        value = spec.get("target")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"param[{field}.target] invalid: expected a finite number")
        mode = spec.get("mode", "max")
        if mode not in ("max", "min"):
            raise ValueError(f"param[{field}.mode] invalid: expected 'max' or 'min'")
        metric = spec.get("metric", "eval_accuracy")
        if not isinstance(metric, str) or not _NAME.match(metric):
            raise ValueError(f"param[{field}.metric] invalid: expected a metric key")
        task, family = task_of(bench)
        out[bench] = Target(float(value), mode, task, family, metric)
    return out
