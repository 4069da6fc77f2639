"""`trainmaster search`: its commands parse and a search prints as a table of trials."""

from services.cli.__main__ import parser
from services.cli.searches import detail, summary_row

SEARCH = {
    "metadata": {"id": "s-1", "name": "sweep", "create_time": 0},
    "spec": {
        "pruner": "predicted",
        "max_trials": 3,
        "parallelism": 2,
        "space": {"lr": {}, "opt": {}},
        "objective": {"metric": "loss", "mode": "min"},
    },
    "status": {
        "phase": "Running",
        "best": {"trial": 0, "parameters": {"lr": 0.01, "opt": "sgd"}, "value": 0.25},
        "reason": "",
        "gpu_hours": 0.5,
        "message": "",
    },
    "trials": [
        {
            "trial": 0,
            "job_id": "s-1-t0",
            "state": "Completed",
            "value": 0.25,
            "step": 30.0,
            "parameters": {"lr": 0.01, "opt": "sgd"},
            "reason": "",
        },
        {
            "trial": 1,
            "job_id": "s-1-t1",
            "state": "Pruned",
            "value": 0.9,
            "step": 10.0,
            "parameters": {"lr": 0.2, "opt": "adam"},
            "reason": "predicted: cannot beat 0.25",
        },
    ],
}


def test_search_commands_parse():
    args = parser().parse_args(["search", "create", "-f", "s.yaml", "--pruner", "hyperband", "--max-trials", "4"])
    assert (args.file, args.pruner, args.max_trials) == ("s.yaml", "hyperband", 4)
    assert parser().parse_args(["search", "stop", "s-1"]).search_id == "s-1"
    assert parser().parse_args(["search", "get", "s-1", "--json"]).json is True


def test_a_search_prints_its_best_and_each_trial():
    text = detail(SEARCH)
    assert "best: trial 0 = 0.25 with lr=0.01, opt=sgd" in text
    assert "s-1-t1" in text and "Pruned" in text and "predicted: cannot beat" in text
    assert summary_row(SEARCH)[:6] == ["s-1", "sweep", "Running", "predicted", "2/3", "0.25"]
