"""The sweep recorder (`bench/search/record.py`): deterministic runs, the contract's line format, resumable file."""

import gzip
import json

import pytest

record = pytest.importorskip("bench.search.record")


def test_runs_are_deterministic_and_vary_every_parameter():
    assert record.run_params(7) == record.run_params(7)
    drawn = [record.run_params(i) for i in range(300)]
    assert {g for g, _, _ in drawn} == set(record.GROUPS)
    for key in ("lr", "width", "batch", "seed", "opt"):
        assert len({p[key] for _, p, _ in drawn}) > 1


def test_a_run_records_its_curve_with_true_timing_in_the_contract_format(tmp_path):
    data = record.split_digits()
    group, params, _ = record.run_params(3)
    result = record.train(group, params | {"batch": 128}, 2, data)
    points = result["points"]
    assert 0 < len(points) <= record.MAX_POINTS
    assert set(points[0]) == {"t", "step", "epoch", "loss", "val_loss", "val_acc"}
    assert all(a["t"] < b["t"] and a["step"] < b["step"] for a, b in zip(points, points[1:]))
    assert points[-1]["epoch"] == 2.0 and result["wall_s"] >= points[-1]["t"]


def test_the_file_resumes_past_a_truncated_last_line(tmp_path):
    path = tmp_path / "sweep.jsonl.gz"
    with gzip.open(path, "at") as handle:
        handle.write(json.dumps({"run": "sweep-0000"}) + "\n")
    with gzip.open(path, "at") as handle:
        handle.write(json.dumps({"run": "sweep-0001"}) + "\n")
    raw = path.read_bytes()
    path.write_bytes(raw[:-20])  # an interrupted write: the second line is cut
    assert record.recorded(path) == {"sweep-0000"}
    with gzip.open(path, "at") as handle:  # what the recorder appends next
        handle.write(json.dumps({"run": "sweep-0002"}) + "\n")
    with gzip.open(path, "rt") as handle:
        assert [json.loads(line)["run"] for line in handle] == ["sweep-0000", "sweep-0002"]


def test_a_recorded_loss_keeps_six_significant_digits_however_small():
    finite = record._finite
    assert finite(3.14159265e-7) == 3.14159e-7 and finite(1234.56789) == 1234.57 and finite(0.5) == 0.5
    assert finite(float("nan")) == 1e3 and finite(float("inf")) == 1e3
