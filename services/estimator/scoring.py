"""The error statistics of ETA predictions at one cut, shared by the MLPerf and own-jobs evaluations."""

import math

import numpy as np


def summarise(rows: list[dict]) -> dict:
    """Error statistics at one cut; a row without a prediction (unscorable run) counts as a miss."""
    done = [r for r in rows if r["pred"] is not None and math.isfinite(r["pred"])]
    if not done:
        return {"n": 0, "n_total": len(rows), "within_20pct": 0.0}
    ape = np.array([abs(r["pred"] / r["truth"] - 1) for r in done])
    rem_err = np.array([abs(r["pred"] - r["truth"]) for r in done])
    rem_ape = np.array([abs(r["pred"] - r["truth"]) / max(r["truth"] - r["now"], 1e-9) for r in done])
    out = {
        "n": len(done),
        "n_total": len(rows),
        "median_ape": float(np.median(ape)),
        "mape": float(np.mean(ape)),
        "within_20pct": float(np.sum(ape <= 0.2) / len(rows)),
        "within_20pct_scored": float(np.mean(ape <= 0.2)),
        "median_abs_err_remaining_s": float(np.median(rem_err)),
        "median_ape_remaining": float(np.median(rem_ape)),
    }
    banded = [r for r in done if r.get("low") is not None and math.isfinite(r["low"])]
    if banded:
        out["coverage_10_90"] = float(np.mean([r["low"] <= r["truth"] - r["now"] <= r["high"] for r in banded]))
    return out
