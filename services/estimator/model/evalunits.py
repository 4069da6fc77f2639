"""Work to target in a job's own units: multiples of the work to its first evaluation.

For a benchmark the history model never trained on, its work (samples, epochs, in whatever unit it counts) says
nothing in another benchmark's units, but the ratio total ÷ first-evaluation work does travel: tight within a
benchmark (bert 15-23, ssd 4-5, unet3d 1.5-3), 1-51 across them. Evaluations are spaced by a cadence; most
benchmarks evaluate from the start (first evaluation = one cadence), a few only from late in the run on (unet3d,
llama2_70b_lora), so once the second evaluation shows the cadence the work is written first + k x cadence, k the
evaluations after the first, learned the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from services.estimator.model.corpus import Run

# Each training benchmark weighs the same in the learned distribution (its runs' quantiles at these levels): an
# unseen benchmark is one draw of a benchmark, not of a run, and unet3d's 876 runs must not outvote gpt3's 33.
LEVELS = np.linspace(0.025, 0.975, 20)
Q_LOW, Q_MID, Q_HIGH = 0.10, 0.50, 0.90
MIN_RUNS = 3  # a benchmark with fewer timed evaluations than this says too little of its own ratio


@dataclass(frozen=True)
class EvalUnits:
    """Learned 10/50/90% quantiles of total ÷ first-evaluation work (`ratio`) and of the evaluations after the first
    until the target (`steps`), across the training benchmarks."""

    ratio: tuple[float, float, float]
    steps: tuple[float, float, float]

    def work(self, *, first: float, second: float | None = None) -> tuple[float, float, float]:
        """(low, median, high) work to target, from the first evaluation's work and, once seen, the second's."""
        if second is not None and second > first > 0:
            cadence = second - first
            return _three(first + max(k, 1.0) * cadence for k in self.steps)
        return _three(first * max(r, 1.0) for r in self.ratio)

    def to_state(self) -> dict:
        return {"ratio": list(self.ratio), "steps": list(self.steps)}

    @classmethod
    def from_state(cls, state: dict | None) -> EvalUnits | None:
        if not state:
            return None
        return cls(ratio=_three(state["ratio"]), steps=_three(state["steps"]))


def eval_marks(run: Run) -> tuple[float, float | None] | None:
    """Work at a corpus run's first evaluation and at its second (None without one); None without a timed one."""
    points = [o.progress for o in run.evals if o.progress is not None and o.progress > 0]
    if not points:
        return None
    return points[0], (points[1] if len(points) > 1 and points[1] > points[0] else None)


def learn(runs: Iterable[Run]) -> EvalUnits | None:
    """The distribution over benchmarks of the ratio and of the evaluations after the first, from finished runs."""
    ratios: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}
    for run in runs:
        marks, total = eval_marks(run), run.total_work
        if marks is None or not total or total < marks[0]:
            continue
        first, second = marks
        ratios.setdefault(run.benchmark, []).append(total / first)
        # Met at the first evaluation: no second one to time a cadence with, no evaluation after it.
        steps.setdefault(run.benchmark, []).append((total - first) / (second - first) if second else 0.0)
    pooled_r = [q for b, v in ratios.items() if len(v) >= MIN_RUNS for q in np.quantile(v, LEVELS)]
    pooled_k = [q for b, v in steps.items() if len(v) >= MIN_RUNS for q in np.quantile(v, LEVELS)]
    if not pooled_r:
        return None
    levels = (Q_LOW, Q_MID, Q_HIGH)
    return EvalUnits(ratio=_three(np.quantile(pooled_r, levels)), steps=_three(np.quantile(pooled_k, levels)))


def _three(values: Iterable[float]) -> tuple[float, float, float]:
    """(low, median, high) as floats; anything but three values is refused."""
    low, mid, high = (float(v) for v in values)
    return low, mid, high
