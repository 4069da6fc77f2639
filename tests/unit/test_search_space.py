"""Trial parameters: drawn inside the space, the same for the same seed and trial, passed to the job as text."""

import math

from services.submitter.searches.models import Param
from services.submitter.searches.space import as_text, sample
from services.submitter.searches.trials import trial_body

SPACE = {
    "lr": Param(type="float", low=1e-4, high=0.1, log=True),
    "width": Param(type="int", low=16, high=256),
    "layers": Param(type="int", low=1, high=8, log=True),
    "opt": Param(type="categorical", choices=["sgd", "adam"]),
}


def test_draws_stay_in_the_space_and_cover_it():
    draws = [sample(SPACE, seed=3, trial=k) for k in range(400)]
    assert all(1e-4 <= d["lr"] <= 0.1 and 16 <= d["width"] <= 256 and 1 <= d["layers"] <= 8 for d in draws)
    assert {d["opt"] for d in draws} == {"sgd", "adam"} and {d["layers"] for d in draws} == set(range(1, 9))
    below = sum(d["lr"] < math.sqrt(1e-4 * 0.1) for d in draws)  # log-uniform: half below the geometric middle
    assert 150 < below < 250
    assert all(isinstance(d["width"], int) and isinstance(d["lr"], float) for d in draws)


def test_the_same_seed_and_trial_give_the_same_values_and_others_differ():
    assert sample(SPACE, seed=3, trial=5) == sample(SPACE, seed=3, trial=5)
    assert sample(SPACE, seed=3, trial=5) != sample(SPACE, seed=4, trial=5)
    assert sample(SPACE, seed=3, trial=5) != sample(SPACE, seed=3, trial=6)


def test_values_become_text_that_reads_back_the_same():
    value = sample(SPACE, seed=1, trial=0)["lr"]
    assert float(as_text(value)) == value
    assert (as_text(True), as_text(64), as_text("adam")) == ("true", "64", "adam")


def test_a_trial_is_the_template_with_its_values_appended_to_the_parameters():
    search = {
        "_id": "s-1",
        "name": "sweep",
        "spec": {
            "template": {
                "metadata": {"name": "x"},
                "algorithm": {"command": "train", "parameters": [{"name": "data", "value": "d"}]},
            }
        },
    }
    body = trial_body(search, trial=2, parameters={"lr": 0.01, "opt": "adam"}, name="sweep-2")
    assert [(p.name, p.value) for p in body.algorithm.parameters] == [("data", "d"), ("lr", "0.01"), ("opt", "adam")]
    assert body.metadata.name == "sweep-2" and "trial 2 of search s-1" in body.metadata.description
