"""Job features the history predictor reads, and the accelerator TFLOPS table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from services.estimator.model.targets import task_of

# Dense BF16/FP16 tensor TFLOPS from vendor datasheets; substrings matched in order.
ACCELERATOR_TFLOPS = (
    ("h200", 989.0), ("gh200", 989.0), ("h100-pcie", 756.0), ("h100", 989.0),
    ("a100", 312.0), ("a30", 165.0), ("l40s", 362.0), ("l40", 181.0), ("l4", 121.0),
    ("a10g", 70.0), ("a5000", 111.0), ("4090", 165.0), ("gaudi", 432.0), ("v5p", 459.0),
    ("v5e", 197.0), ("mi300", 1307.0), ("7900", 123.0),
)


def _table_row(name: str) -> tuple[str, float] | None:
    """The TFLOPS table's row an accelerator name matches, None when unknown."""
    key = _squeeze(name)
    return next(((needle, tflops) for needle, tflops in ACCELERATOR_TFLOPS if needle in key), None)


def _squeeze(name: str) -> str:
    return name.lower().replace(" ", "").replace("(r)", "")


def accelerator_tflops(name: str) -> float | None:
    """Peak dense 16-bit TFLOPS of an accelerator model, None when unknown."""
    row = _table_row(name)
    return row[1] if row else None


def normalise_accelerator(name: str) -> str:
    """One vocabulary word per accelerator model: its row of the TFLOPS table when it has one
    ("NVIDIA H100-SXM5-80GB" and "H100-SXM-80GB" are both "h100"), else the squeezed name."""
    row = _table_row(name)
    return row[0] if row else (_squeeze(name).replace("-", "") or "unknown")


# Per-accelerator TFLOPS assumed when the model is not in the table (the flag feature
# `tflops_known` lets the network correct for it).
FALLBACK_TFLOPS = 150.0


def compute_tflops(feat: JobFeatures) -> float:
    """Peak TFLOPS of all the job's accelerators together (fallback when unknown)."""
    return (feat.tflops or FALLBACK_TFLOPS) * max(1, feat.accelerators)


@dataclass(frozen=True)
class JobFeatures:
    """What is known about a training job before it starts."""

    benchmark: str
    batch_size: float = 0.0
    learning_rate: float = 0.0
    accelerator: str = "unknown"
    accelerators: int = 1  # all of the job's accelerators: per node x nodes
    nodes: int = 1
    tflops: float | None = None
    task: str | None = None
    family: str | None = None

    def resolved(self) -> JobFeatures:
        """Fill task, family and TFLOPS from the benchmark and accelerator tables."""
        task, family = task_of(self.benchmark)
        return JobFeatures(
            benchmark=self.benchmark, batch_size=self.batch_size,
            learning_rate=self.learning_rate, accelerator=self.accelerator,
            accelerators=max(1, int(self.accelerators)), nodes=max(1, int(self.nodes)),
            tflops=self.tflops or accelerator_tflops(self.accelerator),
            task=self.task or task, family=self.family or family,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def features_from_run(run) -> JobFeatures:
    """Features of a corpus `Run`."""
    return JobFeatures(
        benchmark=run.benchmark, batch_size=run.batch_size, learning_rate=run.learning_rate,
        accelerator=run.accelerator, accelerators=run.accelerators, nodes=run.nodes,
    ).resolved()


CATEGORICAL = ("benchmark", "task", "family", "accelerator")


def categorical_values(feat: JobFeatures) -> dict[str, str]:
    return {"benchmark": feat.benchmark, "task": feat.task or "unknown",
            "family": feat.family or "unknown",
            "accelerator": normalise_accelerator(feat.accelerator)}


NUMERIC = ("batch_size", "learning_rate", "tflops", "tflops_known", "nodes", "accelerators",
           "total_tflops", "batch_per_accelerator")


def numeric_values(feat: JobFeatures) -> list[float]:
    """Log-scaled numeric features; a missing TFLOPS gets 0 and a flag."""
    tflops = feat.tflops or 0.0
    total = tflops * feat.accelerators
    return [
        math.log1p(max(feat.batch_size, 0.0)),
        math.log10(feat.learning_rate) if feat.learning_rate > 0 else -6.0,
        math.log1p(tflops), 1.0 if tflops else 0.0,
        math.log(feat.nodes), math.log(feat.accelerators), math.log1p(total),
        math.log1p(max(feat.batch_size, 0.0) / feat.accelerators),
    ]
