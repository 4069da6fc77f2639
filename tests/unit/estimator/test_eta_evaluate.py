"""The evaluation harness on a small synthetic corpus: round split, declared targets, what is counted."""

import io
import json
import math
import tarfile

import pytest
from eta_factories import mllog

from services.estimator import evaluate
from services.estimator.model import calibrate
from services.estimator.model.targets import parse_targets

SYSTEM_GPU = "NVIDIA H100-SXM5-80GB"
SYSTEM = {"accelerator_model_name": SYSTEM_GPU, "number_of_nodes": "1", "accelerators_per_node": "8"}


def run_log(*, target, mode="max", work=40, rate=1.0, status="success", metric="eval_accuracy", evals=8):
    """A run whose metric approaches `target` and meets it at `work` epochs, `rate` epochs a second."""
    lines = [
        mllog("global_batch_size", 256, t_ms=0),
        mllog("opt_base_learning_rate", 0.001, t_ms=0),
        mllog("run_start", t_ms=1000),
    ]
    sign = 1 if mode == "max" else -1
    for i in range(1, evals + 1):
        epoch = work * i / evals
        t_ms = 1000 + int(epoch / rate * 1000)
        lines.append(mllog("epoch_stop", t_ms=t_ms - 10, epoch_num=epoch))
        gap = 0.3 * (math.exp(-3 * i / evals) - math.exp(-3)) if i < evals else 0.0
        lines.append(mllog(metric, target - sign * gap, t_ms=t_ms, epoch_num=epoch))
    lines.append(mllog("run_stop", t_ms=1000 + int(work / rate * 1000), status=status))
    return "\n".join(lines)


def write_round(path, runs, *, accelerators=()):
    """A tarball shaped like an MLPerf results release: <org>/systems, <org>/results/<system>/<bench>; org `o`'s
    box has `accelerators[o]` where given, else SYSTEM's H100."""
    with tarfile.open(path, "w:gz") as tar:
        names = dict(enumerate(accelerators))
        files = [
            (f"org{o}/systems/box.json", json.dumps({**SYSTEM, "accelerator_model_name": names.get(o, SYSTEM_GPU)}))
            for o in range(3)
        ]
        for i, (bench, text) in enumerate(runs):
            files.append((f"org{i % 3}/results/box/{bench}/result_{i}.txt", text))
        for name, text in files:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def rounds(tmp_path_factory):
    base = tmp_path_factory.mktemp("rounds")
    train = write_round(
        base / "mlperf-training-v1.0.tar.gz",
        [("bert", run_log(target=0.72, work=40 + i % 4, rate=1.0 + i % 3 * 0.2)) for i in range(24)]
        + [("resnet", run_log(target=0.759, work=30 + i % 3)) for i in range(24)]
        + [("ssd", run_log(target=0.34, work=8 + i % 2, rate=0.1)) for i in range(12)],
    )
    test = write_round(
        base / "mlperf-training-v2.0.tar.gz",
        [("bert", run_log(target=0.72, work=41)) for _ in range(6)]
        + [("newbench", run_log(target=2.5, mode="min", work=50, metric="eval_loss")) for _ in range(5)]
        + [("bert", run_log(target=0.72, status="aborted"))],
    )  # not a success: not counted
    return train, test


EPOCHS_FOR_STRUCTURE = 4


def short_training(monkeypatch, epochs: int) -> list:
    """The harness's history network trained `epochs` epochs; what it trained on, recorded."""
    trained_on = []
    real = calibrate.train_with_calibration

    def train(runs, **kwargs):
        trained_on.extend(runs)
        return real(runs, epochs=epochs, **kwargs)

    monkeypatch.setattr(evaluate, "train_with_calibration", train)
    return trained_on


@pytest.fixture
def quick(monkeypatch):
    """A short training so the harness runs in seconds (the figures it scores still meaningful); records what it
    trained on."""
    return short_training(monkeypatch, 40)


@pytest.fixture
def quicker(monkeypatch):
    """A shorter one still, for the tests of what is split, held out and counted, not of how well it estimates
    (the history network's epochs were a third of such a test's CPU; the curve fits, the rest, are unchanged)."""
    return short_training(monkeypatch, EPOCHS_FOR_STRUCTURE)


NEW_TARGETS = {"newbench": {"metric": "eval_loss", "target": 2.5, "mode": "min"}}


# With the accelerators' bandwidths among the history's inputs, this 40-epoch toy network guesses the new benchmark
# 470x long; the blend drops a guess that far from the job's own curve (blend.implausible), else the 80% cut was 75%
# long.
def test_round_split_trains_on_train_only_and_scores_every_successful_test_run(rounds, quick):
    train, test = rounds
    report = evaluate.run_evaluation([train], test, split="round", targets=parse_targets(NEW_TARGETS))
    assert quick and all(r.version == "1.0" for r in quick)  # no test run in training
    assert report["headline_method"] == "eta_blend" and report["split"] == "round"
    assert report["unseen_benchmarks"] == ["newbench"]
    blend = report["methods"]["eta_blend"]
    for cut in ("10%", "20%", "30%", "50%", "80%"):
        assert blend[cut]["n_total"] == 11  # 6 bert + 5 newbench; the aborted run is no success
        assert blend[cut]["n"] == 11  # the declared target makes newbench scorable
        assert set(blend["by_benchmark"][cut]) == {"bert", "newbench"}
        assert blend["by_benchmark"][cut]["newbench"]["n"] == 5
        assert blend["by_group"][cut]["unseen"]["n_total"] == 5
        assert blend["by_group"][cut]["seen"]["n_total"] == 6
    # the new benchmark gets its estimate from its own curve and rate (a guessed prior work was 5x off here)
    late = blend["by_benchmark"]["80%"]["newbench"]
    assert late["median_ape"] < 0.5


def test_a_benchmark_without_any_target_is_counted_as_a_miss(rounds, quicker):
    train, test = rounds
    report = evaluate.run_evaluation([train], test, split="round")
    cut = report["methods"]["eta_blend"]["50%"]
    assert (cut["n"], cut["n_total"]) == (6, 11)
    assert cut["within_20pct"] <= 6 / 11
    assert report["methods"]["eta_blend"]["by_benchmark"]["50%"]["newbench"] == {
        "n": 0,
        "n_total": 5,
        "within_20pct": 0.0,
    }


def test_round_split_refuses_to_train_on_its_test_tarball(rounds, quick):
    train, test = rounds
    with pytest.raises(ValueError, match=r"param\[--train\]"):
        evaluate.run_evaluation([train, test], test, split="round")


def test_submitter_split_holds_the_test_submitters_out_of_training(rounds, quicker):
    train, test = rounds
    report = evaluate.run_evaluation(
        [train, test], test, split="submitter", kfold=3, targets=parse_targets(NEW_TARGETS)
    )
    held = {s for split in report["splits"] for s in split["held_out_submitters"]}
    assert held == {"org0", "org1", "org2"}
    assert report["methods"]["eta_blend"]["20%"]["n_total"] == 11


def test_benchmark_split_holds_whole_benchmarks_out_of_one_round(rounds, quicker):
    train, _ = rounds  # the development split: one round only, its benchmarks held out in turn
    report = evaluate.run_evaluation([train], train, split="benchmark", kfold=3)
    held = [split["held_out_benchmarks"] for split in report["splits"]]
    assert sorted(b for h in held for b in h) == ["bert", "resnet", "ssd"]
    assert all(split["unseen_benchmarks"] == h for split, h in zip(report["splits"], held))
    assert report["unseen_benchmarks"] == ["bert", "resnet", "ssd"]


def test_a_generation_never_trained_on_is_reported_apart_from_a_new_part_of_a_seen_one(rounds, quicker, tmp_path):
    train, _ = rounds  # every training run on H100s (Hopper)
    test = write_round(
        tmp_path / "mlperf-training-v9.0.tar.gz",
        [("bert", run_log(target=0.72, work=41)) for _ in range(6)],
        accelerators=("NVIDIA H200-SXM5-141GB", "TPU-v5p", "NVIDIA H100-SXM5-80GB"),
    )  # runs 0, 3 on H200 (a new part of a seen generation), 1, 4 on TPU v5p (a new generation), 2, 5 on H100
    groups = evaluate.run_evaluation([train], test, split="round")["methods"]["eta_blend"]["by_group"]["20%"]
    assert groups["new_accelerator"]["n_total"] == 4
    assert groups["new_generation"]["n_total"] == 2
    assert groups["seen_generation"]["n_total"] == 4


def test_cli_writes_the_json_report(rounds, quicker, tmp_path, capsys):
    train, test = rounds
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(NEW_TARGETS))
    out = tmp_path / "report.json"
    assert (
        evaluate.main(
            [
                "--split",
                "round",
                "--train",
                str(train),
                "--test",
                str(test),
                "--targets",
                str(targets),
                "--cache",
                str(tmp_path / "cache"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["methods"]["eta_blend"]["by_benchmark"]["20%"]["newbench"]["n"] == 5
    assert "eta_blend (headline)" in capsys.readouterr().out
    assert list((tmp_path / "cache").glob("*.pkl"))  # parsed once, read back next time


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"x": {"target": "high"}}', "targets.x.target"),
        ('{"x": {"target": 1, "mode": "up"}}', "targets.x.mode"),
        ('{"x": {"target": 1, "metric": "a b"}}', "targets.x.metric"),
        ('{"x": 3}', "targets.x"),
        ('{"../x": {"target": 1}}', "targets"),
        ("[1]", "targets"),
        ('{"x": {"target": NaN}}', "targets.x.target"),
        ("not json", "--targets"),
    ],
)
def test_a_bad_targets_file_is_refused_naming_the_field(rounds, tmp_path, capsys, body, field):
    train, test = rounds
    path = tmp_path / "targets.json"
    path.write_text(body)
    with pytest.raises(SystemExit):
        evaluate.main(["--split", "round", "--train", str(train), "--test", str(test), "--targets", str(path)])
    assert f"param[{field}] invalid" in capsys.readouterr().err
