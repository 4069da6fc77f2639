import json

from services.estimator.jobmodel import JobModel
from shared.events import LogLine


def mllog(key, t, value=None, **metadata):
    record = {"namespace": "", "time_ms": int(t * 1000), "event_type": "POINT_IN_TIME", "key": key,
              "value": value, "metadata": metadata}
    return LogLine(t=t, line=":::MLLOG " + json.dumps(record))


def test_live_mllog_progress_is_read_like_the_corpus_and_timed_from_run_start():
    model = JobModel(metrics=[])
    model.started(at=100.0, accelerator="NVIDIA H100-SXM5-80GB", gpus=8, nodes=2)
    for line in (mllog("submission_benchmark", 101.0, "gnn"), mllog("run_start", 130.0),
                 mllog("epoch_start", 131.0, epoch_num=1),  # announces work about to start: not progress
                 mllog("eval_accuracy", 141.0, 0.60, epoch_num=0.05),
                 mllog("eval_accuracy", 151.0, 0.65, epoch_num=0.1)):
        model.observe(line)
    assert [(t, p) for t, p, _ in model.seen] == [(141.0, 0.05), (151.0, 0.1)]
    model.estimate(152.0, predictor=None, version=None)  # builds the online estimator: gnn's target is known
    assert model.online.start_time == 130.0  # initialisation is not part of the timed run
    assert model.job_features().accelerators == 16  # 8 per node on 2 nodes: the model counts them all


def test_unet3d_epochs_become_samples_live_as_in_the_corpus():
    model = JobModel(metrics=[])
    model.observe(mllog("submission_benchmark", 1.0, "unet3d"))
    model.observe(mllog("eval_accuracy", 50.0, 0.5, epoch_num=1000))
    assert model.seen[-1][1:] == (168_000.0, 0.5)
