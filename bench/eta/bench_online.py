"""Per-update cost (observe + estimate) of the online estimator, and peak RSS."""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time

from services.estimator.model import HistoryPrior, OnlineEstimator
from services.estimator.model.evalunits import EvalUnits


def run_job(
    *, updates: int, eval_every: int, with_target: bool, unseen: bool = False, clock=time.perf_counter
) -> list[float]:
    """One synthetic job: progress every update, a metric value every `eval_every` updates; `unseen`: of a benchmark
    the history never trained on (its work in evaluation units, v3.1's learned figures)."""
    prior = HistoryPrior(
        duration_s=updates * 1.2,
        duration_low_s=updates,
        duration_high_s=updates * 1.5,
        work=updates * 100.0,
        work_low=updates * 90.0,
        work_high=updates * 110.0,
        benchmark="newbench" if unseen else "bert",
        seen=not unseen,
        eval_units=EvalUnits(ratio=(1.3, 14.6, 47.1), steps=(1.0, 13.2, 53.1)),
    )
    est = OnlineEstimator(target=0.72 if with_target else None, mode="max", prior=prior)
    costs = []
    for i in range(1, updates + 1):
        metric = 0.75 - 0.4 * math.exp(-i / (0.4 * updates)) if i % eval_every == 0 else None
        start = clock()
        est.observe(float(i), progress=100.0 * i, metric_value=metric)
        est.estimate(float(i))
        costs.append((clock() - start) * 1000.0)
    return costs


def run_own_job(*, updates: int, clock=time.perf_counter) -> list[float]:
    """A researcher's own job as the service follows it (`JobModel`: its metric regex on each output line, its own
    curve's learned band): a declared loss target, no history, one `step N loss X` line and one estimate an update."""
    from shared.events import LogLine
    from shared.jobs import MetricSpec
    from services.estimator.jobmodel import JobModel

    spec = MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.e-]+)", mode="min", target=0.05)
    model = JobModel(metrics=[spec])
    model.started(at=0.0, accelerator="unknown", gpus=1, nodes=1)
    costs = []
    for i in range(1, updates + 1):
        line = LogLine(t=float(i), line=f"step {i} loss {2.0 / (1 + i / 50) ** 0.7 + 0.01 * math.sin(i):.5f}")
        start = clock()
        model.observe(line)
        model.estimate(float(i), predictor=None, version=None)
        costs.append((clock() - start) * 1000.0)
    return costs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--updates", type=int, default=2000, help="updates per job")
    ap.add_argument("--eval-every", type=int, default=20, help="updates between metric values")
    ap.add_argument(
        "--own-jobs",
        action="store_true",
        help="researchers' own jobs through JobModel (declared target, no history) instead",
    )
    ap.add_argument("--unseen", action="store_true", help="jobs of a benchmark the history never trained on")
    ap.add_argument("--cpu", action="store_true", help="CPU time of this process (a loaded machine's wait left out)")
    args = ap.parse_args(argv)
    costs = []
    started = time.perf_counter()
    clock = time.process_time if args.cpu else time.perf_counter
    for j in range(args.jobs):
        costs += (
            run_own_job(updates=args.updates, clock=clock)
            if args.own_jobs
            else run_job(
                updates=args.updates,
                eval_every=args.eval_every,
                with_target=j % 4 != 3,
                unseen=args.unseen,
                clock=clock,
            )
        )
    costs.sort()
    report = {
        "path": "own-jobs" if args.own_jobs else "online-unseen" if args.unseen else "online",
        "clock": "cpu" if args.cpu else "wall",
        "updates": len(costs),
        "mean_ms": round(statistics.fmean(costs), 4),
        "p50_ms": round(costs[len(costs) // 2], 4),
        "p99_ms": round(costs[int(len(costs) * 0.99)], 4),
        "max_ms": round(costs[-1], 4),
        "wall_s": round(time.perf_counter() - started, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
