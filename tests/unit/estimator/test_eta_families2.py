"""The second never-seen split of the own-jobs corpus (`bench/search/families2.py`, issue 31 item 5): five families
unlike the eleven tuned on, recorded in the same shape, read through `owncorpus` with their family and kept out
of everything shipped."""

import math

import pytest

from services.estimator.model import owncorpus

families2 = pytest.importorskip("bench.search.families2")
families = pytest.importorskip("bench.search.families")
families_fit = pytest.importorskip("bench.search.families_fit")


def test_the_new_families_are_none_of_the_eleven_and_take_turns_deterministically():
    tuned = {owncorpus.family(r) for r in owncorpus.load_corpus(owncorpus.TRAINED)}
    assert tuned >= set(families.FAMILIES) | {"digits", "np-mlp-mean", "tab-mlp", "reg-mlp"}
    assert not set(families2.FAMILIES) & tuned and len(set(families2.FAMILIES)) == len(families2.FAMILIES)
    drawn = [families2.run_params(i) for i in range(50)]
    assert drawn == [families2.run_params(i) for i in range(50)]
    assert [f for f, _ in drawn[: len(families2.FAMILIES)]] == list(families2.FAMILIES)
    convlm = [p for f, p in drawn if f == "ppl-convlm"]
    assert all(p["opt"] == "adamw" and p["schedule"].startswith("warmup") and p["ppl"] for p in convlm)
    assert {p["schedule"] for f, p in drawn if f == "resnet-epochs"} == {"step"}


def short(family: str, **change) -> dict:
    index = families2.FAMILIES.index(family)
    return families2.run_params(index)[1] | {"steps": 30, "points": 6} | change


@pytest.mark.parametrize("family", families2.FAMILIES)
def test_a_short_run_of_every_family_records_broads_points(family):
    params = short(family, **({"epochs": 2, "train": 256, "batch": 64} if family == "resnet-epochs" else {}))
    result = families_fit.fit(families2.build(family, params), params)
    points = result["points"]
    if params.get("ppl"):
        points = families2.perplexity(points)
    assert set(points[0]) == {"t", "step", "epoch", "loss", "val_loss", "val_acc"}
    assert all(a["t"] < b["t"] and a["step"] < b["step"] for a, b in zip(points, points[1:]))
    assert points[-1]["step"] == params["steps"] and all(math.isfinite(p["loss"]) for p in points)
    if family == "autoencoder":
        assert all(p["val_acc"] is None for p in points)  # a reconstruction has no accuracy
    else:
        assert all(0.0 <= p["val_acc"] <= 1.0 for p in points)
    if family == "resnet-epochs":
        assert [p["step"] for p in points] == [4, 8]  # one line an epoch


def test_a_language_model_prints_perplexity_and_a_huge_loss_stays_finite():
    points = [{"t": 1.0, "step": 1, "epoch": 0.1, "loss": math.log(40.0), "val_loss": 1e6, "val_acc": 0.1}]
    got = families2.perplexity(points)[0]
    assert got["loss"] == pytest.approx(40.0, rel=1e-3) and math.isfinite(got["val_loss"])


def test_the_recorded_unseen_families_load_with_their_family_and_give_cases():
    runs = owncorpus.load_corpus(owncorpus.UNSEEN)
    if not runs:
        pytest.skip("the second families file is not in this checkout")
    assert {run["family"] for run in runs} <= set(families2.FAMILIES) and all(
        run["run"].startswith("families2-") for run in runs
    )
    cases = owncorpus.cases(runs, "loss")
    assert len({c.family for c in cases}) >= 4
    accuracy = owncorpus.cases(runs, "val_acc")
    assert accuracy and {c.mode for c in accuracy} == {"max"}
