"""The held-out families of the own-jobs corpus (`bench/search/families.py`): the recorded file reads through
`owncorpus` with each run's family, every family gives cases, and the families' mid-run changes are real."""

import gzip
import inspect
import json
from collections import Counter

import pytest
import torch

from services.estimator.model import owncorpus

families = pytest.importorskip("bench.search.families")
families_fit = pytest.importorskip("bench.search.families_fit")


def recorded_families() -> list[dict]:
    return [run for run in owncorpus.load_corpus() if run["run"].startswith("families-")]


def test_the_recorded_families_load_through_the_corpus_with_their_family():
    runs = recorded_families()
    assert {run["family"] for run in runs} == set(families.FAMILIES)
    with gzip.open(owncorpus.BROAD, "rt") as handle:
        broad = json.loads(handle.readline())
    for run in runs:  # broad's line, plus the family
        assert set(run) == set(broad) | {"family"} and run["family"] == run["group"]
        assert set(run["points"][0]) == set(broad["points"][0]) and "seed" in run["params"]
    old = [run for run in owncorpus.load_corpus((owncorpus.SWEEP, owncorpus.BROAD))]
    assert all(run["family"] == owncorpus.GROUP_FAMILY.get(run["group"], run["group"]) for run in old)  # their groups
    assert {run["family"] for run in old if run["group"].startswith("digits-")} == {"digits"}  # one family of three


def test_every_family_gives_cases_and_accuracy_is_read_as_maximised():
    runs = recorded_families()
    by_metric = {
        m: owncorpus.cases(runs, m, us=owncorpus.CALIBRATION_U, smooths=(False, True)) for m in owncorpus.METRICS
    }
    assert set(Counter(c.group for c in by_metric["loss"])) == set(families.FAMILIES)
    accuracy = by_metric["val_acc"]
    assert accuracy and {c.mode for c in accuracy} == {"max"} and all(c.values[-1] >= c.target for c in accuracy)
    assert {c.group for c in accuracy} >= {"conv-images", "attention-seq", "epoch-acc"}


def test_runs_are_deterministic_take_turns_and_vary_pace_and_depth():
    assert families.run_params(11) == families.run_params(11)
    drawn = [families.run_params(i) for i in range(140)]
    assert [f for f, _ in drawn[:7]] == list(families.FAMILIES)
    for key in ("lr", "batch", "seed", "opt", "steps", "schedule", "printed"):
        assert len({p.get(key) for _, p in drawn}) > 1
    assert {p["shift"] for f, p in drawn if f == "pace-shift"} == {"unfreeze", "batch-ramp", "print-change", "throttle"}
    assert {p["schedule"] for _, p in drawn} == {"constant", "warmup", "step", "cosine", "warmup-cosine"}
    assert {p["opt"] for _, p in drawn} == {"sgd", "adam", "adamw"}


def test_a_printed_ema_is_smoothed_once():
    _, params = next((f, p) for f, p in (families.run_params(i) for i in range(200)) if p["printed"] == "ema")
    assert params["mean"] == round((1 + params["ema"]) / (1 - params["ema"]))
    points = [
        {
            "t": float(i),
            "step": i,
            "epoch": i / 10,
            "loss": 2.0 / i + (0.3 if i % 2 else 0.0),
            "val_loss": None,
            "val_acc": None,
        }
        for i in range(1, 60)
    ]
    run = {"run": "families-x", "group": "noisy-ema", "params": params, "points": points}
    assert owncorpus.make_case(run, "loss", u=0.8, smooth=True) == owncorpus.make_case(run, "loss", u=0.8, smooth=False)


def short(index: int, **change) -> tuple[str, dict]:
    family, params = families.run_params(index)
    return family, params | {"steps": 40, "points": 8} | change


def test_a_short_run_of_every_family_records_broads_points():
    for index in range(7):
        family, params = short(index, **({"epochs": 2, "steps": 150} if index == 4 else {}))
        if family in ("attention-seq", "gru-text"):
            params |= {"length": 8}
        result = families_fit.fit(families.build(family, params), params)
        points = result["points"]
        assert set(points[0]) == {"t", "step", "epoch", "loss", "val_loss", "val_acc"}, family
        assert all(a["t"] < b["t"] and a["step"] < b["step"] for a, b in zip(points, points[1:])), family
        assert points[-1]["step"] == params["steps"] and result["wall_s"] >= points[-1]["t"]


def test_the_pace_changes_mid_run():
    base = {"seed": 0, "opt": "adam", "lr": 1e-3, "points": 10, "steps": 100, "at": 0.5}
    unfreeze = families.build("pace-shift", base | {"shift": "unfreeze", "channels": 4, "batch": 8})
    convolution = next(unfreeze.model.parameters())
    unfreeze.on_step(50)
    assert not convolution.requires_grad
    unfreeze.on_step(51)
    assert convolution.requires_grad
    ramp = families.build("pace-shift", base | {"shift": "batch-ramp", "width": 8, "batch": 4})
    assert len(ramp.draw(50)[1]) == 4 and len(ramp.draw(51)[1]) == 16
    for slower, gaps in ((3, {10, 30}), (0.25, {10, 2})):  # a line every 10 steps, then every 30 or 2
        marks = sorted(
            families.build(
                "pace-shift", base | {"shift": "print-change", "width": 8, "batch": 8, "slower": slower}
            ).marks
        )
        assert {b - a for a, b in zip(marks, marks[1:])} == gaps


def test_the_schedules_shape_the_learning_rate():
    from bench.search.families_models import multiplier

    step = multiplier("step", 100)
    assert (step(10), step(60), step(90)) == pytest.approx((1.0, 0.1, 0.01))
    warm = multiplier("warmup-cosine", 100, warmup=10)
    assert warm(0) == pytest.approx(0.1) and warm(10) == pytest.approx(1.0) and warm(99) < 0.05
    assert torch.is_tensor(families.data.shapes()[0]) and families.data.shapes()[0].shape[1:] == (1, 16, 16)


def test_nothing_shipped_is_fitted_on_the_unseen_families_and_the_unseen_split_refuses_seen_ones():
    from services.estimator import ownfamily
    from services.estimator.model.curveprior import train

    assert owncorpus.FAMILIES in owncorpus.TRAINED  # the seven families of the first file are tuned on now
    assert owncorpus.UNSEEN == (owncorpus.FAMILIES2,) and owncorpus.FAMILIES2 not in owncorpus.TRAINED
    assert owncorpus.FAMILIES2 in owncorpus.CORPUS
    assert "owncorpus.load_corpus(owncorpus.TRAINED)" in inspect.getsource(train)  # the prior's fine-tuning
    with pytest.raises(ValueError, match="param\\[--sweep\\] invalid: families"):
        ownfamily.run_unseen_evaluation((owncorpus.BROAD,))
    with pytest.raises(ValueError, match="param\\[--sweep\\] invalid: families"):
        ownfamily.run_unseen_evaluation((owncorpus.FAMILIES,))


def test_the_corpus_read_by_default_is_what_the_estimator_is_fitted_on_never_the_unseen_split():
    unseen = {owncorpus.family(run) for path in owncorpus.UNSEEN for run in owncorpus.load_sweep(path)}
    assert unseen and unseen.isdisjoint(run["family"] for run in owncorpus.load_corpus())
