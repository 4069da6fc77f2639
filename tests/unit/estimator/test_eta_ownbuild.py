"""The own-job blend table's build (`ownbuild`): the same table and fitted curve whatever the number of processes,
a reduced build on some families, and the fitted curve's power law as a build option."""

import json
import os
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

from services.estimator.model import owncorpus
from services.estimator.model.forked import in_processes

pytest.importorskip("torch")


def test_parts_made_in_processes_are_the_parts_made_here_in_order():
    data = {k: np.arange(k, k + 5.0) for k in range(6)}  # inherited by the forked processes, never pickled

    def make(key: int) -> float:
        return float(np.sum(data[key] ** 2))

    assert in_processes(make, list(range(6)), jobs=3) == [make(k) for k in range(6)]
    assert in_processes(make, [], jobs=3) == []
    with pytest.raises(ZeroDivisionError):
        in_processes(lambda k: 1 / k, [1, 0], jobs=2)  # a part that fails fails the build
    with pytest.raises(BrokenProcessPool):
        in_processes(lambda k: os._exit(k), [0, 1], jobs=2)  # so does a process that dies: no hang


def test_a_process_forked_from_a_multithreaded_torch_makes_its_part():
    """Torch used on two threads here, then forked: without setting it to one thread first, the child hangs."""
    import torch

    torch.set_num_threads(2)
    x = torch.ones(2_000, 64)
    assert float((x @ x.T).sum()) > 0
    assert in_processes(
        lambda k: float(torch.ones(300, 300).matmul(torch.ones(300, 300)).sum()) + k, [0, 1], jobs=2
    ) == [
        2.7e7,
        2.7e7 + 1,
    ]


def _corpus():
    def runs(group, scale, power, **extra):
        points = [
            {"t": 0.1 * i, "step": 10 * i, "loss": scale / i**power, "val_loss": scale / i ** (power * 0.7)}
            for i in range(1, 31)
        ]
        for p in points:
            p["val_acc"] = 1 - p["val_loss"] / (2 * scale)
        return [
            {"run": f"{group}-{s}", "group": group, "params": {"seed": s}, "points": points, **extra} for s in range(5)
        ]

    corpus = runs("digits-mlp", 2.0, 0.7) + runs("x", 3.0, 0.9, family="conv-adam") + runs("y", 1.0, 0.5, family="gru")
    return [{**r, "family": owncorpus.family(r)} for r in corpus]


@pytest.fixture
def small_build(monkeypatch):
    """The build on a corpus of three small families, its networks fitted in a few steps and the prior not
    fine-tuned (what the build does with the parts is what is tested)."""
    from services.estimator.model import owntrain
    from services.estimator.model.curveprior import net as priornet, train

    if not priornet.PRETRAINED.exists():
        pytest.skip("the pre-trained prior is not in this checkout")
    corpus = _corpus()
    real_fit = owntrain.fit_net
    monkeypatch.setattr(owncorpus, "load_corpus", lambda paths: corpus)
    monkeypatch.setattr(owntrain, "fit_net", lambda x, y, **kw: real_fit(x, y, **kw | {"steps": 15}))
    monkeypatch.setattr(train, "finetune_samples", lambda base, x, y, **kw: base)
    monkeypatch.setattr(train, "synthetic_mix", lambda *a, **kw: (np.zeros((0, 60)), np.zeros(0)))
    return corpus


def test_the_build_in_processes_is_the_build_in_one(small_build):
    """The families' samples, the folds' readings and the fitted curve's networks made in two processes are
    those made in one, to the bit (the table is fitted on them in the parent either way)."""
    from services.estimator import ownnested
    from services.estimator.model.curveprior import net as priornet

    pretrained = priornet.load(priornet.PRETRAINED)
    built = {}
    for jobs in (1, 2):
        samples = ownnested.curve_samples(small_build, jobs=jobs)
        encoded = ownnested.prior_samples(small_build, jobs=jobs)
        readings = ownnested.nested_readings(
            small_build, pretrained=pretrained, samples=samples, encoded=encoded, cache_dir=None, jobs=jobs
        )
        built[jobs] = (samples, encoded, readings, ownnested.shipped_curve(samples, runs=small_build, jobs=jobs))
    (samples, encoded, readings, curve), (samples2, encoded2, readings2, curve2) = built[1], built[2]
    assert list(samples) == list(samples2) == ["conv-adam", "digits", "gru"]
    for fam in samples:
        for seed, (x, y) in samples[fam].fit.items():
            assert np.array_equal(x, samples2[fam].fit[seed][0]) and np.array_equal(y, samples2[fam].fit[seed][1])
        assert all(np.array_equal(v, vars(encoded2[fam])[k]) for k, v in vars(encoded[fam]).items())
    assert len(readings.truth) > 0 and readings.families == readings2.families
    for part in ("prior", "fitted", "truth"):
        assert np.array_equal(getattr(readings, part), getattr(readings2, part))
    assert curve == curve2 and len(curve["nets"]) == 4
    assert "power_fit" not in curve  # the plain fit's file is as it always was


def test_a_reduced_build_reads_only_the_families_named(small_build, monkeypatch, tmp_path):
    from services.estimator import ownbuild

    chosen_on = []
    monkeypatch.setattr(ownbuild, "table_for", lambda readings: chosen_on.append(set(readings.families)) or (1, 2))
    curve = tmp_path / "curve.json"
    _, rows = ownbuild.build_table(("unused",), curve_out=curve, families={"gru", "conv-adam"})
    assert json.loads(curve.read_text())["runs"] == 10 and rows > 0 and chosen_on == [{"gru", "conv-adam"}]
    with pytest.raises(ValueError, match=r"param\[families\].*nope"):
        ownbuild.build_table(("unused",), families={"gru", "nope"})


def test_a_reduced_build_never_writes_the_shipped_files(capsys):
    from services.estimator import ownbuild

    with pytest.raises(SystemExit):
        ownbuild.main(["--families", "gru"])
    assert "--families" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ownbuild.main(["--jobs", "0"])
    with pytest.raises(SystemExit):
        ownbuild.main(["--power-fit", "cubic"])


def test_the_tail_weighted_build_changes_the_power_law_alone_and_says_so(small_build, tmp_path):
    """`--power-fit tail`: the fitted curve's samples differ in the power law's features only, are cached apart
    from the plain ones, and the fitted curve's file records the fit so that the live estimate reads it so."""
    from services.estimator import ownnested
    from services.estimator.model.owncurve import FEATURES, TAIL

    plain = ownnested.curve_samples(small_build, tmp_path)
    tail = ownnested.curve_samples(small_build, tmp_path, power_fit=TAIL)
    assert sorted(p.name.split("-")[2] for p in tmp_path.glob("curve-seeds-*.npz")).count("tail") == 3
    power = [FEATURES.index("power"), FEATURES.index("power_ok")]
    others = [i for i in range(len(FEATURES)) if i not in power]
    moved = False
    for fam, got in plain.items():
        for seed, (x, y) in got.fit.items():
            tx, ty = tail[fam].fit[seed]
            assert np.array_equal(x[:, others], tx[:, others]) and np.array_equal(y, ty)
            moved |= not np.array_equal(x[:, power], tx[:, power])
    assert moved
    assert ownnested.shipped_curve(tail, runs=small_build, power_fit=TAIL)["power_fit"] == TAIL
