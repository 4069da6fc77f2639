"""The matrix's spot column: cloud dollars (on-demand + spot) and completion against burst, totals against the goal."""

import pytest

from bench.sched.matrix import SPOT, SPOT_GOAL, _key, cell, runs, spot_summary


def _result(*, dollars: float, jct: float, spot: float = 0.0, interruptions: int = 0) -> dict:
    return {
        "on_demand_dollars": dollars,
        "spot_dollars": spot,
        "cloud_dollars": dollars + spot,
        "avg_jct_s": jct,
        "spot_interruptions": interruptions,
    }


def _cells(spot_dollars: float, spot_jct: float) -> list[dict]:
    results = {
        _key(("burst", "v", 8, 4, 0.0)): _result(dollars=1000.0, jct=100.0),
        _key(("trainmaster", "v", 8, 4, 0.0)): _result(dollars=700.0, jct=100.0),
        _key((SPOT, "v", 8, 4, 0.0)): _result(dollars=50.0, spot=spot_dollars - 50.0, jct=spot_jct, interruptions=3),
    }
    return [cell(results, "v", 8, 4, 0.0)]


def test_the_spot_column_counts_spot_and_on_demand_dollars_against_burst():
    [c] = _cells(300.0, 104.0)

    assert c["spot_dollars"] == 300.0 and c["spot_dollar_ratio"] == 0.3 and c["spot_jct_ratio"] == 1.04
    summary = spot_summary([c], 0.0)
    assert summary["total_dollar_ratio"] == 0.3 <= SPOT_GOAL and summary["interruptions"] == 3
    assert summary["goal_met"]


@pytest.mark.parametrize(("dollars", "jct"), [(400.0, 100.0), (300.0, 106.0)])
def test_the_goal_needs_both_the_dollars_and_the_completion(dollars, jct):
    assert not spot_summary(_cells(dollars, jct), 0.0)["goal_met"]


def test_the_spot_column_runs_trainmaster_at_every_error_and_the_baselines_stay_at_zero():
    todo = runs(["v"], [(8, 4)], (0.0, 0.3), ("trainmaster", SPOT, "burst"))

    assert (SPOT, "v", 8, 4, 0.0) in todo and (SPOT, "v", 8, 4, 0.3) in todo
    assert ("burst", "v", 8, 4, 0.3) not in todo
