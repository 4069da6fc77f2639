import json

from shared.events import LogLine
from services.estimator.jobmodel import JobModel


def mllog(key, t, value=None, **metadata):
    record = {
        "namespace": "",
        "time_ms": int(t * 1000),
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return LogLine(t=t, line=":::MLLOG " + json.dumps(record))


def test_live_mllog_progress_is_read_like_the_corpus_and_timed_from_run_start():
    model = JobModel(metrics=[])
    model.started(at=100.0, accelerator="NVIDIA H100-SXM5-80GB", gpus=8, nodes=2)
    for line in (
        mllog("submission_benchmark", 101.0, "gnn"),
        mllog("run_start", 130.0),
        mllog("epoch_start", 131.0, epoch_num=1),  # announces work about to start: not progress
        mllog("eval_accuracy", 141.0, 0.60, epoch_num=0.05),
        mllog("eval_accuracy", 151.0, 0.65, epoch_num=0.1),
    ):
        model.observe(line)
    assert [(t, p) for t, p, _ in model.seen] == [(141.0, 0.05), (151.0, 0.1)]
    model.estimate(152.0, predictor=None, version=None)  # builds the online estimator: gnn's target is known
    assert model.online.start_time == 130.0  # initialisation is not part of the timed run
    assert model.job_features().accelerators == 16  # 8 per node on 2 nodes: the model counts them all


def test_a_completed_job_becomes_a_corpus_run_of_its_progress_and_target_metric_only(tmp_path):
    from services.estimator.train import learnable, runs_from_json

    model = JobModel(metrics=[])
    model.started(at=100.0, accelerator="NVIDIA H100-SXM5-80GB", gpus=8, nodes=2)
    for line in (
        mllog("submission_benchmark", 101.0, "gnn"),
        mllog("seed", 102.0, 7),
        mllog("train_samples", 103.0, 3901),
        mllog("run_start", 130.0),  # numbers, neither metric nor work
        mllog("eval_accuracy", 141.0, 0.60, epoch_num=0.05),
        mllog("eval_accuracy", 151.0, 0.75, epoch_num=0.1),
    ):  # gnn's target, 0.72, met here
        model.observe(line)
    run = model.history_run(job_id="j1", project="p", start=100.0, end=152.0)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run]))
    [learnt] = learnable(runs_from_json(path))
    assert learnt.accelerators == 16  # 8 per node on 2 nodes, not 16 per node
    assert learnt.duration_s == 22.0  # from run_start, as the corpus times a run
    assert [(o.progress, o.value) for o in learnt.observations] == [(0.05, 0.60), (0.1, 0.75)]
    assert learnt.total_work == 0.1
    assert JobModel(metrics=[]).history_run(job_id="j2", project="p", start=0.0, end=1.0) is None  # no features


def test_unet3d_epochs_become_samples_live_as_in_the_corpus():
    model = JobModel(metrics=[])
    model.observe(mllog("submission_benchmark", 1.0, "unet3d"))
    model.observe(mllog("eval_accuracy", 50.0, 0.5, epoch_num=1000))
    assert model.seen[-1][1:] == (168_000.0, 0.5)


# -- any job gets an estimate -------------------------------------------------------------
import math  # noqa: E402

import pytest  # noqa: E402
from test_eta_history import tiny_corpus  # noqa: E402

from shared.jobs import MetricSpec, Parameter  # noqa: E402
from services.estimator.model.history import UNSEEN, HistoryPredictor  # noqa: E402


@pytest.fixture(scope="module")
def predictor():
    return HistoryPredictor(epochs=100).train(tiny_corpus(), folds=2)


def accuracy_log(model, *, benchmark, until, rate=100.0, target=0.8, work=3000.0):
    """An MLLOG job reaching `target` at `work` samples, `rate` samples a second, fed up to `until` s."""
    model.observe(mllog("submission_benchmark", 0.5, benchmark))
    model.observe(mllog("run_start", 1.0))
    t = 1.0
    while t < until:
        t += 2.0
        samples = rate * (t - 1.0)
        value = target + 0.1 - 0.6 * math.exp(-3 * samples / work)
        model.observe(mllog("eval_accuracy", t, value, samples_count=samples))


def test_an_unseen_benchmark_with_a_declared_target_gets_an_estimate_from_its_own_curve(predictor):
    spec = MetricSpec(name="eval_accuracy", regex=r"eval_accuracy\D+(?P<value>[0-9.]+)", mode="max", target=0.8)
    model = JobModel(metrics=[spec])
    model.started(at=0.0, accelerator="NVIDIA H100-SXM5-80GB", gpus=8, nodes=1)
    accuracy_log(model, benchmark="never_seen_gat", until=11.0)  # evals every 2 s: 6 points by 13 s
    eta = model.estimate(13.5, predictor=predictor, version=1)
    assert model.online.key == UNSEEN and model.online.prior is not None and not model.online.prior.seen
    assert eta is not None and math.isfinite(eta.remaining_s)
    assert eta.low_s <= eta.remaining_s <= eta.high_s
    truth = 1.0 + math.log(0.6 / 0.1) / 3 * 3000.0 / 100.0 - 13.5  # the curve meets 0.8 at 1,792 samples
    assert eta.low_s <= truth <= eta.high_s


def test_a_declared_amount_of_work_gives_an_estimate_from_the_rate_alone():
    spec = MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.]+)", mode="min")
    model = JobModel(metrics=[spec], parameters=[Parameter(name="max_steps", value="1000")])
    model.started(at=0.0, accelerator="whatever", gpus=1, nodes=1)
    for step in range(10, 210, 10):  # 10 steps a second
        model.observe(LogLine(t=step / 10, line=f"step {step} loss {1 / step:.4f}"))
    eta = model.estimate(20.0, predictor=None, version=None)
    assert eta is not None and eta.remaining_s == pytest.approx(80.0, rel=0.05)


def test_an_amount_of_work_the_script_reports_gives_an_estimate_from_the_rate_alone():
    model = JobModel(metrics=[])  # no target, no parameters: only what the script reports
    model.started(at=0.0, accelerator="whatever", gpus=1, nodes=1)
    model.observe(LogLine(t=0.1, line='TRAINMASTER_METRICS {"step": 0, "total_steps": -3}'))  # not a sane amount
    assert model.estimate(0.1, predictor=None, version=None) is None
    for step in range(10, 210, 10):  # 10 steps a second, the total reported with the first step
        extra = ', "total_steps": 1000' if step == 10 else ""
        model.observe(LogLine(t=step / 10, line=f'TRAINMASTER_METRICS {{"step": {step}, "loss": {1 / step}{extra}}}'))
        if step == 50:
            assert model.estimate(5.0, predictor=None, version=None) is not None
    eta = model.estimate(20.0, predictor=None, version=None)
    assert eta is not None and eta.remaining_s == pytest.approx(80.0, rel=0.05)
    declared = JobModel(metrics=[], parameters=[Parameter(name="max_steps", value="500")])
    declared.observe(LogLine(t=1.0, line='TRAINMASTER_METRICS {"step": 1, "total_steps": 1000}'))
    assert declared.features["total_work"] == 500.0  # what the spec declares comes first
    counting = JobModel(metrics=[MetricSpec(name="epochs", regex=r"epochs (?P<value>\d+)", mode="max")])
    counting.observe(LogLine(t=1.0, line="epochs 1"))  # the job's own curve of epochs reached
    counting.observe(LogLine(t=2.0, line='TRAINMASTER_METRICS {"step": 1, "epochs": 2}'))
    assert "total_work" not in counting.features  # a metric of the spec is never read as the amount of work


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "1e400", "lots", "1e16"])
def test_hostile_declared_work_is_ignored(value):
    model = JobModel(
        metrics=[], parameters=[Parameter(name="max_steps", value=value), Parameter(name="batch_size", value=value)]
    )
    assert "total_work" not in model.features and "batch_size" not in model.features
    assert model.estimate(5.0, predictor=None, version=None) is None
