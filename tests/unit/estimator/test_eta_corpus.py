import io
import json
import tarfile

import pytest
from eta_factories import mllog

from services.estimator.model.corpus import is_usable, load_corpus, parse_run


def bert_log(stop_status="success"):
    lines = [
        mllog("global_batch_size", 256, t_ms=0),
        mllog("opt_base_learning_rate", 0.001, t_ms=0),
        mllog("run_start", t_ms=1000),
        mllog("tracked_stats", {"throughput": 1.0}, t_ms=20_000, epoch_num=1000),
        mllog("eval_accuracy", 0.5, t_ms=41_000, epoch_num=2000),
        mllog("eval_accuracy", 0.73, t_ms=81_000, epoch_num=4000),
        mllog("run_stop", t_ms=81_000, status=stop_status),
        "some other noise line",
    ]
    return "\n".join(lines)


def test_parse_run_builds_timeline_and_hyper_parameters():
    run = parse_run(bert_log(), run_id="r", version="4.0", org="acme", system="s", benchmark="bert")
    assert (run.batch_size, run.learning_rate, run.duration_s) == (256, 0.001, 80.0)
    assert [(o.t_s, o.progress, o.value) for o in run.observations] == [
        (19.0, 1000.0, None),
        (40.0, 2000.0, 0.5),
        (80.0, 4000.0, 0.73),
    ]
    assert run.total_work == 4000.0 and run.reached_target() and is_usable(run)


def test_aborted_runs_are_not_usable():
    run = parse_run(bert_log("aborted"), run_id="r", version="4.0", org="a", system="s", benchmark="bert")
    assert not is_usable(run)


def test_unet3d_epochs_become_samples_and_ssd_epoch_stop_is_shifted():
    unet = parse_run(
        "\n".join(
            [
                mllog("run_start", t_ms=0),
                mllog("eval_accuracy", 0.91, t_ms=60_000, epoch_num=1000),
                mllog("run_stop", t_ms=60_000, status="success"),
            ]
        ),
        run_id="u",
        version="3.1",
        org="a",
        system="s",
        benchmark="unet3d",
    )
    assert unet.total_work == 168_000.0
    ssd = parse_run(
        "\n".join(
            [
                mllog("run_start", t_ms=0),
                mllog("epoch_stop", 0, t_ms=30_000, epoch_num=0),
                mllog("eval_accuracy", 0.35, t_ms=60_000, epoch_num=1),
                mllog("run_stop", t_ms=60_000, status="success"),
            ]
        ),
        run_id="s",
        version="3.1",
        org="a",
        system="s",
        benchmark="ssd",
    )
    assert [o.progress for o in ssd.observations] == [1.0, 1.0]


def test_multi_metric_benchmarks_take_the_worst_normalised_metric():
    run = parse_run(
        "\n".join(
            [
                mllog("run_start", t_ms=0),
                mllog("eval_accuracy", {"BBOX": 0.38, "SEGM": 0.30}, t_ms=50_000, epoch_num=10),
                mllog("run_stop", t_ms=60_000, status="success"),
            ]
        ),
        run_id="m",
        version="3.1",
        org="a",
        system="s",
        benchmark="maskrcnn",
    )
    assert run.evals[0].value == pytest.approx(0.30 / 0.339)
    assert not run.reached_target()


def test_load_corpus_joins_system_description(tmp_path):
    path = tmp_path / "mlperf-training-v9.9.tar.gz"
    system = {"accelerator_model_name": "NVIDIA H100-SXM5-80GB", "number_of_nodes": "2", "accelerators_per_node": "8"}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in [
            ("acme/systems/box.json", json.dumps(system)),
            ("acme/results/box/bert/result_0.txt", bert_log()),
            ("acme/results/box/bert/result_1.txt", bert_log("aborted")),
        ]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    runs = load_corpus(path)
    assert len(runs) == 1
    run = runs[0]
    assert (run.version, run.submitter, run.accelerators, run.nodes) == ("9.9", "acme", 16, 2)
    assert run.accelerator == "NVIDIA H100-SXM5-80GB"
