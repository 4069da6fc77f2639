"""Per-run estimates of benchmarks held out of training, with the components behind each (v3.1 only by default).

The harness (`trainmaster-eta-eval --split benchmark --kfold 3`) reports how often a held-out benchmark is within
±20%; this says why: at each cut, which components the blend had (history, curve, loose curve, ...), what each
said, the fraction of the run the estimator believed it was at, and the evaluations seen. Same folds, seeds and
training as the harness, so its figures reproduce the report's.

nice -n 10 python -m bench.eta.unseen_rows --out bench/eta/results/unseen-rows-v3.1 [--cut 0.5]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

from services.estimator.evaluate import CUTS, scorable, split_kfold
from services.estimator.model.calibrate import make_estimator, replay, train_with_calibration
from services.estimator.model.corpus import Run, is_usable, load_cached
from services.estimator.model.history import HistoryPredictor
from services.estimator.model.online import OnlineEstimator

V31 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mlperf" / "mlperf-training-v3.1.tar.gz"


def fold_rows(test: list[Run], predictor: HistoryPredictor) -> list[dict]:
    """Every test run at every cut: the estimate, its band, the components and what the estimator had seen."""
    rows: list[dict] = []
    for run in test:

        def visit(frac: float, now: float, est: OnlineEstimator, run: Run = run) -> None:
            e = est.estimate(now)
            fraction, comps = est.snapshot(now)
            finite = math.isfinite(e.remaining_s)
            rows.append(
                {
                    "run": run.run_id,
                    "benchmark": run.benchmark,
                    "cut": frac,
                    "truth": run.duration_s,
                    "now": now,
                    "pred": now + e.remaining_s if finite else None,
                    "low": now + e.low_s if finite else None,
                    "high": now + e.high_s if finite else None,
                    "method": e.method,
                    "fraction": fraction,
                    "components": {k: v for k, v in comps.items() if v},
                    "evaluations": est._metric_count,
                }
            )

        replay(run, make_estimator(run, predictor), CUTS, visit)
    return rows


def within(row: dict) -> bool:
    return bool(row["pred"]) and abs(row["pred"] / row["truth"] - 1) <= 0.2


def summary(rows: list[dict], cut: float) -> str:
    """Per benchmark at one cut: within ±20%, and the blend's and each component's record."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["cut"] == cut:
            by[r["benchmark"]].append(r)
    lines = [
        f"cut {cut:.0%}: benchmark, runs, blend within ±20%, runs with only the history, "
        "each component: runs having it / within ±20% alone"
    ]
    for bench, rs in sorted(by.items()):
        only = sum(1 for r in rs if set(r["components"]) == {"history"})
        have: Counter[str] = Counter()
        good: Counter[str] = Counter()
        for r in rs:
            for name, value in r["components"].items():
                have[name] += 1
                good[name] += abs(value / r["truth"] - 1) <= 0.2
        parts = " ".join(f"{k} {have[k]}/{good[k]}" for k in sorted(have))
        lines.append(f"{bench:17s} {len(rs):4d} {sum(map(within, rs)) / len(rs):6.1%} {only:4d}  {parts}")
    total = [r for r in rows if r["cut"] == cut]
    lines.append(f"all {len(total)} runs: {sum(map(within, total)) / max(len(total), 1):.1%} within ±20%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=V31)
    ap.add_argument("--out", type=Path, required=True, help="folder for rows<k>.json, one file per fold")
    ap.add_argument("--cut", type=float, default=0.5)
    args = ap.parse_args()
    runs = [r for r in load_cached(args.corpus) if r.succeeded]
    pool = [r for r in runs if is_usable(r)]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, held in enumerate(split_kfold(pool, runs, k=3, seed=0, by="benchmark")):
        predictor = train_with_calibration([r for r in pool if r.benchmark not in held], folds=3, seed=0)
        got = fold_rows([r for r in runs if scorable(r) and r.benchmark in held], predictor)
        (args.out / f"rows{k}.json").write_text(json.dumps(got))
        rows += got
    print(summary(rows, args.cut))


if __name__ == "__main__":
    main()
