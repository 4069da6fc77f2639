"""`trainmaster-eta-eval --corpus own-jobs`: the own-curve ETA (what the live tracker serves to a job that only
declares a target: the curve prior, `curveprior/prior.npz`, blended with the fitted curve) scored on recorded
trainings held out of its calibration, with four baselines: the curve prior alone, the fitted curve alone
(`owncurve.json`, the estimate before the prior), the same curve reading without the learned calibration, and the
linear trend of recent values the tracker used before that."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable, net as priornet
from services.estimator.model.owncurve import CALIBRATION, Series, load_calibration
from services.estimator.scoring import summarise

HEADLINE_METHOD = "own_curve"  # what the tracker serves: the curve prior and the fitted curve blended
PRIOR_METHOD = "curve_prior"  # the curve prior alone
HEADLINE_METRIC = "loss"
RATE_WINDOW = 50  # the previous tracker's window of recent points


def previous_rate(
    ts: Series, values: Series, *, target: float, mode: str, now: float
) -> tuple[float, float, float] | None:
    """(total, low, high) of the former `method: rate`: a line through the last 50 values, its band the slope's
    relative standard error (kept as the baseline the issue measured)."""
    ts, ys = np.asarray(ts[-RATE_WINDOW:], float), np.asarray(values[-RATE_WINDOW:], float)
    if len(ts) < 3 or np.ptp(ts) == 0:
        return None
    slope, intercept = np.polyfit(ts, ys, 1)
    toward = (target - ys[-1]) * slope
    if slope == 0 or toward <= 0:
        return None
    residual = float(np.sum((ys - intercept - slope * ts) ** 2)) / max(1, len(ts) - 2)
    relative = min(1.0, math.sqrt(residual / float(np.sum((ts - ts.mean()) ** 2))) / abs(slope))
    remaining = max(0.0, (target - ys[-1]) / slope - (now - ts[-1]))
    return now + remaining, now + remaining * (1 - relative / 2), now + remaining * (1 + relative)


def _rows(
    test: list[owncorpus.Case], method: str, calibration: dict | None, prior: priornet.PriorNet | None = None
) -> dict[float, list[dict]]:
    if method != "previous_rate":
        blend = method == HEADLINE_METHOD
        return owncorpus.evaluate_cases(
            test, calibration, prior=prior, blend=blend, table=blendtable.load() if blend else None
        )
    rows: dict[float, list[dict]] = {cut: [] for cut in owncorpus.CUTS}
    for case in test:
        for cut in owncorpus.CUTS:
            now = cut * case.truth
            ts, _, values = owncorpus.prefix(case, now)
            got = previous_rate(ts, values, target=case.target, mode=case.mode, now=now)
            row = {"truth": case.truth, "now": now, "pred": None, "benchmark": case.group, "run_id": case.run}
            if got is not None:
                row |= {"pred": got[0], "low": got[1] - now, "high": got[2] - now, "method": "rate"}
            rows[cut].append(row)
    return rows


def _summary(rows: list[dict]) -> dict:
    out = summarise(rows)
    width = owncorpus.band_width(rows)
    if width is not None:
        out["median_band_width_over_truth"] = width
    return out


def run_own_evaluation(
    sweep: Path | tuple = owncorpus.TRAINED,
    *,
    calibration_path: Path = CALIBRATION,
    refit: bool = False,
    metrics: Sequence[str] = tuple(owncorpus.METRICS),
) -> dict:
    """Every method at every cut on the held-out seeds' cases; the headline is the loss."""
    paths = (sweep,) if isinstance(sweep, Path) else tuple(sweep)
    runs = owncorpus.load_corpus(paths)
    if not runs:
        raise ValueError(f"param[--sweep] invalid: no runs in {sweep}")
    if refit:
        from services.estimator.model.owntrain import calibrate  # torch, only when asked

        calibration = calibrate(runs, list(metrics))
    else:
        loaded = load_calibration(calibration_path)
        if loaded is None:
            raise ValueError(f"param[--calibration] invalid: cannot read {calibration_path}")
        calibration = loaded
    if sorted(calibration.get("held_out_seeds", [])) != sorted(owncorpus.HELD_OUT_SEEDS):
        raise ValueError("param[--calibration] invalid: it was not fitted with the evaluation's seeds held out")
    test = {m: owncorpus.split(owncorpus.cases(runs, m))[1] for m in metrics}
    report: dict[str, Any] = {
        "corpus": "own-jobs",
        "sweep": ", ".join(str(p) for p in paths),
        "runs": len(runs),
        "held_out_seeds": list(owncorpus.HELD_OUT_SEEDS),
        "headline_method": HEADLINE_METHOD,
        "headline_metric": HEADLINE_METRIC,
        "cuts": [f"{int(c * 100)}%" for c in owncorpus.CUTS],
        "test_cases": {m: len(c) for m, c in test.items()},
        "calibration": {k: v for k, v in calibration.items() if k != "nets"},
        "methods": {},
    }
    prior = priornet.load()
    for method, table, with_prior in (
        (HEADLINE_METHOD, calibration, prior),
        (PRIOR_METHOD, calibration, prior),
        ("fitted_curve", calibration, None),
        ("power_law_uncalibrated", None, None),
        ("previous_rate", None, None),
    ):
        by_metric = {m: _rows(cases, method, table, with_prior) for m, cases in test.items()}
        entry = {}
        for cut in owncorpus.CUTS:
            key = f"{int(cut * 100)}%"
            entry[key] = _summary(by_metric.get(HEADLINE_METRIC, {}).get(cut, []))
            entry.setdefault("by_metric", {})[key] = {m: _summary(rows[cut]) for m, rows in by_metric.items()}
            groups = defaultdict(list)
            for row in by_metric.get(HEADLINE_METRIC, {}).get(cut, []):
                groups[row["benchmark"]].append(row)
            entry.setdefault("by_group", {})[key] = {g: _summary(r) for g, r in sorted(groups.items())}
        report["methods"][method] = entry
    return report


def print_own_table(report: dict) -> None:
    print(
        f"own-jobs corpus {report['sweep']}: {report['runs']} runs, held-out seeds {report['held_out_seeds']}, "
        f"test cases {report['test_cases']}"
    )
    for method, entry in report["methods"].items():
        print(f"\n{method}{' (headline)' if method == report['headline_method'] else ''}")
        print(f"{'cut':>5} {'metric':>9} {'n':>4} {'n_tot':>5} {'medAPE':>7} {'<=20%':>6} {'cov':>6} {'width':>6}")
        for cut in report["cuts"]:
            for metric, s in entry["by_metric"][cut].items():
                cov, width = s.get("coverage_10_90"), s.get("median_band_width_over_truth")
                print(
                    f"{cut:>5} {metric:>9} {s['n']:>4} {s['n_total']:>5} {s.get('median_ape', math.nan):7.3f} "
                    f"{s['within_20pct']:6.3f} {'' if cov is None else f'{cov:6.3f}'} "
                    f"{'' if width is None else f'{width:6.2f}'}"
                )
