"""The history model fits runs that showed their work; one that never did is left out, not fatal."""

from eta_factories import make_run

from services.estimator.model.history import HistoryPredictor


def test_a_run_without_its_work_is_left_out_of_the_fit():
    runs = [make_run(benchmark="bert", submitter=f"org{i}", run_id=f"v4.0/org{i}/s/bert/{i}") for i in range(6)]
    silent = make_run(benchmark="bert", submitter="org9", evals=0, run_id="v4.0/org9/s/bert/9")
    assert silent.total_work is None
    with_silent = HistoryPredictor(epochs=5, seed=0).train([*runs, silent], folds=1)
    without = HistoryPredictor(epochs=5, seed=0).train(runs, folds=1)
    assert with_silent.work_table == without.work_table and with_silent.offsets == without.offsets
