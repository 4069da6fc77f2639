"""Issue 31's plain jobs as a never-seen check (`bench/search/families3.py`) and their replay through the served
`JobModel` (`bench/search/served.py`), on short and synthetic runs (never on the recorded check)."""

import math

import pytest

families3 = pytest.importorskip("bench.search.families3")
served = pytest.importorskip("bench.search.served")


def test_the_two_kinds_take_turns_deterministically():
    drawn = [families3.run_params(i) for i in range(12)]
    assert drawn == [families3.run_params(i) for i in range(12)]
    assert [f for f, _ in drawn[:2]] == list(families3.FAMILIES)
    assert {p["opt"] for f, p in drawn if f == "sgd-regression"} == {"sgd"}
    assert all(p["every"] == 10 for f, p in drawn if f == "sgd-regression")  # the full-batch loss every 10 steps
    assert {p["opt"] for f, p in drawn if f == "adam-ema"} == {"adam"}


@pytest.mark.parametrize("family", families3.FAMILIES)
def test_a_short_run_prints_its_loss_at_its_steps(family):
    params = families3.run_params(families3.FAMILIES.index(family))[1] | {"steps": 60, "pause": 0.0, "every": 10}
    points = families3.train(family, params)["points"]
    assert [p["step"] for p in points] == [10, 20, 30, 40, 50, 60]
    assert all(a["t"] < b["t"] for a, b in zip(points, points[1:])) and all(math.isfinite(p["loss"]) for p in points)


def synthetic_run(start_up: float) -> dict:
    """A power-law loss printed every 10 steps at 100 steps a second, meeting 0.05 at its 56th line."""
    points = [
        {"t": 0.1 * i, "step": 10 * i, "loss": round(0.01 + 0.6 * (1 + 10 * i / 30) ** -0.9, 6)} for i in range(1, 201)
    ]
    return {"run": "synthetic", "family": "sgd-regression", "points": points, "startup_s": start_up}


def test_a_job_ends_at_its_first_crossing_and_is_scored_at_each_cut():
    run = synthetic_run(2.0)
    hit = next(i for i, p in enumerate(run["points"]) if p["loss"] <= 0.05)
    job = served.replay(run, 0.05, served.REGEX["step"])
    assert job["end"] == pytest.approx(2.0 + run["points"][hit]["t"])
    assert set(job["cuts"]) == set(served.CUTS) and job["cuts"][0.1] is None  # the start-up: no line by 10%
    late = job["cuts"][0.8]
    assert late["t"] <= 0.8 * job["end"] and late["truth"] == pytest.approx(job["end"] - late["t"], abs=0.01)
    assert served.replay(run, 0.001, served.REGEX["step"]) is None  # never met: no job
    summary = served.summary([job])
    assert summary["all"]["cuts"]["10%"] == {
        "n": 1,
        "estimated": 0,
        "within_20": 0.0,
        "coverage": 0.0,
        "median_abs_error": None,
        "median_error": None,
    }
