import json

from services.estimator.train import learnable, runs_from_json


def job(benchmark, **extra):
    return {
        "run_id": benchmark,
        "version": "trainmaster",
        "submitter": "p",
        "system": "x",
        "benchmark": benchmark,
        "accelerator": "x",
        "accelerators_per_node": 1,
        "nodes": 1,
        "batch_size": 8.0,
        "learning_rate": 0.1,
        "run_start_ms": 0,
        "run_stop_ms": 60_000,
        "status": "success",
        "future_key": 1,
        "observations": [{"t_s": 30.0, "progress": 50.0, "value": 0.5}, {"t_s": 60.0, "progress": 100.0, "value": 0.9}],
        **extra,
    }


def test_completed_jobs_of_new_benchmarks_are_learnt_only_with_their_declared_target(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(
        json.dumps(
            [
                job("brand_new"),
                job("brand_new_too", target_value=0.8, target_mode="max"),
                job("never_met", target_value=0.95, target_mode="max"),
                job("bert"),
            ]
        )
    )
    runs = runs_from_json(path)
    assert [r.benchmark for r in learnable(runs)] == ["brand_new_too", "bert"]  # bert: the built-in 0.72
    assert learnable(runs)[0].total_work == 100.0
