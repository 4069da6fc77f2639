"""The own-job estimate from the curve prior, and the one the live tracker and the harness serve (pure)."""

from __future__ import annotations

import math

from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.encode import encode
from services.estimator.model.curveprior.net import PriorNet
from services.estimator.model.owncurve import Marks, OwnEstimate, Series, own_estimate, past_rise, reached


def prior_estimate(
    ts: Series, xs: Marks, values: Series, *, target: float, mode: str, elapsed: float, prior: PriorNet
) -> OwnEstimate | None:
    """Total duration (s since the start) and its 10-90% band from the prior's distribution of the crossing, or
    None when the prefix holds too little. A band reaching the horizon says the target may never come."""
    if len(values) and reached(values, target=target, mode=mode):
        return OwnEstimate(elapsed, elapsed, elapsed, "reached", 1.0)
    read = encode(ts, xs, values, target=target, mode=mode, elapsed=elapsed)
    if read is None:
        return None
    q10, q50, q90, _never = prior.band(read.x)
    total, low, high = (read.origin + read.span * math.exp(q) for q in (q50, q10, q90))
    return OwnEstimate(
        max(total, elapsed),
        max(min(low, total), elapsed),
        max(high, total),
        "curve-prior",
        min(1.0, elapsed / max(total, elapsed)),
    )


def estimate(
    ts: Series,
    xs: Marks,
    values: Series,
    *,
    target: float,
    mode: str,
    elapsed: float,
    calibration: dict | None,
    prior: PriorNet | None,
    blend: bool = False,
    table: blendtable.BlendTable | None = None,
) -> OwnEstimate | None:
    """The own-job estimate: the prior's when one is given and the prefix reads, else the fitted curve's
    (`owncurve.own_estimate`); with `blend` (what the tracker serves), both where both read (`blended`, by the
    learned `table` when given): the prior alone was less often within ±20% on families it never saw, the fitted
    curve alone sure of itself on an unrecorded kind of training (docs/estimator.md, "The learned curve prior").
    A prefix that first rose away from the target is read from its worst value on (`owncurve.past_rise`)."""
    got = None
    ts, xs, values = past_rise(ts, xs, values, mode=mode)
    if prior is not None:
        got = prior_estimate(ts, xs, values, target=target, mode=mode, elapsed=elapsed, prior=prior)
        if got is not None and not blend:
            return got
    fitted = own_estimate(ts, xs, values, target=target, mode=mode, elapsed=elapsed, calibration=calibration)
    if got is None or fitted is None or "reached" in (got.kind, fitted.kind):
        return fitted or got
    return blended(got, fitted, elapsed=elapsed, table=table)


def blended(
    prior: OwnEstimate, fitted: OwnEstimate, *, elapsed: float, table: blendtable.BlendTable | None = None
) -> OwnEstimate:
    """With a `table`, its weight, bias and band for the phase of the run (`blendtable.combine`); without one,
    the geometric mean of the two totals' time still to come and the band that holds both bands."""
    if table is not None and elapsed > 0:
        got = blendtable.combine(
            blendtable.reading(prior.total_s, prior.low_s, prior.high_s, elapsed=elapsed),
            blendtable.reading(fitted.total_s, fitted.low_s, fitted.high_s, elapsed=elapsed),
            table,
        )
        total, low, high = (elapsed * math.exp(v) for v in (got.mid, got.low, got.high))
        return OwnEstimate(total, min(low, total), max(high, total), "curve-prior+fit", min(1.0, elapsed / total))
    ahead = math.sqrt(max(prior.total_s - elapsed, 1e-9) * max(fitted.total_s - elapsed, 1e-9))
    total = elapsed + ahead
    low, high = min(prior.low_s, fitted.low_s), max(prior.high_s, fitted.high_s)
    return OwnEstimate(
        total, min(low, total), max(high, total), "curve-prior+fit", min(1.0, elapsed / max(total, elapsed))
    )
