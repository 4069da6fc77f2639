"""Another build of the own-job estimator scored beside the shipped one (eta13): the held-out splits read a build's
fitted curve and blend table (`ownbuild --curve-out`, `--out`) or fit its power law in every fold, and issue 31's
plain jobs replay through the tracker by either build (`bench/eta/plain_jobs.py`)."""

import json
from pathlib import Path

import pytest

from bench.eta import plain_jobs
from services.estimator import evaluate, ownfamily, tracker
from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable, net as priornet
from services.estimator.model.owncurve import CALIBRATION, TAIL


def headline(report: dict) -> dict:
    return report["methods"][report["headline_method"]]["loss"]["all"]


def test_the_unseen_split_scores_the_blend_table_and_fitted_curve_it_is_given(tmp_path):
    shipped = ownfamily.run_unseen_evaluation()
    raw = json.loads(blendtable.TABLE.read_text())
    raw["cells"] = [[1.0, *cell[1:]] for cell in raw["cells"]]  # the prior alone, where the shipped blend shares
    table = tmp_path / "blend.json"
    table.write_text(json.dumps(raw))
    given = ownfamily.run_unseen_evaluation(table_path=table)
    assert headline(given) != headline(shipped)
    # the baselines do not read the table: the same figures
    assert given["methods"]["curve_prior"] == shipped["methods"]["curve_prior"]
    assert shipped["power_fit"] == "plain" and given["power_fit"] == "plain"
    curve = json.loads(CALIBRATION.read_text()) | {"power_fit": TAIL}  # the same networks, fed the tail fit's feature
    (tmp_path / "owncurve.json").write_text(json.dumps(curve))
    tail = ownfamily.run_unseen_evaluation(calibration_path=tmp_path / "owncurve.json")
    assert tail["power_fit"] == TAIL and tail["methods"]["own_curve_shipped"] != shipped["methods"]["own_curve_shipped"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"table_path": Path("missing.json")}, "--table"),
        ({"calibration_path": Path("missing.json")}, "--calibration"),
    ],
)
def test_an_unreadable_build_file_is_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=f"param\\[{field}\\] invalid"):
        ownfamily.run_unseen_evaluation(**kwargs)


def test_a_hostile_table_is_refused_not_read_as_the_former_blend(tmp_path):
    table = tmp_path / "blend.json"
    table.write_text(json.dumps({"version": 1, "edges": [], "cells": [[2.0, 1.0, 0.0]]}))
    with pytest.raises(ValueError, match="param\\[--table\\] invalid"):
        ownfamily.run_unseen_evaluation(table_path=table)


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--split", "unseen", "--power-fit", "tail"], "--power-fit"),
        (["--split", "family", "--table", "blend.json"], "--table"),
        (["--table", "blend.json"], "--table"),
        (["--calibration", "owncurve.json", "--split", "round"], "--calibration"),
    ],
)
def test_the_cli_refuses_a_build_option_where_it_means_nothing(argv, field, capsys):
    corpus = [] if "--calibration" in argv else ["--corpus", "own-jobs"]
    with pytest.raises(SystemExit):
        evaluate.main(corpus + argv)
    assert f"param[{field}] invalid" in capsys.readouterr().err


@pytest.mark.skipif(not priornet.PRETRAINED.exists(), reason="the pre-trained prior is not in this checkout")
def test_the_family_split_fits_every_folds_power_law_as_told(monkeypatch):
    pytest.importorskip("torch")
    from services.estimator import ownnested
    from services.estimator.model import owntrain
    from services.estimator.model.curveprior import train

    def runs(group, scale, **extra):
        points = [{"t": 0.1 * i, "step": 10 * i, "loss": scale / i**0.7} for i in range(1, 31)]
        return [
            {"run": f"{group}-{s}", "group": group, "params": {"seed": s}, "points": points, **extra} for s in range(5)
        ]

    corpus = runs("digits-mlp", 2.0) + runs("x", 3.0, family="conv-adam")
    monkeypatch.setattr(owncorpus, "load_corpus", lambda paths: corpus)
    monkeypatch.setattr(train, "finetune_samples", lambda base, x, y, **kw: base)
    real_fit = owntrain.fit_net  # the networks are not what this test checks: a few steps each
    monkeypatch.setattr(owntrain, "fit_net", lambda x, y, **kw: real_fit(x, y, **(kw | {"steps": 10})))
    fits, real_samples, real_fold = [], ownnested.curve_samples, ownnested.fold

    def curve_samples(runs, *a, **kw):
        fits.append(("samples", kw.get("power_fit")))
        return real_samples(runs, *a, **kw)

    def fold(*a, **kw):
        got = real_fold(*a, **kw)
        fits.append(("fold", got.curve.get("power_fit")))
        return got

    monkeypatch.setattr(ownnested, "curve_samples", curve_samples)
    monkeypatch.setattr(ownnested, "fold", fold)
    report = ownfamily.run_family_evaluation(("unused",), baselines=False, power_fit=TAIL)
    assert fits == [("samples", TAIL), ("fold", TAIL), ("fold", TAIL)]
    assert report["power_fit"] == TAIL and report["families"] == ["conv-adam", "digits"]
    with pytest.raises(ValueError, match="param\\[--power-fit\\] invalid"):
        ownfamily.run_family_evaluation(("unused",), power_fit="square")


def test_the_replay_reads_the_build_it_is_given_and_then_the_shipped_one_again(tmp_path):
    shipped_curve, shipped_table = tracker.calibration(), tracker.blend_table()
    curve = json.loads(CALIBRATION.read_text()) | {"power_fit": TAIL}
    (tmp_path / "owncurve.json").write_text(json.dumps(curve))
    raw = json.loads(blendtable.TABLE.read_text())
    raw["cells"] = [[1.0, *cell[1:]] for cell in raw["cells"]]
    (tmp_path / "blend.json").write_text(json.dumps(raw))
    run = plain_jobs.synthetic_power()
    before = plain_jobs.served.replay(run, 0.02, plain_jobs.STEP_REGEX)
    with plain_jobs.served_by(tmp_path / "owncurve.json", tmp_path / "blend.json") as fit:
        assert fit == TAIL and tracker.calibration()["power_fit"] == TAIL
        assert tracker.blend_table() is not None and tracker.blend_table().cells[0].weight == 1.0
        other = plain_jobs.served.replay(run, 0.02, plain_jobs.STEP_REGEX)
    assert other["cuts"] != before["cuts"]
    assert tracker.calibration() is shipped_curve and tracker.blend_table() is shipped_table
    with pytest.raises(ValueError, match="param\\[--build\\] invalid"):
        with plain_jobs.served_by(tmp_path / "missing.json", tmp_path / "blend.json"):
            pass


def test_a_build_is_named_by_its_files_or_the_shipped_ones():
    assert plain_jobs.parse_build("plain=") == ("plain", CALIBRATION, blendtable.TABLE)
    assert plain_jobs.parse_build("tail=a.json,b.json") == ("tail", Path("a.json"), Path("b.json"))
    for bad in ("=a.json,b.json", "tail=a.json", "tail=,b.json"):
        with pytest.raises(Exception, match="param\\[--build\\] invalid"):
            plain_jobs.parse_build(bad)


def test_the_synthetic_curve_meets_its_target_where_the_docs_say():
    points = plain_jobs.synthetic_power()["points"]
    hit = next(p for p in points if p["loss"] <= 0.02)
    assert 175 < hit["t"] < 185  # ~180 s: 162 s left at 10% of the run (docs/estimator.md, eta10)


def test_a_paced_replay_keeps_the_curve_and_the_start_up_and_stretches_the_steps():
    run = {"run": "r", "family": "f", "startup_s": 13.0, "points": [{"t": 0.5, "step": 10, "loss": 0.5}]}
    slow = plain_jobs.paced(run, 12.0)
    assert slow["points"] == [{"t": 6.0, "step": 10, "loss": 0.5}] and slow["startup_s"] == 13.0
    assert run["points"][0]["t"] == 0.5  # the recorded run is left as it was


@pytest.mark.parametrize("pace", ["0", "-2", "nan", "inf"])
def test_a_pace_that_is_not_a_positive_number_is_refused_by_name(pace, capsys):
    with pytest.raises(SystemExit):
        plain_jobs.main(["--build", "shipped=", "--pace", pace])
    assert "param[--pace] invalid" in capsys.readouterr().err
