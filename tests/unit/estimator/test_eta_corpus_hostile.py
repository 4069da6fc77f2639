"""A hostile or odd MLPerf tarball cannot stop the corpus build: a system description with infinite, NaN, huge or
absurd counts, or nested past the parser's depth, and a log whose batch size is infinite, keep their defaults."""

import io
import tarfile

import pytest
from eta_factories import mllog

from services.estimator.model.corpus import load_corpus, parse_run


def log(batch_size: object = 256) -> str:
    return "\n".join(
        [
            mllog("global_batch_size", batch_size, t_ms=0),
            mllog("opt_base_learning_rate", "1e999", t_ms=0),
            mllog("run_start", t_ms=1000),
            mllog("eval_accuracy", 0.5, t_ms=41_000, epoch_num=2000),
            mllog("eval_accuracy", 0.73, t_ms=81_000, epoch_num=4000),
            mllog("run_stop", t_ms=81_000, status="success"),
        ]
    )


def tarball(tmp_path, system_json: str):
    path = tmp_path / "mlperf-training-v9.9.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in [("acme/systems/box.json", system_json), ("acme/results/box/bert/result_0.txt", log())]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "system_json, per_node, nodes",
    [
        ('{"accelerators_per_node": 1e999, "number_of_nodes": 2}', 0, 2),  # json reads 1e999 as infinity
        ('{"accelerators_per_node": 8, "number_of_nodes": Infinity}', 8, 1),
        ('{"accelerators_per_node": "inf", "number_of_nodes": "-Infinity"}', 0, 1),
        ('{"accelerators_per_node": NaN, "number_of_nodes": "nan"}', 0, 1),
        (f'{{"accelerators_per_node": 8, "number_of_nodes": {10**400}}}', 8, 1),  # past float's range
        ('{"accelerators_per_node": "1e300", "number_of_nodes": -4}', 0, 1),  # no system has these
        ('{"accelerators_per_node": 8, "number_of_nodes": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", 0, 1),
    ],
)
def test_a_system_description_with_odd_numbers_keeps_the_defaults(tmp_path, system_json, per_node, nodes):
    [run] = load_corpus(tarball(tmp_path, system_json))
    assert (run.accelerators_per_node, run.nodes) == (per_node, nodes)


@pytest.mark.parametrize("batch_size", ["Infinity", "1e999", "nan"])
def test_an_odd_batch_size_or_learning_rate_is_skipped(batch_size):
    run = parse_run(log(batch_size), run_id="r", version="4.0", org="acme", system="s", benchmark="bert")
    assert (run.batch_size, run.learning_rate) == (0.0, 0.0)
