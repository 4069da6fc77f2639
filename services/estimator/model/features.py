"""Job features the history predictor reads; the accelerator's numbers come from `hardware.py`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from services.estimator.model.corpus import Run
from services.estimator.model.hardware import hardware, squeeze
from services.estimator.model.targets import task_of

# The vocabulary's words (one per accelerator model, for the duration head's one-hot and the harness's
# seen/new accelerator groups; kept as they were so the groups compare across versions): substrings matched
# in order. The numbers the model computes with are `hardware.TABLE`'s.
ACCELERATOR_TFLOPS = (
    ("h200", 989.0),
    ("gh200", 989.0),
    ("h100-pcie", 756.0),
    ("h100", 989.0),
    ("a100", 312.0),
    ("a30", 165.0),
    ("l40s", 362.0),
    ("l40", 181.0),
    ("l4", 121.0),
    ("a10g", 70.0),
    ("a5000", 111.0),
    ("4090", 165.0),
    ("gaudi", 432.0),
    ("v5p", 459.0),
    ("v5e", 197.0),
    ("mi300", 1307.0),
    ("7900", 123.0),
)


def _table_row(name: str) -> tuple[str, float] | None:
    """The TFLOPS table's row an accelerator name matches, None when unknown."""
    key = squeeze(name)
    return next(((needle, tflops) for needle, tflops in ACCELERATOR_TFLOPS if needle in key), None)


def accelerator_tflops(name: str) -> float | None:
    """Peak dense 16-bit TFLOPS of an accelerator model (by its family when the table lacks it), None when unknown."""
    known = hardware(name)
    return known.tflops if known else None


def normalise_accelerator(name: str) -> str:
    """One vocabulary word per accelerator model: its row of the TFLOPS table when it has one
    ("NVIDIA H100-SXM5-80GB" and "H100-SXM-80GB" are both "h100"), else the squeezed name."""
    row = _table_row(name)
    return row[0] if row else (squeeze(name).replace("-", "") or "unknown")


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
    memory_gbps: float | None = None  # one accelerator's memory bandwidth
    link_gbps: float | None = None  # what one accelerator reaches the others with (NVLink, ICI, PCIe)

    def resolved(self) -> JobFeatures:
        """Fill task, family, TFLOPS and bandwidths from the benchmark and hardware tables."""
        task, family = task_of(self.benchmark)
        known = hardware(self.accelerator)
        return JobFeatures(
            benchmark=self.benchmark,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            accelerator=self.accelerator,
            accelerators=max(1, int(self.accelerators)),
            nodes=max(1, int(self.nodes)),
            tflops=self.tflops or (known.tflops if known else None),
            task=self.task or task,
            family=self.family or family,
            memory_gbps=self.memory_gbps or (known.memory_gbps if known else None),
            link_gbps=self.link_gbps or (known.link_gbps if known else None),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def features_from_run(run: Run) -> JobFeatures:
    """Features of a corpus `Run`."""
    return JobFeatures(
        benchmark=run.benchmark,
        batch_size=run.batch_size,
        learning_rate=run.learning_rate,
        accelerator=run.accelerator,
        accelerators=run.accelerators,
        nodes=run.nodes,
    ).resolved()


CATEGORICAL = ("benchmark", "task", "family", "accelerator")


def categorical_values(feat: JobFeatures) -> dict[str, str]:
    return {
        "benchmark": feat.benchmark,
        "task": feat.task or "unknown",
        "family": feat.family or "unknown",
        "accelerator": normalise_accelerator(feat.accelerator),
    }


NUMERIC = (
    "batch_size",
    "learning_rate",
    "tflops",
    "tflops_known",
    "nodes",
    "accelerators",
    "total_tflops",
    "batch_per_accelerator",
    "memory_gbps",
    "bytes_per_flop",
    "link_gbps",
    "link_per_tflops",
    "bandwidth_known",
)


def numeric_values(feat: JobFeatures) -> list[float]:
    """Log-scaled numeric features; a missing TFLOPS or bandwidth gets 0 and a flag.

    How far a system falls short of its peak (its utilisation) is learned from these numbers: memory bandwidth
    per FLOP bounds the memory-bound layers, the link per TFLOPS the gradient exchange between accelerators."""
    tflops = feat.tflops or 0.0
    total = tflops * feat.accelerators
    memory, link = feat.memory_gbps or 0.0, feat.link_gbps or 0.0
    known = bool(memory and link and tflops)
    return [
        math.log1p(max(feat.batch_size, 0.0)),
        math.log10(feat.learning_rate) if feat.learning_rate > 0 else -6.0,
        math.log1p(tflops),
        1.0 if tflops else 0.0,
        math.log(feat.nodes),
        math.log(feat.accelerators),
        math.log1p(total),
        math.log1p(max(feat.batch_size, 0.0) / feat.accelerators),
        math.log1p(memory),
        math.log(memory / tflops) if known else 0.0,
        math.log1p(link),
        math.log(link / tflops) if known else 0.0,
        1.0 if known else 0.0,
    ]
