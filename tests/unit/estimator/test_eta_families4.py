"""The deep-tail families of the own-jobs corpus (`bench/search/families4.py`, issue 31 item 5), on short runs
(never on the recorded file)."""

import gzip
import json
import math

import pytest

families4 = pytest.importorskip("bench.search.families4")


def test_the_three_families_take_turns_deterministically_with_the_corpus_seeds():
    drawn = [families4.run_params(i) for i in range(30)]
    assert drawn == [families4.run_params(i) for i in range(30)]
    assert [f for f, _ in drawn[:3]] == list(families4.FAMILIES)
    assert {p["seed"] for _, p in drawn} <= {0, 1, 2, 3, 4}  # calibration seeds 0-3, held-out seed 4
    assert all(p["lr"] < 1.0 for f, p in drawn if f == "lstsq-spectrum")  # a stable step (the Hessian is 2 X'X/n)


@pytest.mark.parametrize("family", families4.FAMILIES)
def test_a_short_run_prints_a_finite_falling_loss_at_its_steps(family):
    params = families4.run_params(families4.FAMILIES.index(family))[1] | {"steps": 200, "pause": 0.0, "every": 20}
    points = families4.train(family, params)["points"]
    assert [p["step"] for p in points] == list(range(20, 201, 20))
    assert all(a["t"] < b["t"] for a, b in zip(points, points[1:])) and all(math.isfinite(p["loss"]) for p in points)
    assert points[-1]["loss"] < points[0]["loss"]


def test_a_family_recorder_writes_each_run_once_with_its_start_up_and_steps(tmp_path):
    record = pytest.importorskip("bench.search.record")
    out, trained = tmp_path / "runs.jsonl.gz", []

    def train(family, params):
        trained.append(params["seed"])
        return {"points": [{"t": 0.1, "step": 10, "loss": 1.0}, {"t": 0.2, "step": 20, "loss": 0.5}], "wall_s": 0.2}

    def run(argv):
        record.record_family_runs(
            argv,
            description="test",
            default_runs=2,
            default_out=out,
            prefix="fake",
            run_params=lambda i: ("toy", {"seed": i, "steps": 20}),
            train=train,
            startup=lambda: 1.5,
        )

    run([])
    run(["--runs", "3"])  # the two recorded are skipped, one more is trained
    with gzip.open(out, "rt") as handle:
        lines = [json.loads(line) for line in handle]
    assert [line["run"] for line in lines] == ["fake-0000", "fake-0001", "fake-0002"] and trained == [0, 1, 2]
    assert all(line["family"] == line["group"] == "toy" and line["startup_s"] == 1.5 for line in lines)
    assert lines[0]["epochs"] == 20.0 and lines[0]["points"][1]["loss"] == 0.5
