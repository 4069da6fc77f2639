"""The own-jobs corpus: recorded small real trainings (`bench/search/data/sweep.jsonl.gz`, digits, and
`broad.jsonl.gz`, other data sets, a regression and numpy loops printing a running mean) as jobs that declare a
target on their loss, replayed at cuts through `owncurve` (the code the live tracker runs), and the calibration
of its band learned on them.

A case is one run and one metric: the target is the level the run had reached at a fraction `u` of its
recording (u drawn per case in [0.4, 1]; the median of the points around it), the truth the time its printed
value first met it (the training loss printed as recorded, or as a running mean, one case in two). Only cases
whose target came after MIN_TRUTH_POINTS log points are kept (a job whose target is met in its first lines needs
no ETA).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.estimator.model.curveprior.blendtable import BlendTable
from services.estimator.model.curveprior.estimate import estimate
from services.estimator.model.curveprior.net import PriorNet
from services.estimator.model.owncurve import PLAIN, read_prefix

SWEEP = Path(__file__).resolve().parents[3] / "bench" / "search" / "data" / "sweep.jsonl.gz"
BROAD = SWEEP.with_name("broad.jsonl.gz")  # other data sets, a regression, numpy loops printing a running mean
FAMILIES = SWEEP.with_name("families.jsonl.gz")  # runs of seven further families, each with its `family`
FAMILIES2 = SWEEP.with_name("families2.jsonl.gz")  # five more, recorded before the eleven above were tuned on
# Three with deep targets on slow tails (a separable logistic regression, least squares on a power-law spectrum, a
# convolutional net under AdamW and a cosine schedule; issue 31 item 5), recorded 2026-11-28
FAMILIES4 = SWEEP.with_name("families4.jsonl.gz")
CORPUS = (SWEEP, BROAD, FAMILIES, FAMILIES2, FAMILIES4)
# What the shipped estimator is fitted and tuned on (the curve prior's fine-tuning and pads, the blend table, the
# leave-one-family-out split): fourteen families (eleven before 2026-11-28). The second families file is never
# among them, so its families stay unseen by what is served (`--split unseen` scores them: `UNSEEN`).
TRAINED = (SWEEP, BROAD, FAMILIES, FAMILIES4)
UNSEEN = (FAMILIES2,)
# The family of a run without a `family` field: its group, the digits sweep's three networks one family (same data,
# same script): a model that saw the digits MLP has seen what the digits CNN prints.
GROUP_FAMILY = {"digits-mlp": "digits", "digits-cnn": "digits", "digits-deep": "digits"}
METRICS = {"loss": "min", "val_loss": "min", "val_acc": "max"}
MIN_TRUTH_POINTS = 15
SMOOTH_TARGET = 2  # the target is the median of the 2 points either side of the one at u
PRINT_MEAN = 3  # a script printing a running mean of its loss: over the last 3 recorded points
HELD_OUT_SEEDS = (4,)  # the evaluation's held-out runs; calibration never sees them
CUTS = (0.1, 0.2, 0.3, 0.5, 0.8)
CALIBRATION_CUTS = tuple(round(0.05 * i, 2) for i in range(1, 20, 2))  # 0.05, 0.15, ... 0.95
CALIBRATION_U = (0.4, 0.7, 1.0)
PAD_CUTS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # finer: the pads of the early phase see 10%-like cuts
PAD_U = (0.43, 0.49, 0.55, 0.61, 0.67, 0.73, 0.79, 0.85, 0.91, 0.97)  # u's range, evenly


@dataclass(frozen=True)
class Case:
    run: str
    group: str
    seed: int
    metric: str
    mode: str
    target: float
    truth: float  # seconds from the start to the first value meeting the target
    ts: tuple
    xs: tuple
    values: tuple
    family: str = ""


def family(run: dict) -> str:
    """The family a run belongs to for the leave-one-family-out split: its own `family` field when recorded with
    one (a string), else its group's (`GROUP_FAMILY`), else its group."""
    named = run.get("family")
    if isinstance(named, str) and named:
        return named
    return GROUP_FAMILY.get(run["group"], run["group"])


def load_corpus(paths: Iterable[Path] = TRAINED) -> list[dict]:
    """The runs of the recorded files `paths` (a missing one has none; by default what the estimator is fitted and
    tuned on, never the unseen split unless named), each with its `family` (`family()`: as recorded, or else its
    group's)."""
    return [{**run, "family": family(run)} for path in paths for run in load_sweep(path)]


def load_sweep(path: Path = SWEEP) -> list[dict]:
    """Every complete run line of the sweep file (a truncated last gzip member is ignored)."""
    runs = []
    try:
        with gzip.open(path, "rt") as handle:
            for line in handle:
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except (EOFError, OSError):
        pass
    return runs


def make_case(run: dict, metric: str, u: float | None = None, smooth: bool | None = None) -> Case | None:
    """The case of `run` on `metric` with its target at fraction `u` of the recording, the training loss printed
    as recorded or (`smooth`) as a running mean of the last PRINT_MEAN points, as many scripts print it; both
    drawn from the run id when not given."""
    mode = METRICS[metric]
    points = run["points"]
    draw = zlib.crc32(f"{run['run']}:{metric}".encode()) % 10_000
    if u is None:
        u = 0.4 + 0.6 * draw / 10_000
    if smooth is None:
        smooth = draw % 2 == 0
    if any(p.get(metric) is None for p in points):  # a regression has no accuracy
        return None
    if "mean" in run["params"]:  # the run printed a running mean already
        smooth = False
    sign = 1.0 if mode == "min" else -1.0
    values = [sign * p[metric] for p in points]
    if smooth and metric == "loss":
        values = [float(np.mean(values[max(0, i - PRINT_MEAN + 1) : i + 1])) for i in range(len(values))]
    horizon = u * points[-1]["t"]
    if not all(math.isfinite(v) for v in values):
        return None
    at = max(i for i, p in enumerate(points) if p["t"] <= horizon or i == 0)
    # The level the curve has reached there (a median of neighbouring points), not one lucky low point.
    goal = float(np.median(values[max(0, at - SMOOTH_TARGET) : at + SMOOTH_TARGET + 1]))
    hit = next(i for i, v in enumerate(values) if v <= goal)
    if hit < MIN_TRUTH_POINTS or goal >= values[0]:
        return None
    return Case(
        run["run"],
        run["group"],
        int(run["params"]["seed"]),
        metric,
        mode,
        sign * goal,
        points[hit]["t"],
        tuple(p["t"] for p in points[: hit + 1]),
        tuple(float(p["step"]) for p in points[: hit + 1]),
        tuple(sign * v for v in values[: hit + 1]),
        family(run),
    )


def cases(
    runs: list[dict],
    metric: str = "loss",
    *,
    us: Iterable[float | None] = (None,),
    smooths: Iterable[bool | None] = (None,),
) -> list[Case]:
    return [
        c
        for run in runs
        for u in us
        for smooth in (smooths if metric == "loss" else (None,))
        if (c := make_case(run, metric, u, smooth)) is not None
    ]


def split(all_cases: list[Case], held: tuple = HELD_OUT_SEEDS) -> tuple[list[Case], list[Case]]:
    """(calibration cases, held-out cases) by seed."""
    return [c for c in all_cases if c.seed not in held], [c for c in all_cases if c.seed in held]


def prefix(case: Case, elapsed: float) -> tuple[list, list, list]:
    """The points a live job would have shown by `elapsed` seconds."""
    n = sum(1 for t in case.ts if t <= elapsed)
    return list(case.ts[:n]), list(case.xs[:n]), list(case.values[:n])


def samples(
    train: list[Case], cuts: Iterable[float] = CALIBRATION_CUTS, *, power_fit: str = PLAIN
) -> tuple[np.ndarray, np.ndarray]:
    """(features, log(true training time to target / training time so far)) at every cut of every case (the
    power law fitted by `power_fit`)."""
    xs, ys = [], []
    for case in train:
        for cut in cuts:
            elapsed = cut * case.truth
            ts, steps, values = prefix(case, elapsed)
            read = read_prefix(
                ts, steps, values, target=case.target, mode=case.mode, elapsed=elapsed, power_fit=power_fit
            )
            if read is None or case.truth <= read.origin:
                continue
            xs.append(read.features)
            ys.append(math.log((case.truth - read.origin) / read.span))
    return np.asarray(xs, float), np.asarray(ys, float)


def evaluate_cases(
    test: list[Case],
    calibration: dict | None,
    *,
    cuts: Iterable[float] = CUTS,
    prior: PriorNet | None = None,
    blend: bool = False,
    table: BlendTable | None = None,
) -> dict[float, list[dict]]:
    """Rows in the MLPerf harness's shape (truth, now, pred, low/high remaining) per cut; no estimate: pred None.
    With `prior` (a `curveprior.net.PriorNet`) the estimate is the one the tracker serves with it."""
    rows: dict[float, list[dict]] = {cut: [] for cut in cuts}
    for case in test:
        for cut in cuts:
            now = cut * case.truth
            ts, xs, values = prefix(case, now)
            est = estimate(
                ts,
                xs,
                values,
                target=case.target,
                mode=case.mode,
                elapsed=now,
                calibration=calibration,
                prior=prior,
                blend=blend,
                table=table,
            )
            row = {"truth": case.truth, "now": now, "pred": None, "benchmark": case.group, "run_id": case.run}
            if est is not None:
                row |= {"pred": est.total_s, "low": est.low_s - now, "high": est.high_s - now, "method": est.kind}
            rows[cut].append(row)
    return rows


def band_width(rows: list[dict]) -> float | None:
    """Median (90% - 10%) / truth of the band, a measure of how much an estimate admits not knowing."""
    widths = [(r["high"] - r["low"]) / r["truth"] for r in rows if r["pred"] is not None]
    return float(np.median(widths)) if widths else None
