"""Evaluate ETA estimators on MLPerf runs held out by submitter (`trainmaster-eta-eval`)."""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

from services.estimator.model.calibrate import make_estimator, replay, train_with_calibration
from services.estimator.model.corpus import default_tarballs, load_corpora, load_corpus
from services.estimator.model.curves import FAMILIES, crossing, fit_family
from services.estimator.model.online import OnlineEstimator

CUTS = (0.1, 0.2, 0.3, 0.5, 0.8)


# -- baselines ----------------------------------------------------------------------------
class MedianDuration:
    """Median training duration of the benchmark, ignoring the live run."""

    def __init__(self, train):
        by = defaultdict(list)
        for r in train:
            by[r.benchmark].append(r.duration_s)
        self.median = {b: statistics.median(v) for b, v in by.items()}
        self.all = statistics.median(r.duration_s for r in train)

    def total(self, run, now, _est) -> float:
        return max(self.median.get(run.benchmark, self.all), now)


class WorkOverThroughput:
    """Median work to target of (benchmark, batch size) in history / live throughput."""

    def __init__(self, train):
        self.fallback = MedianDuration(train)
        by, by_b = defaultdict(list), defaultdict(list)
        for r in train:
            by[(r.benchmark, r.batch_size)].append(r.total_work)
            by_b[r.benchmark].append(r.total_work)
        self.work = {k: statistics.median(v) for k, v in by.items()}
        self.work_b = {k: statistics.median(v) for k, v in by_b.items()}

    def total(self, run, now, est: OnlineEstimator) -> float:
        work = self.work.get((run.benchmark, run.batch_size), self.work_b.get(run.benchmark))
        live = est.rate()
        if work is None or live is None:
            return self.fallback.total(run, now, est)
        rate, t_last, p_last = live
        return _capped(t_last + max(work - p_last, 0.0) / rate, now)


def _capped(total: float, now: float) -> float:
    """Same sanity cap as the online estimator: no more than 20x the elapsed time."""
    return min(max(total, now), 20.0 * now)


class CurveOnly:
    """Optimus-style fit of metric vs progress alone, extrapolated with live throughput."""

    def __init__(self, family: str = "optimus"):
        self.family = family

    def total(self, run, now, est: OnlineEstimator) -> float | None:
        live = est.rate()
        x, y = np.asarray(est._metric_x), np.asarray(est._metric_y)
        if live is None or len(x) < len(FAMILIES[self.family].p0) + 1:
            return None
        scale = float(x.max())
        fit = fit_family(self.family, x / scale, y)
        target = run.target if run.mode == "max" else -run.target
        cross = crossing(self.family, fit.params, target) * scale if fit else math.inf
        if not math.isfinite(cross):
            return None
        rate, t_last, p_last = live
        return _capped(t_last + max(cross - p_last, 0.0) / rate, now)


# -- metrics ------------------------------------------------------------------------------
def summarise(rows: list[dict]) -> dict:
    """Error statistics of (truth, predicted total, remaining band) rows at one cut."""
    done = [r for r in rows if r["pred"] is not None and math.isfinite(r["pred"])]
    if not done:
        return {"n": 0, "n_total": len(rows)}
    ape = np.array([abs(r["pred"] / r["truth"] - 1) for r in done])
    rem_err = np.array([abs(r["pred"] - r["truth"]) for r in done])
    rem_ape = np.array([abs(r["pred"] - r["truth"]) / max(r["truth"] - r["now"], 1e-9) for r in done])
    out = {
        "n": len(done), "n_total": len(rows),
        "median_ape": float(np.median(ape)), "mape": float(np.mean(ape)),
        "within_20pct": float(np.mean(ape <= 0.2)),
        "median_abs_err_remaining_s": float(np.median(rem_err)),
        "median_ape_remaining": float(np.median(rem_ape)),
    }
    banded = [r for r in done if r.get("low") is not None]
    if banded:
        out["coverage_10_90"] = float(np.mean(
            [r["low"] <= r["truth"] - r["now"] <= r["high"] for r in banded]))
    return out


def evaluate_split(train, test, *, folds: int = 3, seed: int = 0) -> dict[str, dict]:
    """Per-method, per-cut rows of one train/test split."""
    predictor = train_with_calibration(train, folds=folds, seed=seed)
    baselines = {"median_duration": MedianDuration(train),
                 "work_over_throughput": WorkOverThroughput(train), "optimus_only": CurveOnly(),
                 # Not a method: the median work of every run with the same benchmark and batch
                 # size, the test runs included, over the live rate. What is left of its error
                 # is run-to-run variance no feature known before the cut can explain (seeds).
                 "bound_median_work_all_runs": WorkOverThroughput(train + test)}
    rows: dict[str, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    for run in test:
        est = make_estimator(run, predictor)

        def visit(frac, now, est, run=run):
            e = est.estimate(now)
            pred = now + e.remaining_s if math.isfinite(e.remaining_s) else None
            rows["eta_blend"][frac].append({"truth": run.duration_s, "now": now, "pred": pred,
                                            "low": e.low_s, "high": e.high_s,
                                            "benchmark": run.benchmark, "run_id": run.run_id,
                                            "method": e.method})
            for name, base in baselines.items():
                rows[name][frac].append({"truth": run.duration_s, "now": now,
                                         "pred": base.total(run, now, est),
                                         "benchmark": run.benchmark})
        replay(run, est, CUTS, visit)
    return rows


def split_holdout(runs_train, runs_test, *, share: float = 1 / 3, seed: int = 0):
    """Hold out a share of the test corpus's submitters; drop them from training too."""
    subs = sorted({r.submitter for r in runs_test})
    random.Random(seed).shuffle(subs)
    held = set(subs[: max(1, round(len(subs) * share))])
    train = [r for r in runs_train if r.submitter not in held]
    test = [r for r in runs_test if r.submitter in held]
    return [(train, test)]


def split_kfold(runs_train, runs_test, *, k: int, seed: int = 0):
    """k folds over the test corpus's submitters; each fold is held out of training."""
    subs = sorted({r.submitter for r in runs_test})
    random.Random(seed).shuffle(subs)
    splits = []
    for i in range(k):
        held = set(subs[i::k])
        splits.append(([r for r in runs_train if r.submitter not in held],
                       [r for r in runs_test if r.submitter in held]))
    return splits


def run_evaluation(train_paths, test_path, *, kfold: int = 0, seed: int = 0,
                   share: float = 1 / 3) -> dict:
    """Load corpora, split by submitter, evaluate every method at every cut."""
    test_runs = load_corpus(test_path)
    train_runs = load_corpora([p for p in train_paths if str(p) != str(test_path)])
    train_runs += test_runs  # test submitters are removed per split below
    if kfold > 1:
        splits = split_kfold(train_runs, test_runs, k=kfold, seed=seed)
    else:
        splits = split_holdout(train_runs, test_runs, share=share, seed=seed)
    merged: dict[str, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    held_out = []
    for train, test in splits:
        held_out.append(sorted({r.submitter for r in test}))
        for method, by_cut in evaluate_split(train, test, seed=seed).items():
            for frac, rows in by_cut.items():
                merged[method][frac] += rows
    report = {"splits": [{"held_out_submitters": h} for h in held_out], "methods": {}}
    for method, by_cut in merged.items():
        report["methods"][method] = {f"{int(f * 100)}%": summarise(rows)
                                     for f, rows in sorted(by_cut.items())}
        report["methods"][method]["by_benchmark_20%"] = _by_benchmark(by_cut.get(0.2, []))
    return report


def _by_benchmark(rows):
    by = defaultdict(list)
    for r in rows:
        by[r["benchmark"]].append(r)
    return {b: summarise(v) for b, v in sorted(by.items())}


def _print_table(report: dict) -> None:
    for method, cuts in report["methods"].items():
        print(f"\n{method}")
        print(f"{'cut':>5} {'n':>5} {'medAPE':>7} {'MAPE':>7} {'<=20%':>6} {'remErr_s':>9} {'cov':>5}")
        for cut, s in cuts.items():
            if not cut.endswith("%") or not s.get("n"):
                continue
            cov = s.get("coverage_10_90")
            print(f"{cut:>5} {s['n']:>5} {s['median_ape']:7.3f} {s['mape']:7.3f} "
                  f"{s['within_20pct']:6.3f} {s['median_abs_err_remaining_s']:9.1f} "
                  f"{'' if cov is None else f'{cov:5.3f}'}")


def main(argv=None) -> int:
    """CLI: trainmaster-eta-eval --train TARBALL [...] --test TARBALL [--kfold K] [--json]."""
    defaults = [str(p) for p in default_tarballs()]
    ap = argparse.ArgumentParser(prog="trainmaster-eta-eval", description=__doc__)
    ap.add_argument("--train", nargs="+", default=defaults[:-1] or defaults)
    ap.add_argument("--test", default=defaults[-1] if defaults else None)
    ap.add_argument("--kfold", type=int, default=0, help="k folds over test submitters")
    ap.add_argument("--share", type=float, default=1 / 3, help="held-out submitter share")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    if not args.test:
        ap.error("no --test tarball and none under the default data folder")
    started = time.time()
    report = run_evaluation(args.train, args.test, kfold=args.kfold, seed=args.seed,
                            share=args.share)
    report["seconds"] = round(time.time() - started, 1)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        _print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
