"""Replay corpus runs through the online estimator; fit the blend table out-of-fold."""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from services.estimator.model.blendfit import fit_table
from services.estimator.model.corpus import Run
from services.estimator.model.features import features_from_run
from services.estimator.model.history import UNSEEN, HistoryPredictor, quantile_row
from services.estimator.model.online import OnlineEstimator

# Each calibration run is cut at this many fractions of its duration drawn at random (seeded by
# the run): a fixed grid would teach each fraction bucket the grid's own quirks (a bucket edge
# at 0.2 with samples at exactly 0.2 leaks truth/estimate into the bucket index) rather than
# what an estimate asked at any moment of a run looks like.
CALIBRATION_CUTS_PER_RUN = 13
CALIBRATION_RANGE = (0.02, 0.9)
MAX_RUNS_PER_BENCHMARK = 120  # enough for the quantiles; keeps calibration under a minute
# Leave-one-benchmark-out: each benchmark with this many runs is held out of a model in turn, so what an
# unseen benchmark's estimate looks like (weights, bias, band) is learned, not assumed.
MIN_RUNS_TO_LEAVE_OUT = 10
MAX_UNSEEN_RUNS_PER_BENCHMARK = 40


def make_estimator(
    run: Run, predictor: HistoryPredictor | None, *, use_target: bool = True, use_calibration: bool = True
) -> OnlineEstimator:
    """Estimator for a corpus run, as the service would build it before the run starts."""
    prior = predictor.prior(features_from_run(run)) if predictor is not None else None
    return OnlineEstimator(
        target=run.target if use_target else None,
        mode=run.mode,
        prior=prior,
        calibration=predictor.blend if predictor is not None and use_calibration else None,
        key=run.benchmark,
    )


def replay(
    run: Run, estimator: OnlineEstimator, cuts: Iterable[float], visit: Callable[[float, float, OnlineEstimator], None]
) -> None:
    """Feed observations in time order; at each cut (fraction of duration) call visit."""
    obs = run.observations
    i = 0
    for frac in sorted(cuts):
        now = frac * run.duration_s
        while i < len(obs) and obs[i].t_s < now:
            o = obs[i]
            estimator.observe(o.t_s, progress=o.progress, metric_value=o.value)
            i += 1
        visit(frac, now, estimator)


def calibration_cuts(run_id: str, n: int = CALIBRATION_CUTS_PER_RUN) -> list[float]:
    """Fractions of a run's duration to cut it at, random but the same on every call."""
    rng = random.Random(zlib.crc32(run_id.encode()))
    lo, hi = CALIBRATION_RANGE
    return sorted(rng.uniform(lo, hi) for _ in range(n))


def calibration_samples(runs: Iterable[Run], predictor: HistoryPredictor) -> list[dict]:
    """Components and truth of every run at its calibration cuts, for `blendfit.fit_table`."""
    samples = []
    for run in runs:
        est = make_estimator(run, predictor, use_calibration=False)
        cuts = calibration_cuts(run.run_id)

        def visit(_: float, now: float, est: OnlineEstimator, run: Run = run) -> None:
            fraction, comps = est.snapshot(now)
            if any(comps.values()) and not est._reached:
                samples.append(
                    {
                        "key": est.key,
                        "fraction": fraction,
                        "run": run.run_id,
                        "truth": run.duration_s,
                        "components": comps,
                    }
                )

        replay(run, est, cuts, visit)
    return samples


def _subsample(runs: Iterable[Run], seed: int) -> list[Run]:
    by: dict[str, list] = {}
    for r in runs:
        by.setdefault(r.benchmark, []).append(r)
    rng = random.Random(seed)
    out = []
    for rs in by.values():
        out += rng.sample(rs, min(len(rs), MAX_RUNS_PER_BENCHMARK))
    return out


def train_with_calibration(
    runs: Sequence[Run], *, folds: int = 3, seed: int = 0, epochs: int = 400
) -> HistoryPredictor:
    """Train the history MLP on all runs and fit the blend table on submitter-held-out folds."""
    submitters = sorted({r.submitter for r in runs})
    random.Random(seed).shuffle(submitters)
    fold_of = {s: i % folds for i, s in enumerate(submitters)}
    samples = []
    for k in range(folds):
        train = [r for r in runs if fold_of[r.submitter] != k]
        held = [r for r in runs if fold_of[r.submitter] == k]
        if not train or not held:
            continue
        part = HistoryPredictor(seed=seed, epochs=epochs).train(train, folds=1)
        samples += calibration_samples(_subsample(held, seed), part)
    unseen_samples, resid = leave_benchmarks_out(runs, seed=seed, epochs=epochs)
    predictor = HistoryPredictor(seed=seed, epochs=epochs).train(runs, folds=folds)
    if len(resid) >= 10:
        predictor.quantiles[UNSEEN] = quantile_row(np.asarray(resid))
    predictor.blend = fit_table(samples + unseen_samples)
    return predictor


def leave_benchmarks_out(
    runs: Sequence[Run], *, seed: int = 0, epochs: int = 400
) -> tuple[list[dict], list[list[float]]]:
    """Calibration samples (key UNSEEN) and log prior residuals [work, duration] of each benchmark held
    out of a model trained on all the others."""
    by: dict[str, list] = {}
    for r in runs:
        by.setdefault(r.benchmark, []).append(r)
    if len(by) < 3:
        return [], []
    rng = random.Random(seed)
    samples, resid = [], []
    for bench in sorted(by):
        if len(by[bench]) < MIN_RUNS_TO_LEAVE_OUT:
            continue
        part = HistoryPredictor(seed=seed, epochs=epochs).train([r for r in runs if r.benchmark != bench], folds=1)
        held = rng.sample(by[bench], min(len(by[bench]), MAX_UNSEEN_RUNS_PER_BENCHMARK))
        for run in held:
            prior = part.prior(features_from_run(run))
            resid.append([math.log(run.total_work / prior.work), math.log(run.duration_s / prior.duration_s)])
        # Tagged with their benchmark: the blend's shrinkage is cross-fitted benchmark by benchmark on them.
        samples += [{**s, "group": bench} for s in calibration_samples(held, part)]
    return samples, resid
